"""What the row lookup (``glyd::rows``) checks before it reads a packed matrix: the ids asked for
(every call, cheaply) and the offsets and exception indices that come from a file (once a matrix).

Ids outside ``[0, rows)`` raise ``IndexError`` as ``nn.Embedding`` does: a plain check on the host
for ids on the CPU (and any device but CUDA); for CUDA ids ``torch._assert_async``, a device-side
assert with no host sync (safe under CUDA graphs), which is what torch's own embedding does on
CUDA: the error surfaces at the next synchronization as "device-side assert triggered" and leaves
the CUDA context unusable (pass CPU ids to get the IndexError).

The arrays' values are checked with torch ops on their device, with host syncs, the first time a
matrix is looked up, then again only when one of its tensors is replaced or changed in place
(``load_state_dict``), as strictly as the CPU codec checks them on every unpack: fixed12's and
dense11's window base and exception indices (inside the matrix, strictly increasing; dense11's
exactly its escapes whose digit is 15), tiered's and dense11's block offsets, which must be exactly
what the blocks' escapes need (tiered: the digits of every tier read from ``area``; dense11: the
escape codes of every block), every layout's padding columns and the unused bits of dense11's last
escape word (zero, as the format says). A damaged array raises ``CorruptError``; the row lookup never
clamps a damaged offset into a wrong row. Bits flipped inside the data that keep these valid give
wrong weights, which ``glyd.verify`` names.
"""

from __future__ import annotations

import weakref

import torch

from glyd.codec import LAYOUTS, dense11, dense11_v2, fixed12, tiered
from glyd.codec.packed import Packed
from glyd.errors import CorruptError

__all__ = ["check_ids", "check_arrays_once"]

#: Bytes of a plane the checks decode at once (bounds their memory on a large embedding table).
CHUNK = 1 << 22


def check_ids(ids: torch.Tensor, rows: int) -> None:
    """Raise TypeError unless ``ids`` holds integers, IndexError unless every one lies in
    ``[0, rows)`` (on CUDA a device-side assert instead: no host sync)."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"row ids must be a tensor, got {type(ids).__name__}")
    if ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"row ids must be an integer tensor (as nn.Embedding's), got {ids.dtype}")
    if ids.numel() == 0:
        return
    flat = ids.reshape(-1).to(torch.int64)
    # Float ids are taken when every one is a whole number (a checkpoint may store an integer buffer,
    # such as BERT's position ids, in bf16, and glyd keeps stored dtypes); 2.5 is no row.
    whole = (ids.reshape(-1) == flat.to(ids.dtype)).all() if ids.dtype.is_floating_point else None
    if ids.device.type == "cuda":  # no host sync: a device-side assert, as torch's own embedding on CUDA
        ok = (flat >= 0) & (flat < rows)
        torch._assert_async((ok.all() & whole) if whole is not None else ok.all(),
                            f"glyd rows: an id is outside [0, {rows}) or not a whole number")
    elif ids.device.type != "meta":
        if whole is not None and not bool(whole):
            raise TypeError(f"row ids must be whole numbers (as nn.Embedding's integer ids), got {ids.dtype} values "
                            f"with a fraction")
        lo, hi = (int(v) for v in torch.aminmax(flat))
        if lo < 0 or hi >= rows:
            raise IndexError(f"row id {lo if lo < 0 else hi} is out of range: the packed matrix has {rows} rows "
                             f"(ids in [0, {rows}))")


_CHECKED: dict[int, tuple[tuple, tuple]] = {}


def check_arrays_once(p: Packed) -> None:
    """Check ``p``'s offsets and exception indices (see the module's docstring) unless these very
    tensors, unchanged since, passed before as a matrix of this layout, shape and format version."""
    arrays = tuple(p.arrays[a] for a in LAYOUTS[p.layout].ARRAYS)
    if arrays[0].device.type == "meta":
        return
    key = (p.layout, p.shape, p.version, tuple(a._version for a in arrays))  # the version decides the decode
    first = id(arrays[0])
    hit = _CHECKED.get(first)
    if hit is not None and hit[0] == key and all(r() is a for r, a in zip(hit[1], arrays)):
        return
    check = _CHECKS.get(p.layout)  # glyd's own row decodes; another layout's is its own business
    if check is not None:
        check(p)
    if hit is None:
        weakref.finalize(arrays[0], _CHECKED.pop, first, None)
    _CHECKED[first] = (key, tuple(weakref.ref(a) for a in arrays))


def _check_base(p: Packed, most: int) -> None:
    base = int(p.arrays["base"].reshape(-1)[0])
    if base > most:
        raise CorruptError(f"{p.layout} base {base} is out of range 0..{most}")


def _check_exceptions(p: Packed) -> None:
    n, k = p.shape
    idx = p.arrays["exc_idx"].to(torch.int64)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n * k or bool((idx[1:] <= idx[:-1]).any())):
        raise CorruptError(f"{p.layout} 'exc_idx' is not a strictly increasing list of indices inside the {n}x{k} "
                           f"matrix")


def _check_fixed12(p: Packed) -> None:
    _check_base(p, fixed12.MAX_BASE)
    _check_exceptions(p)
    fixed12.check_padding(p)


def _offsets(p: Packed, nblk: int, what: str, superblock: int) -> torch.Tensor:
    """int64 [nblk + 1]: where each block's escape data starts (a 32-bit base a ``superblock``
    blocks, a 16-bit offset a block), then the total; increasing from 0."""
    a = p.arrays
    base = a["esc_base"].to(torch.int64)
    blk = torch.arange(nblk, device=base.device)
    off = torch.cat([base[blk // superblock] + a["esc_off"].to(torch.int32).to(torch.int64), base[-1:]])
    if bool((base[0] != 0) | (off[1:] < off[:-1]).any() | (base[1:] < base[:-1]).any()):
        raise CorruptError(f"{p.layout} 'esc_base'/'esc_off' are not an increasing table of offsets into {what}")
    return off


def _check_dense11(p: Packed) -> None:
    n, k = p.shape
    _check_base(p, dense11.MAX_BASE)
    _check_exceptions(p)
    off = _offsets(p, dense11.num_blocks(n, k), "'esc'", dense11.SUPER)
    counts, raw = dense11.device_escapes(p, CHUNK)
    want = torch.cat([off.new_zeros(1), counts.cumsum(0)])
    total = int(want[-1])
    if off.shape != want.shape or bool((off != want).any()) or p.arrays["esc"].numel() != (total + 7) // 8:
        raise CorruptError("dense11 escape offsets do not match the escape codes of their blocks (corrupt "
                           "'esc_base', 'esc_off' or 'esc')")
    dense11.check_stream_tail(p.arrays["esc"], total)
    if not torch.equal(raw, p.arrays["exc_idx"].to(torch.int64)):
        raise CorruptError("dense11 'exc_idx' does not list exactly the escapes whose digit is 15")


def _tiered_first_escapes(p: Packed, nblk: int) -> torch.Tensor:
    """int64 [blocks]: weights of each block whose first-tier digit escapes (3)."""
    flat = p.arrays["d1"].reshape(-1)  # 4 digits a byte; a block is BLOCK // 4 consecutive bytes
    per = tiered.BLOCK // 4
    out = torch.zeros(nblk, dtype=torch.int64, device=flat.device)
    for s in range(0, flat.numel(), CHUNK // per * per):
        b = flat[s : s + CHUNK // per * per]
        cnt = torch.zeros(b.shape, dtype=torch.int64, device=b.device)
        for i in range(4):
            cnt += ((b >> (2 * i)) & 3) == 3
        out.index_add_(0, torch.arange(b.numel(), device=b.device) // per + s // per, cnt)
    return out


def _ones_table(width: int, device: torch.device) -> torch.Tensor:
    """int64 [8 // width + 1, 256]: how many of a byte's first ``m`` digits (``width`` bits each, from
    bit 0) are all ones (an escape to the next tier)."""
    per, ones = 8 // width, (1 << width) - 1
    v = torch.arange(256, device=device)
    hit = torch.stack([((v >> (width * j)) & ones) == ones for j in range(per)]).to(torch.int64)
    return torch.cat([torch.zeros(1, 256, dtype=torch.int64, device=device), hit.cumsum(0)])


def _next_escapes(area: torch.Tensor, start: torch.Tensor, esc: torch.Tensor, width: int) -> torch.Tensor:
    """int64 [blocks]: of the ``esc[b]`` digits (``width`` bits) that block b's area holds from byte
    ``start[b]`` on, how many are all ones (escape to the next tier)."""
    per = 8 // width
    size = (esc + per - 1) // per
    nbytes = int(size.sum())
    owner = torch.repeat_interleave(torch.arange(esc.numel(), device=esc.device), size, output_size=nbytes)
    q = torch.arange(nbytes, device=esc.device) - (size.cumsum(0) - size)[owner]  # byte of the block's digits
    byte = area[start[owner] + q].to(torch.int64)
    hits = _ones_table(width, area.device)[(esc[owner] - q * per).clamp(0, per), byte]
    return torch.zeros_like(esc).index_add_(0, owner, hits)


def _check_tiered(p: Packed) -> None:
    # The codec's size rule, on the device: a block's area holds, tier after tier, the digits of its
    # weights that escaped the tier before (rounded up to whole bytes), then one raw byte each.
    n, k = p.shape
    tiered.check_padding(p)
    area = p.arrays["area"]
    nblk = tiered.num_blocks(n, k)
    off = _offsets(p, nblk, "'area'", tiered.SUPER)
    if int(off[-1]) != area.numel():
        raise CorruptError(f"tiered 'esc_base' ends at {int(off[-1])}, not at the end of 'area' ({area.numel()} bytes)")
    first = _tiered_first_escapes(p, nblk)
    step = max(1, CHUNK // (2 * tiered.BLOCK))  # blocks at once: a block's area is at most 2 * BLOCK bytes
    for b in range(0, nblk, step):
        e = min(b + step, nblk)
        start, room, esc = off[b:e], off[b + 1 : e + 1] - off[b:e], first[b:e]
        used = torch.zeros_like(room)
        for width, _ in tiered.TIERS[1:]:
            size = (esc + 8 // width - 1) // (8 // width)
            if bool((used + size > room).any()):
                break
            esc, used = _next_escapes(area, start + used, esc, width), used + size
        else:
            if torch.equal(used + esc, room):
                continue
        raise CorruptError("tiered escape area sizes do not match its escape digits (corrupt 'esc_base', 'esc_off' or "
                           "'area')")


_CHECKS = {fixed12.NAME: _check_fixed12, tiered.NAME: _check_tiered, dense11.NAME: _check_dense11}
