"""The rows of a mixture-of-experts block sorted by expert in one launch: the CUDA implementation of
``glyd::experts_route`` (``glyd.ops.experts.route``), once a block for both of its products.

``torch.sort(ids, stable=True)`` and ``torch.searchsorted`` of the experts made about a dozen
launches (cub's radix sort over 64-bit keys: a histogram, a scan, eight passes; the indices' fill;
the offsets), each a few microseconds of host time in an eager prompt, twice a block before. Here one
program a bucket of keys ``clamp(id, -1, E) + 1`` (0: below the experts, 1 .. E: expert ``key - 1``,
E + 1: above) counts every bucket over all rows, then writes its own rows in their order from the
start the buckets before it give: a stable counting sort, as the grouped MMA's alignment sorts its
blocks (``fixed12/experts_mma.py``). Rows outside the experts come first (below) or last (above),
in row order: a product refuses them (their ids at the ends) or gives them NaN in a graph.
No host sync, a grid fixed by E: a CUDA graph captures it.

The launch is a ``glyd.kernels._plan.Launch`` kept per problem (rows, experts, group, ids' dtype and
device; :data:`MAX_LAUNCHES` of them): from its third call it goes straight through the compiled
kernel's launcher, not Triton's binder (an eager prompt routes every block with the same rows).
"""

from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl

from glyd.kernels import _plan
from glyd.kernels._interp import isolated

__all__ = ["route", "route_launch", "mark_checked", "checked"]

#: Rows a program reads at once (each program reads every row twice) and its warps: a guess, not
#: yet timed on a GPU (``probe_moe_block.py`` times 1024 / 4, 2048 / 8 and 4096 / 8).
CHUNK = 2048
WARPS = 8
#: Route launches kept (problems seen; the oldest goes first): one a prompt length.
MAX_LAUNCHES = 64
_LAUNCHES: dict[tuple, _plan.Launch] = {}


@isolated
@triton.jit
def _route_kernel(ids_ptr, order_ptr, sids_ptr, group_ptr, offs_ptr, ok_ptr, S, E, GROUP, BP: tl.constexpr,
                  CH: tl.constexpr):
    # program b: the rows of bucket b (key = clamp(id, -1, E) + 1), after the rows of buckets < b
    b = tl.program_id(0)
    ch = tl.arange(0, CH)
    hist = tl.zeros([BP], dtype=tl.int32)
    for s0 in range(0, S, CH):
        ok = s0 + ch < S
        v = tl.load(ids_ptr + s0 + ch, mask=ok, other=0)
        key = (tl.minimum(tl.maximum(v, -1), E) + 1).to(tl.int32)
        hist += tl.histogram(key, BP, mask=ok)
    bp = tl.arange(0, BP)
    start = tl.sum(tl.where(bp < b, hist, 0))
    cnt = tl.sum(tl.where(bp == b, hist, 0))
    if (b >= 1) & (b <= E):
        tl.store(offs_ptr + b - 1, start + cnt)  # rows of experts <= b - 1 (and those below the experts)
    if b == 0:  # every id inside the experts: one flag for the caller's one check
        tl.store(ok_ptr, tl.sum(tl.where((bp == 0) | (bp == E + 1), hist, 0)) == 0)
    if cnt > 0:
        run = start
        for s0 in range(0, S, CH):
            rows = s0 + ch
            ok = rows < S
            v = tl.load(ids_ptr + rows, mask=ok, other=0)
            hit = ((tl.minimum(tl.maximum(v, -1), E) + 1).to(tl.int32) == b) & ok
            h = hit.to(tl.int32)
            pos = run + tl.cumsum(h, 0) - h
            tl.store(order_ptr + pos, rows.to(tl.int64), mask=hit)
            tl.store(sids_ptr + pos, v, mask=hit)
            tl.store(group_ptr + pos, (rows // GROUP).to(tl.int64), mask=hit)
            run += tl.sum(h)


# ids: int32/int64 [S] -> order int64 [S], ids[order] [S] (ids' dtype), offs int32 [E], order // group int64 [S],
# ok bool [1]
def route(ids: torch.Tensor, experts: int, group: int = 1, chunk: int = CHUNK,
          warps: int = WARPS) -> tuple[torch.Tensor, ...]:
    """(order, sorted ids, offs, order // group, ok) of ``ids``: the rows sorted by expert (stable),
    their ids, the rows of experts <= e, each sorted row's token (``group``: rows a token), and
    whether every id is one of the experts. One launch."""
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ids must be a 1-D int32 or int64 tensor, got {ids.dtype}{list(ids.shape)}")
    if experts < 1 or group < 1:
        raise ValueError(f"route needs experts >= 1 and group >= 1, got {experts} and {group}")
    if chunk < 32 or chunk & (chunk - 1) or warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"route takes a power-of-two chunk >= 32 and 1-16 warps, got {chunk} and {warps}")
    s = ids.shape[0]
    if s > 2**31 - chunk:  # the kernel's int32 chunk loop steps to s0 + chunk: past 2**31 it wraps negative
        raise ValueError(f"ids has {s} rows; route takes at most 2**31 - {chunk} (int32 rows in chunks of {chunk})")
    ids = ids.contiguous()
    order = torch.empty(s, dtype=torch.int64, device=ids.device)
    sids = torch.empty_like(ids)
    tokens = torch.empty(s, dtype=torch.int64, device=ids.device)
    offs = torch.empty(experts, dtype=torch.int32, device=ids.device)
    ok = torch.empty(1, dtype=torch.bool, device=ids.device)
    if s == 0:
        return order, sids, offs.zero_(), tokens, ok.fill_(True)
    launch = _kept_launch(s, experts, group, chunk, warps, ids)
    launch(ids, order, sids, tokens, offs, ok)
    return order, sids, offs, tokens, ok


# -> launch(ids, order, sids, tokens, offs, ok): route's one launch for S rows of E experts
def route_launch(s: int, experts: int, group: int, chunk: int = CHUNK, warps: int = WARPS) -> _plan.Launch:
    """``route``'s kernel launch for ``s`` rows as a ``glyd.kernels._plan.Launch`` (the tensors per call)."""
    bp = max(32, triton.next_power_of_2(experts + 2))
    return _plan.Launch(_route_kernel, (experts + 2,), (*_plan.slots(6), s, experts, group),
                        dict(BP=bp, CH=chunk, num_warps=warps))


def _kept_launch(s: int, experts: int, group: int, chunk: int, warps: int, ids: torch.Tensor) -> _plan.Launch:
    # the ids' dtype is the kernel's signature, the device the launch's (plans off: one launch, kept by none)
    if not _plan.enabled():
        return route_launch(s, experts, group, chunk, warps)
    dev = ids.get_device()
    key = (s, experts, group, chunk, warps, ids.dtype, dev, _plan._current_device() if dev >= 0 else -1)
    launch = _LAUNCHES.get(key)
    if launch is None:
        if len(_LAUNCHES) >= MAX_LAUNCHES:
            del _LAUNCHES[next(iter(_LAUNCHES))]
        launch = _LAUNCHES[key] = route_launch(s, experts, group, chunk, warps)
    return launch


#: id(sorted ids) -> (a weak reference, its _version): sorted ids that ``route``'s caller checked
#: (one flag, one ``_assert_async`` a block), so that the block's products skip their own check
_CHECKED: dict[int, tuple] = {}


def mark_checked(sids: torch.Tensor) -> None:
    """Remember that every id of ``sids`` (as it is now) was checked to be one of the experts."""
    key = id(sids)
    _CHECKED[key] = (weakref.ref(sids, lambda _, k=key: _CHECKED.pop(k, None)), sids._version)


def checked(ids: torch.Tensor) -> bool:
    """True when ``ids`` is sorted ids that ``mark_checked`` remembered, unchanged in place since."""
    hit = _CHECKED.get(id(ids))
    return hit is not None and hit[0]() is ids and hit[1] == ids._version
