"""Which kernel runs a KV op, chosen as weight kernels are (``glyd.kernels.registry``).

A KV kernel family is a class beside its kernels with a ``name``, the page ``code`` and ``op`` it
serves (``"attention"``: decode attention; ``"write"``: the static pool's page writer), a frozen
``Config`` dataclass, ``can_implement(problem, device, config) -> (ok, why)`` and ``launch``. The
choice is data: the ``"kv"`` section of the GPU's table (``glyd/kernels/tables/<GPU>.json``, the
fallback table where a GPU has none) lists, per code and op, candidates ``{"kernel": name,
"config": {...}}`` in order of preference; the first that can run is taken. The pure-torch twins are
families too (``*_torch``: they run everywhere), so the CPU and Triton's interpreter take a twin unless
a kernel is asked for by name (``decode_attention(backend=...)``).

>>> from glyd.kv.registry import KVProblem, choose     # no Triton imported
>>> from glyd.kernels.registry import Device
>>> choose(KVProblem("kvf12", "attention", 64, 128, 128, 7, "pool"), Device("cpu", "cpu"))[0].name
'kvf12_attention_torch'
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from glyd.kernels import registry as weights

log = logging.getLogger(__name__)

__all__ = ["KVProblem", "KVKernel", "KV_KERNELS", "kernel_class", "candidates", "choose", "CODES", "OPS"]

CODES = ("kvf12", "kvtiered")
OPS = ("attention", "write")

#: KV kernel families: name -> "module:class" (imported when first asked for: most import Triton).
KV_KERNELS: dict[str, str] = {
    "kvf12_attention_triton": "glyd.kv._triton_fixed:Kvf12AttentionKernel",
    "kvf12_attention_torch": "glyd.kv.pool_ops:Kvf12AttentionTorch",
    "kvf12_write_triton": "glyd.kv._triton_pool:Kvf12WriteKernel",
    "kvf12_write_torch": "glyd.kv.pool_ops:Kvf12WriteTorch",
    "kvtiered_attention_gluon": "glyd.kv._gluon:TieredGluonKernel",
    "kvtiered_attention_triton": "glyd.kv._triton:TieredTritonKernel",
    "kvtiered_attention_torch": "glyd.kv.attention:TieredAttentionTorch",
}

#: What runs where a table lists nothing for a code and op: the kernels, then the twin.
DEFAULTS: dict[str, dict[str, list[dict[str, Any]]]] = {
    "kvf12": {"attention": [{"kernel": "kvf12_attention_triton", "config": {}},
                            {"kernel": "kvf12_attention_torch", "config": {}}],
              "write": [{"kernel": "kvf12_write_triton", "config": {}}, {"kernel": "kvf12_write_torch", "config": {}}]},
    "kvtiered": {"attention": [{"kernel": "kvtiered_attention_gluon", "config": {}},
                            {"kernel": "kvtiered_attention_triton", "config": {}},
                            {"kernel": "kvtiered_attention_torch", "config": {}}]},
}


@dataclass(frozen=True)
class KVProblem:
    """One KV op: the page ``code``, the ``op``, page tokens, key and value head dims, query heads a KV
    head (``group``; 1 for a write), where the pages live (``"pool"``: a static pool read through
    its block table; ``"store"``: a growing ``PageStore``/``FixedPageStore``) and the sequences a launch
    (``batch``; 0: not known, and a table's candidates for some batches only are passed over)."""

    code: str
    op: str
    page: int
    head_dim: int
    v_head_dim: int
    group: int
    where: str = "pool"
    batch: int = 0

    def __post_init__(self) -> None:
        if self.code not in CODES or self.op not in OPS or self.where not in ("pool", "store"):
            raise ValueError(f"unknown KV problem {self.code!r}/{self.op!r}/{self.where!r}")
        if type(self.batch) is not int or self.batch < 0:
            raise ValueError(f"KVProblem.batch must be an int >= 0 (0: not known), got {self.batch!r}")


class KVKernel:
    """A KV kernel family (subclasses live beside their kernels)."""

    name: ClassVar[str]
    code: ClassVar[str]
    op: ClassVar[str]
    Config: ClassVar[type]

    @classmethod
    def can_implement(cls, problem: KVProblem, device: weights.Device, config: Any) -> tuple[bool, str]:
        """(True, "") if this kernel can run ``problem`` on ``device`` with ``config``, else (False, why)."""
        if (problem.code, problem.op) != (cls.code, cls.op):
            return False, f"{cls.name} runs {cls.code} {cls.op}, not {problem.code} {problem.op}"
        return True, ""

    @classmethod
    def launch(cls, *args: Any, config: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class _Unavailable(KVKernel):
    why = ""

    @classmethod
    def can_implement(cls, problem, device, config):
        return False, cls.why


@functools.lru_cache(maxsize=None)
def kernel_class(name: str) -> type[KVKernel]:
    """The KV kernel class registered as ``name`` (a stand-in that runs nothing if it does not import)."""
    if name not in KV_KERNELS:
        raise ValueError(f"unknown KV kernel {name!r}; known: {', '.join(KV_KERNELS)}")
    module, cls = KV_KERNELS[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        log.info("KV kernel %s does not import (%s)", name, exc)
        return type(f"Unavailable_{name}", (_Unavailable,), {"name": name, "code": "", "op": "",
                                                             "why": f"{module}: {exc}"})


def _table_candidates(table: dict[str, Any], problem: KVProblem) -> list[dict[str, Any]]:
    """The cell's candidates that serve ``problem``: those with ``"batches": [lo, hi]`` (sequences a launch,
    inclusive) only where ``problem.batch`` is inside it."""
    cands = table.get("kv", {}).get(problem.code, {}).get(problem.op, [])
    out = []
    for c in cands:
        if not isinstance(c, dict) or c.get("kernel") not in KV_KERNELS or not isinstance(c.get("config"), dict) \
                or not set(c) <= {"kernel", "config", "batches"}:
            raise ValueError(f"kv.{problem.code}.{problem.op}: bad candidate {c!r}")
        span = c.get("batches")
        if span is None:
            out.append(c)
            continue
        if not (isinstance(span, list) and len(span) == 2 and all(type(v) is int for v in span)
                and 1 <= span[0] <= span[1]):
            raise ValueError(f"kv.{problem.code}.{problem.op}: 'batches' must be [lo, hi] with 1 <= lo <= hi, got "
                             f"{span!r}")
        if span[0] <= problem.batch <= span[1]:
            out.append(c)
    return out


def candidates(problem: KVProblem, device: weights.Device) -> list[dict[str, Any]]:
    """Candidates for ``problem`` in order: on a GPU the device's table, the fallback table, then
    ``DEFAULTS`` (kernels not listed yet); elsewhere the twin only (kernels run there when named)."""
    defaults = DEFAULTS[problem.code].get(problem.op, [])
    if device.type != "cuda":
        return [c for c in defaults if c["kernel"].endswith("_torch")]
    out: list[dict[str, Any]] = []
    tables = [weights.table_for(device)]
    fallback = weights.table_for(weights.Device("cuda", weights.FALLBACK))
    if tables[0] is not fallback:
        tables.append(fallback)
    for table in tables:
        out += [c for c in _table_candidates(table, problem) if c not in out]
    named = {c["kernel"] for c in out}
    return out + [c for c in defaults if c["kernel"] not in named]


@functools.lru_cache(maxsize=256)
def choose(problem: KVProblem, device: weights.Device) -> tuple[type[KVKernel], Any]:
    """(kernel class, config) of the first candidate that can run ``problem`` on ``device`` (cached)."""
    why = []
    for cand in candidates(problem, device):
        kc = kernel_class(cand["kernel"])
        try:
            cfg = kc.Config(**cand["config"])
        except (TypeError, ValueError) as exc:  # a table's mistake: said, not silently passed over
            why.append(f"{cand['kernel']}: bad config ({exc})")
            log.warning("table cell kv.%s.%s: skipped %s %s: bad config (%s)", problem.code, problem.op,
                        cand["kernel"], cand["config"], exc)
            continue
        ok, reason = kc.can_implement(problem, device, cfg)
        if ok:
            return kc, cfg
        why.append(f"{cand['kernel']}: {reason}")
    raise RuntimeError(f"no KV kernel can run {problem} on {device.name}: " + "; ".join(why))


weights.on_reset(choose.cache_clear)


def by_name(name: str, problem: KVProblem, device: weights.Device, **config: Any) -> tuple[type[KVKernel], Any]:
    """Kernel ``name`` with ``config`` (its defaults otherwise), refused with the kernel's reason if it cannot run."""
    kc = kernel_class(name)
    cfg = kc.Config(**config)
    ok, why = kc.can_implement(problem, device, cfg)
    if not ok:
        raise RuntimeError(f"KV kernel {name} cannot run {problem} on {device.name}: {why}")
    return kc, cfg
