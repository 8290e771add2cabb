"""Products of packed experts on the GPU: the CUDA implementation of ``glyd::experts_linear`` (row
``s`` of x times expert ``ids[s]``'s matrix transposed; ``glyd.codec.experts`` for the arrays).

The kernel is chosen as a linear's is (``registry``): the GPU table's ``experts`` section when it
has one (layout -> M bucket -> candidates), else :data:`DEFAULTS`; the first candidate that can run
is taken, and inside a CUDA graph capture only the kernels that never synchronise with the host.

* ``fixed12_experts_gemv`` (``fixed12/experts.py``, a family of fixed12's layout entry): one
  program a row and a tile of its expert, reading only the chosen experts' packed planes; no host
  sync (decode steps, CUDA graphs). First up to 255 rows (``fixed12_experts_mma``, the grouped
  tensor-core product in ``fixed12/experts_mma.py``, first at 256-2048).
* ``experts_loop`` (here; no layout's family: it runs every layout through the linear families):
  each chosen expert's rows through ``glyd.kernels.linear``, the fused product the registry picks
  for that expert's matrix and its number of rows (the prompt path, every layout). Finding the rows
  of each expert costs one host sync.
* ``experts_unpack_grouped`` (here; fixed12, whose experts unpack in one launch): the rows sorted by
  expert (``experts_route.py``, one launch), the experts that have rows unpacked into one reused
  bf16 scratch ``[E, N, K]`` (``fixed12/experts_unpack.py``), then one ``torch._grouped_mm`` and the
  rows put back (the prompt path: five launches, no host sync, where the loop made ~2 launches a
  chosen expert).
  First above 2048 rows, and where the MMA cannot run.

Rows already sorted by expert (``linear(..., offs=)``: an MoE block sorts its rows once for its two
products, ``glyd.ops.experts.route``): ``experts_unpack_grouped`` skips its sort, gather and scatter
and returns the product in the sorted order; the other families take the sorted rows as any rows.

Host work (an eager prompt is host-bound): a sorted product the table gives the unpack + grouped
GEMM keeps a plan with the packed experts' linear plans (``glyd.kernels._plan.keep``): a later call
with arguments of the same key (``run_sorted``, which the op tries before checking the packed arrays)
launches the kept unpack (a recorded fast launch from its third call) and ``torch._grouped_mm``, with
no check, choice or preparation again. The preparation for a capture is kept there too: once a
packed experts tensor and capture kernel, not every product.

Example (needs a CUDA GPU)::

    from glyd.ops.experts import pack_experts
    p = pack_experts((torch.randn(8, 1024, 512, device="cuda") * 0.02).to(torch.bfloat16))
    y = glyd.kernels.experts.linear(x, ids, p)    # x bf16 [S, 512], ids [S] -> [S, 1024]
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import torch

from glyd.codec.experts import array_names
from glyd.kernels import _common as C
from glyd.kernels import _plan
from glyd.kernels import experts_route as _route
from glyd.kernels import registry
from glyd.kernels._fields import ints
from glyd.kernels.registry import M_BUCKETS, Kernel, Problem

__all__ = ["linear", "run_sorted", "choose", "sorts_rows", "DEFAULTS", "ExpertsKernel", "ExpertsLoopKernel",
           "ExpertsLoopConfig", "ExpertsGroupedKernel", "ExpertsGroupedConfig"]

log = logging.getLogger(__name__)

_GEMV = {"kernel": "fixed12_experts_gemv", "config": {}}
_LOOP = {"kernel": "experts_loop", "config": {}}
_MMA = {"kernel": "fixed12_experts_mma", "config": {}}
_MMA_TO_2048 = {"kernel": "fixed12_experts_mma", "config": {"max_rows": 2048}}
_GROUPED = {"kernel": "experts_unpack_grouped", "config": {}}
#: The candidates where the GPU's table has no ``experts`` section: layout -> M bucket (rows, i.e.
#: token-expert pairs) -> candidates. fixed12, ordered by the H200 probes of 2026-12-04
#: (``probe_moe_decode.py``, ``probe_moe_prompt.py``; Qwen3-30B-A3B's experts, CUDA graphs): up to
#: 255 rows the grouped GEMV (0.40-0.55x bf16 at 8-64 rows, the MMA 0.69-0.83x), then the MMA and the
#: loop; from 256 rows the grouped MMA up to 2048 rows (0.88-0.92x bf16 at 256-512, the GEMV 1.02-1.91x),
#: then the unpack + grouped GEMM (at 4096 rows 0.70 / 0.43 ms against the MMA's 0.88 / 0.49 ms), the
#: loop and the GEMV. MMA, unpack + GEMM and GEMV never sync with the host, so a CUDA graph capture
#: takes them in the same order. The other layouts: the loop.
DEFAULTS: dict[str, dict[str, list[dict[str, Any]]]] = {
    "fixed12": {b: [_GEMV, _MMA, _LOOP] if lo < 256 else [_MMA_TO_2048, _GROUPED, _LOOP, _GEMV]
                for b, lo, _ in M_BUCKETS},
    "tiered": {b: [_LOOP] for b, _, _ in M_BUCKETS},
    "dense11": {b: [_LOOP] for b, _, _ in M_BUCKETS},
}


class ExpertsKernel(Kernel):
    """A kernel family of expert products. ``syncs``: it synchronises with the host (not in a CUDA
    graph capture); ``sorts``: it sorts the rows by expert itself (``launch_sorted`` skips that)."""

    syncs = False
    sorts = False
    experts = True

    @classmethod
    def launch(cls, x2: torch.Tensor, ids: torch.Tensor, packed: Any, config: Any,  # type: ignore[override]
               out: torch.Tensor) -> torch.Tensor:
        """Write row ``s`` of ``x2`` times expert ``ids[s]``'s matrix transposed into ``out`` (bf16 [S, N])."""
        raise NotImplementedError

    @classmethod
    def launch_sorted(cls, x2: torch.Tensor, ids: torch.Tensor, offs: torch.Tensor, packed: Any, config: Any,
                      out: torch.Tensor) -> torch.Tensor:
        """``launch`` for rows sorted by expert (``ids`` non-decreasing; ``offs`` int32 [E]: rows of
        experts <= e): the product in the same order, in ``out`` or (a family that ``sorts``, given
        None) a new tensor. Families that do not sort rows take them as any rows."""
        return cls.launch(x2, ids, packed, config, out)

    @classmethod
    def prepare(cls, packed: Any, config: Any = None) -> None:
        """Build (once, outside a CUDA graph capture) what ``launch`` with ``config`` (None: the
        family's default) needs of ``packed`` beyond its arrays."""


@dataclasses.dataclass(frozen=True)
class ExpertsLoopConfig:
    """The loop has nothing to tune: each expert's product is the registry's choice."""


def _aligned(p):
    """``p`` with every array that does not start on a 16-byte boundary copied to one that does: an
    expert's arrays are views into the concatenated ones, and the linear kernels load 16-byte
    vectors (a tiered expert's views measured "misaligned address" on the H200, 2026-12-03). The
    copies cost memory on the prompt path until the format aligns each expert's arrays."""
    from glyd.codec import Packed

    arrays = {k: (v if v.data_ptr() % 16 == 0 else v.clone()) for k, v in p.arrays.items()}
    return Packed.trusted(p.layout, p.shape, arrays, p.version)


class ExpertsLoopKernel(ExpertsKernel):
    """Each chosen expert's rows through ``glyd.kernels.linear`` (any layout with kernels)."""

    name = "experts_loop"
    layout = ""
    Config = ExpertsLoopConfig
    syncs = True

    @classmethod
    def can_implement(cls, problem, device, config):
        if problem.layout not in DEFAULTS:
            return False, f"no kernels for layout {problem.layout!r}"
        return True, ""

    @classmethod
    def launch(cls, x2, ids, packed, config, out):
        from glyd import kernels

        e = packed.shape[0]
        flat = ids.to(torch.int64)
        counts = torch.bincount(flat.clamp(min=-1) + 1, minlength=e + 1).tolist()  # the host sync
        if counts[0] or len(counts) > e + 1:
            raise IndexError(f"ids hold an expert outside the {e} experts")
        order = torch.argsort(flat, stable=True)
        experts = C.cached(packed.arrays["lens"], lambda: [_aligned(packed.expert(i)) for i in range(e)],
                           packed.arrays.values(), C.packed_tag(packed))
        start = 0
        for i, c in enumerate(counts[1:]):
            if c:
                rows = order[start:start + c]
                out[rows] = kernels.linear(x2[rows], experts[i])
                start += c
        return out


#: Layouts whose experts unpack in one launch (``experts_unpack_grouped``).
_ONE_LAUNCH_UNPACK = {"fixed12"}
#: Scratch sizes of ``experts_unpack_grouped`` already logged, (device, E, N, K).
_LOGGED: set = set()


@dataclasses.dataclass(frozen=True)
class ExpertsGroupedConfig:
    """``max_scratch_bytes``: the largest bf16 scratch this family takes (all experts: E*N*K*2
    bytes; above it, chunks of experts that fit, with one host sync; the GEMV inside a CUDA graph
    capture). ``groups`` and ``warps``: the unpack's 64-weight groups and warps a program (the flat
    unpack's defaults)."""

    max_scratch_bytes: int = 2 << 30
    groups: int = 16
    warps: int = 2

    def __post_init__(self) -> None:
        ints(self, 0, None, "max_scratch_bytes")
        C.pow2(self, "groups")
        if isinstance(self.warps, bool) or not isinstance(self.warps, int) or self.warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"ExpertsGroupedConfig.warps must be 1, 2, 4, 8 or 16, got {self.warps!r}")


class ExpertsGroupedKernel(ExpertsKernel):
    """Rows sorted by expert (stable; ``experts_route.route``, one launch), the experts that have
    rows unpacked into one reused bf16 scratch ``[E, N, K]`` (``C.scratch``, one launch), one
    ``torch._grouped_mm`` (bf16, fp32 accumulation, as transformers' grouped path) and the rows put
    back. No host sync: the rows an expert has stay on the device (``offs``: rows of experts <= e);
    every expert has its slot in the scratch, those without rows are not unpacked (their groups are
    empty). Rows sorted by the caller (``launch_sorted``): the unpack and the grouped GEMM alone.

    Memory: the scratch holds all E experts, E*N*K*2 bytes (Qwen3-30B-A3B's gate_up: 128 x 1536 x
    2048 x 2 = 805 MB), kept for the device's later products (logged once a shape). Above
    ``max_scratch_bytes`` (2 GiB: Qwen3-235B-A22B's gate_up is 3.2 GB) the experts go in chunks
    that fit, one unpack and grouped GEMM each, after one host sync (each chunk's rows); inside a
    CUDA graph capture the GEMV runs instead, and the loop where not even one expert fits.
    ``torch._grouped_mm`` needs 16-byte strides (K and N multiples of 8) and sm_80+; the one-launch
    unpack K == Kp (a multiple of 64).
    """

    name = "experts_unpack_grouped"
    layout = ""
    Config = ExpertsGroupedConfig
    syncs = False  # the chunked path syncs, eagerly only
    sorts = True  # an MoE block gives it rows sorted once for both products (launch_sorted)

    @classmethod
    def can_implement(cls, problem, device, config):
        if problem.layout not in _ONE_LAUNCH_UNPACK:
            return False, f"no one-launch experts unpack for layout {problem.layout!r}"
        if not hasattr(torch, "_grouped_mm"):
            return False, f"torch {torch.__version__} has no torch._grouped_mm"
        if device.type == "cuda" and (device.capability or (0, 0)) < (8, 0):
            return False, f"torch._grouped_mm needs sm_80 or later, {device.name} is {device.capability}"
        if problem.k % 8 or problem.n % 8:
            return False, f"torch._grouped_mm needs 16-byte strides: K ({problem.k}) and N ({problem.n}) multiples of 8"
        if problem.kp != problem.k:
            return False, f"the one-launch experts unpack needs K a multiple of 64 (unpadded), got K = {problem.k}"
        return True, ""

    @classmethod
    def launch(cls, x2, ids, packed, config, out):
        e, n, k = packed.shape
        capturing = x2.is_cuda and torch.cuda.is_current_stream_capturing()
        if _chunk(config, n, k) < e and (capturing or _chunk(config, n, k) < 1):
            _log_once(x2.device, packed.shape, _chunk(config, n, k), capturing)
            return _fallback(x2, ids, packed, out, capturing)
        from glyd.kernels.experts_route import route

        # linear() checked ids eagerly; in a capture, rows outside the experts fall outside offs (NaN there)
        order, _, offs, _, _ = route(ids, e)
        ys = _grouped(x2.index_select(0, order), offs, packed, config, capturing)
        return out.index_copy_(0, order, ys)

    @classmethod
    def launch_sorted(cls, x2, ids, offs, packed, config, out=None):
        e, n, k = packed.shape
        capturing = x2.is_cuda and torch.cuda.is_current_stream_capturing()
        if _chunk(config, n, k) < e and (capturing or _chunk(config, n, k) < 1):
            _log_once(x2.device, packed.shape, _chunk(config, n, k), capturing)
            if out is None:
                out = torch.empty(x2.shape[0], n, dtype=torch.bfloat16, device=x2.device)
            return _fallback(x2, ids, packed, out, capturing)
        return _grouped(x2, offs, packed, config, capturing)

    @classmethod
    def prepare(cls, packed, config=None):
        from glyd.kernels.fixed12.experts_unpack import prepare_range

        cfg = config or ExpertsGroupedConfig()
        e, n, k = packed.shape
        if n * k == 0:
            return
        if _chunk(cfg, n, k) >= e:
            prepare_range(packed, 0, e, cfg.groups)
        else:  # a capture over the bound takes the GEMV
            registry.kernel_class(_GEMV["kernel"]).prepare(packed)


def _chunk(config, n, k):
    """Experts of N x K the scratch holds under ``config.max_scratch_bytes`` (and 32-bit offsets)."""
    return min(config.max_scratch_bytes // (n * k * 2), (2**31 - 1) // (n * k))


def _grouped(xs, offs, packed, config, capturing):
    """The product of rows sorted by expert (``offs``: rows of experts <= e), in their order: the
    experts with rows unpacked into the scratch, one ``torch._grouped_mm`` (chunks above the bound)."""
    from glyd.kernels.fixed12.experts_unpack import unpack_experts

    e, n, k = packed.shape
    chunk = _chunk(config, n, k)
    _log_once(xs.device, packed.shape, chunk, capturing)
    if chunk < e:
        return _chunks(xs, offs, packed, config, chunk)
    w = C.scratch(xs.device, e * n * k).view(e, n, k)  # a captured buffer is kept by scratch itself
    unpack_experts(packed, w, offs, 0, config.groups, config.warps)
    return torch._grouped_mm(xs, w.transpose(-2, -1), offs=offs)


def _chunks(xs, offs, packed, config, chunk):
    """The sorted rows' products, ``chunk`` experts at a time (one host sync: each chunk's rows)."""
    from glyd.kernels.fixed12.experts_unpack import unpack_experts

    e, n, k = packed.shape
    ends = [0, *offs.tolist()]  # the host sync
    ys = xs.new_empty(xs.shape[0], n)
    buf = C.scratch(xs.device, chunk * n * k)
    for e0 in range(0, e, chunk):
        e1 = min(e, e0 + chunk)
        r0, r1 = ends[e0], ends[e1]
        if r1 > r0:
            w = buf[:(e1 - e0) * n * k].view(e1 - e0, n, k)
            part = offs[e0:e1] - r0
            unpack_experts(packed, w, part, e0, config.groups, config.warps)
            ys[r0:r1] = torch._grouped_mm(xs[r0:r1], w.transpose(-2, -1), offs=part)
    return ys


def _log_once(device, shape, chunk, capturing):
    e, n, k = shape
    key = (str(device), e, n, k, min(chunk, e), capturing)
    if key in _LOGGED:
        return
    _LOGGED.add(key)
    if chunk >= e:
        log.info("experts_unpack_grouped: a %.0f MB bf16 scratch for %d experts of %d x %d on %s",
                 e * n * k * 2 / 1e6, e, n, k, device)
    else:
        log.info("experts_unpack_grouped: %d experts of %d x %d (%.0f MB) pass max_scratch_bytes: %s", e, n, k,
                 e * n * k * 2 / 1e6, "the GEMV runs (a graph capture)" if capturing else
                 "the loop runs (not one expert fits)" if chunk < 1 else f"chunks of {chunk} experts")


def _fallback(x2, ids, packed, out, capturing):
    """The product when the scratch cannot hold the experts: the GEMV in a capture, else the loop."""
    if capturing:
        gemv = registry.kernel_class(_GEMV["kernel"])
        return gemv.launch(x2, ids, packed, gemv.Config(), out)
    return ExpertsLoopKernel.launch(x2, ids, packed, ExpertsLoopConfig(), out)


#: The families of this file, by name (the others are layout families in ``registry.KERNELS``).
_OWN = {ExpertsLoopKernel.name: ExpertsLoopKernel, ExpertsGroupedKernel.name: ExpertsGroupedKernel}


def choose(problem: Problem, device: registry.Device, capturing: bool = False) -> tuple[type[ExpertsKernel], Any]:
    """(kernel class, config) for ``problem`` (M rows, one expert's N x K) on ``device``; cached, as
    ``registry.choose`` is (the choice is data)."""
    return _choose(problem, device, capturing)


@functools.lru_cache(maxsize=8192)
def _choose(problem: Problem, device: registry.Device, capturing: bool) -> tuple[type[ExpertsKernel], Any]:
    table = registry.table_for(device).get("experts", {})
    cands = table.get(problem.layout, {}).get(registry.m_bucket(problem.m)) or \
        DEFAULTS.get(problem.layout, {}).get(registry.m_bucket(problem.m), [])
    why = []
    cell = f"experts.{problem.layout}.{registry.m_bucket(problem.m)}"
    off = registry.disabled()
    for cand in cands:
        name = cand.get("kernel") if isinstance(cand, dict) else None
        if (name not in _OWN and name not in registry.KERNELS) or not isinstance(cand.get("config"), dict):
            raise ValueError(f"{cell}: bad candidate {cand!r}")
        kc = _OWN[name] if name in _OWN else registry.kernel_class(name)
        if not getattr(kc, "experts", False):  # a linear family here would crash every product of the cell
            log.warning("table cell %s: skipped %s: a family of linears, not of expert products", cell, name)
            why.append(f"{name}: not a family of expert products")
            continue
        if name in off:
            why.append(f"{name}: disabled by GLYD_DISABLED_KERNELS")
            continue
        if capturing and getattr(kc, "syncs", True):
            why.append(f"{cand['kernel']}: synchronises with the host (a CUDA graph is being captured)")
            continue
        try:
            cfg = kc.make_config(dict(cand["config"]), problem)
        except (TypeError, ValueError) as exc:
            log.warning("table cell %s: skipped %s %s: bad config (%s)", cell, name, cand["config"], exc)
            why.append(f"{cand['kernel']}: bad config ({exc})")
            continue
        ok, reason = kc.can_implement(problem, device, cfg)
        if ok:
            return kc, cfg
        why.append(f"{cand['kernel']}: {reason}")
    raise RuntimeError(f"no kernel can run the experts product {problem} on {device.name}: "
                       + ("; ".join(why) or "no candidates"))


# x: bf16 [..., K]; ids: int [...] (x's leading shape); packed: experts [E, N, K];
# offs: None, or int32 [E] (x [S, K] sorted by expert: rows of experts <= e) -> bf16 [..., N]
def linear(x: torch.Tensor, ids: torch.Tensor, packed: Any, config: Any = None,
           offs: torch.Tensor | None = None) -> torch.Tensor:
    """Row ``s`` of ``x`` times expert ``ids[s]``'s matrix transposed, straight from the packed
    experts (fp32 accumulation). ``config``: a kernel family's config (``ExpertsGemvConfig(bn=32)``,
    ``ExpertsLoopConfig()``, ``ExpertsGroupedConfig()``) runs that kernel; ``None`` lets the table choose.
    ``offs``: the rows come sorted by expert (``ids`` non-decreasing, as ``glyd.ops.experts.route``
    gives them) and ``offs[e]`` is the number of rows of experts <= e: no family sorts them again."""
    from glyd.codec.experts import PackedExperts

    if not isinstance(packed, PackedExperts):
        raise TypeError(f"packed must be a glyd PackedExperts, got {type(packed).__name__}")
    if isinstance(offs, torch.Tensor):  # the unpack kernel reads it as one int32 array (a strided view skipped experts)
        offs = offs.contiguous()
    arrays = None if offs is None else [packed.arrays[a] for a in array_names(packed.layout)]
    if arrays is not None and config is None:  # a call like an earlier one: its kept plan
        y = run_sorted(x, ids, offs, packed.layout, packed.shape, arrays, packed.version)
        if y is not None:
            return y
    e, n, k = packed.shape
    x2, flat = _checked(x, ids, packed, offs)
    s = x2.shape[0]
    if s == 0 or n == 0 or k == 0:
        out = torch.empty(s, n, dtype=torch.bfloat16, device=x2.device)
        return (out.zero_() if k == 0 else out).reshape(*x.shape[:-1], n)
    capturing = x2.is_cuda and torch.cuda.is_current_stream_capturing()
    if not capturing and (offs is None or not _route.checked(ids)):  # route() checked its ids once a block
        ends = flat if offs is None else flat[::max(1, s - 1)]  # sorted ids: their ends bound them all
        torch._assert_async((ends.clamp(0, e - 1) == ends).all(), "glyd experts_linear: ids outside the experts")
    problem = Problem(packed.layout, s, n, k, packed.arrays[_KP_ARRAY[packed.layout]].shape[1], packed.version)
    device = registry.Device.of(x2.device)
    if not capturing:
        _prepare_for_capture(problem, device, packed)
    own_choice = config is None
    if config is None:
        kernel, config = choose(problem, device, capturing)
    else:
        own = [kc for kc in _OWN.values() if isinstance(config, kc.Config)]
        kernel = own[0] if own else registry.kernel_for(config)
        if not getattr(kernel, "experts", False):
            raise TypeError(f"{type(config).__name__} is the config of {kernel.name}, a family of linears: "
                            "glyd.kernels.linear runs it; expert products take an experts family's config")
        ok, why = kernel.can_implement(problem, device, config)
        if not ok:
            raise ValueError(f"the {kernel.name} kernel cannot run this experts product ({problem}): {why}")
    if offs is None:
        out = kernel.launch(x2, flat, packed, config, torch.empty(s, n, dtype=torch.bfloat16, device=x2.device))
    elif own_choice and kernel is ExpertsGroupedKernel and _plan.enabled() and x.stride(1) == 1 \
            and _chunk(config, n, k) >= e:  # the prompt path: kept for the calls like this one (run_sorted)
        plan = _SortedPlan(packed, config, capturing)
        _plan.keep(packed.layout, packed.shape, arrays, packed.version, _sorted_key(x, ids, offs, capturing), plan)
        return plan(x, ids, offs, arrays)
    else:  # the unpack + grouped GEMM returns its own [S, N] tensor here: no second one held meanwhile
        out = None if kernel.sorts else torch.empty(s, n, dtype=torch.bfloat16, device=x2.device)
        out = kernel.launch_sorted(x2, flat, offs, packed, config, out)
    if capturing:  # a graph cannot raise: such rows (clamped, or left out of the groups) become NaN, never a value
        out.masked_fill_(((flat < 0) | (flat >= e))[:, None], float("nan"))
    return out.reshape(*x.shape[:-1], n)


class _SortedPlan:
    """An MoE block's product of sorted rows by the unpack + grouped GEMM, for calls whose arguments
    have the key of one that went through ``linear`` (``_sorted_key``; these packed experts, unchanged):
    that call's checks, choice and preparation hold for them. Per call: the ids' check where route()
    did not check them, the kept unpack launch, ``torch._grouped_mm`` (in a capture: NaN rows for
    ids outside the experts). Holds no array of the experts (their plans' rule)."""

    __slots__ = ("e", "n", "k", "device", "capturing", "launch", "planes")

    def __init__(self, packed: Any, config: ExpertsGroupedConfig, capturing: bool) -> None:
        from glyd.kernels.fixed12.experts_unpack import kept_launch

        self.e, self.n, self.k = packed.shape
        self.device = packed.device
        self.capturing = capturing
        self.launch = kept_launch(packed, 0, self.e, config.groups, config.warps, True)
        names = array_names(packed.layout)
        self.planes = tuple(names.index(a) for a in ("code", "lo", "base"))

    def __call__(self, x2: torch.Tensor, ids: torch.Tensor, offs: torch.Tensor, arrays) -> torch.Tensor:
        e, n, k = self.e, self.n, self.k
        if not self.capturing and not _route.checked(ids):
            ends = ids[::max(1, ids.shape[0] - 1)]
            torch._assert_async((ends.clamp(0, e - 1) == ends).all(), "glyd experts_linear: ids outside the experts")
        # looked up each call (another product may grow it); a captured buffer is kept by scratch itself
        w = C.scratch(self.device, e * n * k).view(e, n, k)
        c, lo, base = self.planes
        self.launch(w, offs, arrays[c], arrays[lo], arrays[base])
        out = torch._grouped_mm(x2, w.transpose(-2, -1), offs=offs)
        if self.capturing:
            out.masked_fill_(((ids < 0) | (ids >= e))[:, None], float("nan"))
        return out


def _sorted_key(x: torch.Tensor, ids: torch.Tensor, offs: torch.Tensor, capturing: bool) -> tuple:
    # what linear()'s checks and choice read of the arguments (x [S, K] with unit stride, ids [S], offs [E]
    # contiguous: the kept unpack launch reads it as one array)
    dev = x.get_device()
    return ("sorted", x.shape, x.stride(), x.dtype, dev, x.data_ptr() % 16, ids.shape, ids.dtype, ids.get_device(),
            offs.shape, offs.stride(), offs.dtype, offs.get_device(), capturing,
            _plan._current_device() if dev >= 0 else -1)


# x: bf16 [S, K]; ids: int [S] sorted; offs: int32 [E]; the op's packed experts arguments -> bf16 [S, N] or None
def run_sorted(x: torch.Tensor, ids: torch.Tensor, offs: torch.Tensor, layout: str, shape, arrays,
               version: int) -> torch.Tensor | None:
    """``linear(x, ids, packed, offs=offs)`` through the plan a call like it kept, or None (no plan:
    take ``linear``). No check of the packed experts, no choice, no preparation: the plan's key holds them."""
    if not (_plan.enabled() and type(x) is torch.Tensor and type(ids) is torch.Tensor and type(offs) is torch.Tensor):
        return None
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
    plan = _plan.kept(layout, shape, arrays, version, _sorted_key(x, ids, offs, capturing))
    return None if plan is None else plan(x, ids, offs, arrays)


def _checked(x, ids, packed, offs):
    """(x as [S, K], ids as [S]) after the checks of ``linear``'s arguments (no host sync)."""
    e, n, k = packed.shape
    x2 = C.check_x(x, k)
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"ids must be an int32 or int64 tensor, got {getattr(ids, 'dtype', type(ids).__name__)}")
    flat = ids.reshape(-1).contiguous()  # the GEMV and the MMA's alignment read one array (not ids[:, 0]'s stride)
    if flat.shape[0] != x2.shape[0] or tuple(ids.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"ids has shape {tuple(ids.shape)}: one expert a row of x {tuple(x.shape[:-1])} is needed")
    C.check_device(packed, x2)
    if flat.device != x2.device:
        raise ValueError(f"ids are on {flat.device}, x on {x2.device}")
    if offs is not None:
        if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or tuple(offs.shape) != (e,):
            raise ValueError(f"offs must be an int32 [{e}] tensor (rows of experts <= e), got "
                             f"{getattr(offs, 'dtype', type(offs).__name__)}{list(getattr(offs, 'shape', []))}")
        if offs.device != x2.device or x.dim() != 2:
            raise ValueError(f"sorted rows take x [S, K] and offs on x's device, got x {tuple(x.shape)} and offs "
                             f"on {offs.device}")
    return x2, flat


def sorts_rows(layout: str, shape, rows: int, device: torch.device) -> bool:
    """True where the kernel the table takes for ``rows`` rows of ``layout`` experts of ``shape``
    (E, N, K) on ``device`` (now: in a CUDA graph capture or not) sorts them by expert itself: rows
    sorted once for an MoE block's two products save it its sort, gather and scatter
    (``linear(..., offs=)``). Cached as ``choose`` is: every block of an eager decode step asks."""
    if layout not in _ONE_LAUNCH_UNPACK or rows < 1:  # only the unpack + grouped GEMM sorts
        return False
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    return _sorts(layout, tuple(shape), rows, device.type, device.index, capturing)


@functools.lru_cache(maxsize=8192)
def _sorts(layout: str, shape: tuple, rows: int, kind: str, index: int | None, capturing: bool) -> bool:
    from glyd.codec.fixed12 import padded_cols

    e, n, k = shape
    device = registry.Device.of(torch.device(kind, index) if index is not None else torch.device(kind))
    try:
        kernel, _ = choose(Problem(layout, rows, n, k, padded_cols(k)), device, capturing)
    except RuntimeError:
        return False
    return kernel.sorts


def _prepare_for_capture(problem: Problem, device: registry.Device, packed: Any) -> None:
    # An eager call (a warm-up step) builds what the kernel a capture of the same product would take
    # needs, whichever kernel runs now: a capture cannot synchronise with the host to build it. Once
    # a packed experts tensor and capture kernel (kept with its plans: again after an in-place change
    # or registry.reset()); each prepare checks its caches itself, which cost microseconds a product.
    try:
        kernel, config = choose(problem, device, True)
    except RuntimeError:  # no capture-safe kernel for this product: a capture refuses it by name
        return
    if not _plan.enabled():
        kernel.prepare(packed, config)
        return
    arrays = [packed.arrays[a] for a in array_names(packed.layout)]
    key = ("prepared for a capture", kernel.name, config)
    if _plan.kept(packed.layout, packed.shape, arrays, packed.version, key) is None:
        kernel.prepare(packed, config)
        _plan.keep(packed.layout, packed.shape, arrays, packed.version, key, True)


_KP_ARRAY = {"fixed12": "lo", "tiered": "sm", "dense11": "sm"}


registry.on_reset(_choose.cache_clear)  # a table read again (GLYD_TABLES, reset()) takes new choices
registry.on_reset(_sorts.cache_clear)
