"""Which kernel runs a product: kernel classes that say whether they can run a problem (and why
not), and per GPU a table of what a sweep measured fastest.

A kernel family is a class with a ``name``, the ``layout`` it multiplies, its own ``Config``
dataclass, ``can_implement(problem, device, config) -> (ok, why)`` and ``launch``. The choice for
a product is data: ``kernels/tables/<GPU name>.json`` lists, per layout, shape class and M bucket,
candidates ``{"kernel": name, "config": {...}}`` in order of preference; the first that can run
on the device is taken. A GPU with no table of its own uses the ``fallback`` table (the H200's,
the GPU these kernels were tuned on): its Hopper-only kernels say they cannot run on
other GPUs, so the next candidate runs there, and on the CPU (Triton's interpreter) every Gluon
candidate steps aside the same way.

>>> from glyd.kernels.registry import Problem, shape_class, m_bucket   # no Triton imported
>>> shape_class(18944, 3584), shape_class(512, 3584), m_bucket(5)
('gate', 'kv', '5-8')
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from glyd import _env

log = logging.getLogger(__name__)

__all__ = ["Problem", "Device", "Kernel", "KERNELS", "kernel_class", "kernel_for", "choose", "candidates",
           "table_for", "layout_times", "shape_class", "m_bucket", "M_BUCKETS", "SHAPE_CLASSES"]

TABLES = Path(__file__).with_name("tables")
#: The table of a GPU that has none of its own (its kernels are skipped where they cannot run).
FALLBACK = "NVIDIA H200"

#: Kernel families: name -> "module:class" (imported when first asked for: most import Triton).
KERNELS: dict[str, str] = {
    "gemv": "glyd.kernels.fixed12_gemv:GemvKernel",
    "tc": "glyd.kernels.fixed12_tc:TcKernel",
    "mma": "glyd.kernels.fixed12_mma:MmaKernel",
    "tile": "glyd.kernels.fixed12_tile:TileKernel",
    "gluon": "glyd.kernels.fixed12_gluon:GluonKernel",
    "wg": "glyd.kernels.fixed12_wg:WgKernel",
    "ws": "glyd.kernels.fixed12_ws:WsKernel",
    "long": "glyd.kernels.fixed12_long:LongKernel",
    "tiered_gemv": "glyd.kernels.tiered:TieredGemvKernel",
    "tiered_long": "glyd.kernels.tiered:TieredLongKernel",
    "dense11_gemv": "glyd.kernels.dense11:Dense11GemvKernel",
    "dense11_long": "glyd.kernels.dense11:Dense11LongKernel",
    # products of packed experts (glyd.kernels.experts chooses among them)
    "experts_gemv": "glyd.kernels.fixed12_experts:ExpertsGemvKernel",
    "experts_loop": "glyd.kernels.experts:ExpertsLoopKernel",
}

#: M buckets of the tables: (name, first M, last M) (None: no end).
M_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("1", 1, 1), ("2", 2, 2), ("3", 3, 3), ("4", 4, 4), ("5-8", 5, 8), ("9-16", 9, 16), ("17-32", 17, 32),
    ("33-64", 33, 64), ("65-255", 65, 255), ("256+", 256, None),
)

#: Shape classes of an N x K matrix (``shape_class``), with one example each from a 7B model where
#: it has one. Weights: kv <= 2^22 < qo, qkv <= 2^24 < gate < 2^27 <= big; tall: K >= 8192 and
#: K > N (down projections); wide: N >= 65536 (lm_heads); qkv: K < N <= 2K (a merged q|k|v).
SHAPE_CLASSES: dict[str, str] = {
    "kv": "k, v (512 x 3584)", "qo": "q, o (3584 x 3584)", "qkv": "merged q|k|v (4608 x 3584)",
    "gate": "gate, up (18944 x 3584)", "big": "merged gate|up (37888 x 3584)", "tall": "down (3584 x 18944)",
    "wide": "lm_head below 2^27 weights", "wide_big": "lm_head (152064 x 3584)", "tall_small": "a short down",
    "tall_tiny": "a tiny down", "wide_small": "a wide matrix with K <= 256", "wide_tiny": "a wide one, K <= 64",
    "tall_wide": "N >= 65536 and K > N",
}


def shape_class(n: int, k: int) -> str:
    """The class of an N x K matrix in the tables (``SHAPE_CLASSES``)."""
    w = n * k
    tall = k >= 8192 and k > n
    wide = n >= 65536
    if w <= 1 << 22:
        return "tall_tiny" if tall else "wide_tiny" if wide else "kv"
    if w <= 1 << 24:
        if tall:
            return "tall_small"
        if wide:
            return "wide_small"
        return "qkv" if k < n <= 2 * k else "qo"
    if tall:
        return "tall_wide" if wide else "tall"
    if wide:
        return "wide_big" if w >= 1 << 27 else "wide"
    return "big" if w >= 1 << 27 else "gate"


def m_bucket(m: int) -> str:
    """The name of the M bucket (``M_BUCKETS``) that ``m`` >= 1 falls in."""
    for name, lo, hi in M_BUCKETS:
        if m >= lo and (hi is None or m <= hi):
            return name
    raise ValueError(f"M must be >= 1, got {m}")


@dataclass(frozen=True)
class Problem:
    """One product: x [M, K] @ W^T for a packed W [N, K] of ``layout`` (``kp``: its padded K)."""

    layout: str
    m: int
    n: int
    k: int
    kp: int


@dataclass(frozen=True)
class Device:
    """What a kernel needs to know of where it runs. ``features``: ``gluon`` (Triton's Gluon runs
    here: a CUDA GPU, not the interpreter), ``wgmma`` (Gluon's Hopper MMA, sm_90), ``tma`` (Gluon's
    Hopper TMA and mbarriers)."""

    type: str
    name: str
    capability: tuple[int, int] | None = None
    sms: int = 8
    interpreting: bool = False
    features: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(cls, device: torch.device) -> Device:
        """The description of ``device`` (cached per device)."""
        return _describe(device.type, device.index if device.type != "cuda" else _index(device))


def _index(device: torch.device) -> int:
    return torch.cuda.current_device() if device.index is None else device.index


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except ImportError as exc:
        log.info("%s does not import (%s)", module, exc)
        return False


@functools.lru_cache(maxsize=None)
def _describe(kind: str, index: int | None) -> Device:
    interp = _env.interpreting()
    if kind != "cuda":
        return Device(kind, kind, interpreting=interp)
    props = torch.cuda.get_device_properties(index)
    cap = (props.major, props.minor)
    feats = set()
    if not interp and _importable("triton.experimental.gluon.language.nvidia.ampere"):
        feats.add("gluon")
        if cap[0] == 9 and _importable("triton.experimental.gluon.language.nvidia.hopper"):
            feats.add("wgmma")
            if _importable("triton.experimental.gluon.nvidia.hopper"):
                feats.add("tma")
    return Device("cuda", props.name, cap, props.multi_processor_count, interp, frozenset(feats))


class Kernel:
    """A kernel family (subclasses live in the family's file, beside its kernels)."""

    name: ClassVar[str]
    layout: ClassVar[str]
    Config: ClassVar[type]

    @classmethod
    def can_implement(cls, problem: Problem, device: Device, config: Any) -> tuple[bool, str]:
        """(True, "") if this kernel can run ``problem`` on ``device`` with ``config``, else (False, why)."""
        if problem.layout != cls.layout:
            return False, f"{cls.name} multiplies {cls.layout} matrices, not {problem.layout}"
        return True, ""

    @classmethod
    def launch(cls, x2: torch.Tensor, packed: Any, bias: torch.Tensor | None, config: Any,
               out: torch.Tensor) -> torch.Tensor:
        """Write ``x2 @ W^T (+ bias)`` into ``out`` (bf16 [M, N]) and return it."""
        raise NotImplementedError

    @classmethod
    def make_config(cls, spec: dict[str, Any], problem: Problem) -> Any:
        """The family's Config from a table entry (values named in ``resolve`` are filled in)."""
        return cls.Config(**{k: cls.resolve(k, v, problem) for k, v in spec.items()})

    @classmethod
    def resolve(cls, key: str, value: Any, problem: Problem) -> Any:
        return value


class _Unavailable(Kernel):
    """Stands in for a family whose module does not import here."""

    why = ""

    @classmethod
    def can_implement(cls, problem, device, config):
        return False, cls.why


@functools.lru_cache(maxsize=None)
def kernel_class(name: str) -> type[Kernel]:
    """The kernel class registered as ``name`` (a stand-in that can run nothing if it does not import)."""
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r}; known: {', '.join(KERNELS)}")
    module, cls = KERNELS[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        return type(f"Unavailable_{name}", (_Unavailable,), {"name": name, "layout": "", "why": f"{module}: {exc}"})


def kernel_for(config: Any) -> type[Kernel]:
    """The kernel class whose ``Config`` ``config`` is."""
    for name in KERNELS:
        kc = kernel_class(name)
        if getattr(kc, "Config", None) is type(config):
            return kc
    raise TypeError(f"{type(config).__name__} is not the config of any kernel ({', '.join(KERNELS)})")


@functools.lru_cache(maxsize=None)
def _load_table(gpu: str) -> dict[str, Any]:
    path = table_file(gpu)
    table = json.loads(path.read_text(encoding="utf-8"))
    for layout, classes in table["linear"].items():
        for cls, buckets in classes.items():
            if cls not in SHAPE_CLASSES:
                raise ValueError(f"{path}: linear.{layout}: unknown shape class {cls!r}")
            for bucket, cands in buckets.items():
                if bucket not in {b for b, _, _ in M_BUCKETS}:
                    raise ValueError(f"{path}: linear.{layout}.{cls}: unknown M bucket {bucket!r}")
                for c in cands:
                    if c.get("kernel") not in KERNELS or not isinstance(c.get("config"), dict):
                        raise ValueError(f"{path}: linear.{layout}.{cls}.{bucket}: bad candidate {c!r}")
    return table


def table_file(gpu: str) -> Path:
    """``kernels/tables/<gpu>.json``, the name's characters other than letters and digits as ``_``."""
    return TABLES / ("".join(c if c.isalnum() else "_" for c in gpu) + ".json")


def table_for(device: Device) -> dict[str, Any]:
    """The table of ``device``'s GPU, or the fallback table."""
    return _load_table(device.name if table_file(device.name).is_file() else FALLBACK)


def layout_times(gpu: str) -> dict[str, Any] | None:
    """The kernel times per shape measured on ``gpu`` (its own table only), for layout="auto"."""
    return _load_table(gpu).get("layout") if table_file(gpu).is_file() else None


def candidates(problem: Problem, device: Device) -> list[dict[str, Any]]:
    """The table's candidates for ``problem``, in order of preference; a GPU's own table is followed by
    the fallback table's candidates, so a table that covers some cells only still runs every problem."""
    tables = [table_for(device)]
    if tables[0] is not _load_table(FALLBACK):
        tables.append(_load_table(FALLBACK))
    out: list[dict[str, Any]] = []
    for table in tables:
        by_bucket = table["linear"].get(problem.layout, {}).get(shape_class(problem.n, problem.k), {})
        out += [c for c in by_bucket.get(m_bucket(problem.m), ()) if c not in out]
    return out


def choose(problem: Problem, device: Device) -> tuple[type[Kernel], Any]:
    """(kernel class, config) of the first candidate that can run ``problem`` on ``device``.

    Cached per problem and device: the choice is data (the tables are read once a process), and
    making it took 75-120 us of Python a call on the development machine, which an eager prefill
    of a small model (one product a linear) paid hundreds of times."""
    return _choose(problem, device)


@functools.lru_cache(maxsize=8192)
def _choose(problem: Problem, device: Device) -> tuple[type[Kernel], Any]:
    why = []
    for cand in candidates(problem, device):
        kc = kernel_class(cand["kernel"])
        try:
            cfg = kc.make_config(dict(cand["config"]), problem)
        except (TypeError, ValueError) as exc:
            why.append(f"{cand['kernel']}: bad config ({exc})")
            continue
        ok, reason = kc.can_implement(problem, device, cfg)
        if ok:
            return kc, cfg
        why.append(f"{cand['kernel']}: {reason}")
    raise RuntimeError(f"no kernel can run {problem} on {device.name}: " + ("; ".join(why) or "no candidates"))


def config_dict(config: Any) -> dict[str, Any]:
    """A config as a table entry holds it (every field)."""
    return dataclasses.asdict(config)
