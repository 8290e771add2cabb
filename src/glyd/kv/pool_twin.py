"""The pure-torch twins of the static pool's two kernels (``glyd::kvf12_write``, ``glyd::kvf12_attention``).

A pool side (keys or values) of one layer is the planes of ``NB`` blocks (a block: one page of one
KV head), block-major, the last ``H`` of them a sink the twin writes its masked-off tiles to:
``lo [NB, P, D]``, ``code [NB, P, D/2]``, ``base [NB, G]`` (uint8), ``meta [NB, 2]`` (int32: first
exception, count; a count of -1 marks a block whose exceptions did not fit), the exception arena
``exc [E + 1]`` (int32, the last entry a sink), its fill counter ``used [1]`` (int32: it keeps
counting past ``E``, so ``used > E`` says the arena overflowed) and the raw pages ``raw [B, H, P, D]``.
``block_index [B, H, J]`` (int32) maps page ``j`` of sequence ``b``, head ``h`` to its block;
``lens [B]`` (int32) counts each sequence's tokens, the new ones included.

The write twin does what the Triton kernel does without a host sync (so a CUDA step could be
captured with it too); the attention twin reads exception counts on the host (it unpacks with
``glyd.kv.fixed.unpack_blocks``, which bound-checks every block it reads).
"""

from __future__ import annotations

import math

import torch

from glyd.errors import FormatError, GlydError, UnsupportedError
from glyd.kv.fixed import WINDOW, channel_base, choose_base, unpack_blocks

__all__ = ["KVCapacityError", "write_torch", "attention_torch", "pack_tiles", "softmax_step", "kept"]


class KVCapacityError(GlydError, RuntimeError):
    """A static KV pool ran out of what it reserved: context positions or exception entries."""


def softmax_step(qf: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, valid: torch.Tensor, m: torch.Tensor,
                 l_: torch.Tensor, acc: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One page of the twins' online softmax (fp32, log2 units, probabilities rounded to bf16 before the
    value product as the kernels do): ``qf [B, H, G, D]`` fp32, ``kb``/``vb [B, H, P, D]``, ``valid [B, P]``;
    the state ``m, l_ [B, H, G]``, ``acc [B, H, G, DV]``. Slots not ``valid`` must hold finite values in ``vb``."""
    s = torch.einsum("bhgd,bhtd->bhgt", qf, kb.float()) * (scale * 1.4426950408889634)
    s = torch.where(valid[:, None, None, :], s, float("-inf"))
    m_new = torch.maximum(m, s.amax(-1))  # -inf while every token so far is masked
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    alpha = torch.exp2(m - m_safe)
    pr = torch.exp2(s - m_safe[..., None])
    l_ = l_ * alpha + pr.sum(-1)
    acc = acc * alpha[..., None] + torch.einsum("bhgt,bhtd->bhgd", pr.to(torch.bfloat16).float(), vb.float())
    return m_new, l_, acc


def pack_tiles(tiles: torch.Tensor) -> dict[str, torch.Tensor]:
    """kvf12 planes of ``tiles [N, P, D]`` (bf16) with no host sync: ``lo``, ``code``, ``base``, the
    exception flags ``exc_mask [N, P*D]`` (bool) and entries ``entry [N, P*D]`` (int32, ``index | word << 16``)."""
    n, p, d = tiles.shape
    w = tiles.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    hi7 = (w >> 8) & 0x7F
    base = choose_base(hi7)
    off = hi7 - channel_base(base, d)[:, None, :]
    inside = (off >= 0) & (off < WINDOW)
    code = ((w >> 12) & 8) | torch.where(inside, off, 0)
    h = d // 2
    idx = torch.arange(p * d, dtype=torch.int32, device=tiles.device)
    return {
        "lo": (w & 0xFF).to(torch.uint8),
        "code": (code[..., :h] | (code[..., h:] << 4)).to(torch.uint8),
        "base": base.to(torch.uint8),
        "exc_mask": ~inside.reshape(n, p * d),
        "entry": (idx[None, :] | (w.reshape(n, p * d) << 16)).to(torch.int32),
    }


def _tiles(x: torch.Tensor, raw: torch.Tensor, pos0: torch.Tensor, chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The page tiles the write touches, ``[B, C, H, P, D]`` bf16 (rows before ``pos0`` from ``raw``, the
    new tokens from ``x``, zeros elsewhere), and their page numbers ``j [B, C]``."""
    b, h, t, d = x.shape
    p = raw.shape[2]
    dev = x.device
    j = pos0[:, None] // p + torch.arange(chunks, device=dev)[None, :]  # [B, C]
    g = j[..., None] * p + torch.arange(p, device=dev)  # [B, C, P] token positions
    start = pos0[:, None, None]
    from_x = (g >= start) & (g < start + t)
    from_raw = g < start
    xi = (g - start).clamp(0, t - 1).reshape(b, 1, chunks * p, 1).expand(b, h, chunks * p, d)
    xg = torch.gather(x.view(torch.int16), 2, xi).reshape(b, h, chunks, p, d)  # int16: NaN payloads kept
    rg = raw.view(torch.int16)[:, :, None].expand(b, h, chunks, p, d)
    zero = torch.zeros((), dtype=torch.int16, device=dev)
    tile = torch.where(from_x[:, None, ..., None], xg, torch.where(from_raw[:, None, ..., None], rg, zero))
    return tile.permute(0, 2, 1, 3, 4).contiguous().view(torch.bfloat16), j


# x [B, H, T, D] bf16 (the new tokens); lens [B] int32 (tokens after the write); block_index [B, H, J] int32;
# lo/code/base/meta: [NB, ...] (the last H blocks a sink); exc [E + 1] int32; used [1] int32; raw [B, H, P, D] bf16.
def write_torch(x, lens, block_index, lo, code, base, meta, exc, used, raw) -> None:
    """Write ``x`` at positions ``lens - T ..`` of every sequence: pages that fill are packed into their
    blocks, the rest goes to ``raw``. Sync-free: masked-off writes land in the sink block and entry."""
    b, h, t, d = x.shape
    p, nb, e = lo.shape[1], lo.shape[0], exc.numel() - 1
    jcap = block_index.shape[2]
    dev = x.device
    chunks = (t + 2 * p - 2) // p  # pages a run of t tokens can touch
    pos0 = lens.to(torch.int64) - t
    tiles, j = _tiles(x, raw, pos0, chunks)  # [B, C, H, P, D], [B, C]
    full = ((j + 1) * p <= (pos0 + t)[:, None]) & (j < jcap)  # [B, C]
    pk = pack_tiles(tiles.reshape(b * chunks * h, p, d))
    fb = full[:, :, None].expand(b, chunks, h).reshape(-1)  # [NBW]
    cnt = torch.where(fb, pk["exc_mask"].sum(1), 0)
    start = used.to(torch.int64) + torch.cumsum(cnt, 0) - cnt
    used.add_(cnt.sum().to(used.dtype))
    fits = start + cnt <= e
    meta_new = torch.stack([torch.where(fb, start, 0), torch.where(fb, torch.where(fits, cnt, -1), 0)], 1)
    rank = torch.cumsum(pk["exc_mask"].to(torch.int64), 1) - 1
    keep = pk["exc_mask"] & (fb & fits)[:, None]
    slot = torch.where(keep, start[:, None] + rank, e)
    exc.index_put_((slot.reshape(-1),), pk["entry"].reshape(-1))
    heads = torch.arange(h, device=dev)
    blk = block_index.to(torch.int64).gather(2, j.clamp(0, jcap - 1)[:, None, :].expand(b, h, chunks))  # [B, H, C]
    sink = (nb - h + heads)[None, None, :]
    target = torch.where(full[:, :, None], blk.permute(0, 2, 1), sink).reshape(-1)  # [B, C, H] order
    lo.index_put_((target,), pk["lo"])
    code.index_put_((target,), pk["code"])
    base.index_put_((target,), pk["base"])
    meta.index_put_((target,), meta_new.to(meta.dtype))
    # the raw page afterwards: the tile of the page the last new token is in, when that page is not full
    end = pos0 + t
    last = (end // p - pos0 // p).clamp_max(chunks - 1)  # [B]
    new_raw = tiles[torch.arange(b, device=dev), last]  # [B, H, P, D]
    partial = (end % p != 0)[:, None, None, None]
    raw.copy_(torch.where(partial, new_raw.view(torch.int16), raw.view(torch.int16)).view(torch.bfloat16))


def kept(pos: torch.Tensor, starts: torch.Tensor | None, valid: torch.Tensor | None) -> torch.Tensor:
    """Which positions ``pos [B or 1, T]`` the masks keep, ``[B, T]`` (or ``[1, T]`` with neither): at or after
    ``starts [B]``, and where ``valid [B, S]`` holds a nonzero entry (positions past ``S``: masked)."""
    keep = torch.ones_like(pos, dtype=torch.bool)
    if starts is not None:
        keep = keep & (pos >= starts.to(pos.device)[:, None])
    if valid is not None:
        if valid.dim() != 2 or valid.dtype not in (torch.bool, torch.uint8):
            raise FormatError(f"valid must be bool or uint8 [B, positions], got {valid.dtype} {tuple(valid.shape)}")
        v = valid.to(pos.device) != 0
        v = torch.cat([v, v.new_zeros(v.shape[0], 1)], 1)  # a False column for the positions past the row
        keep = keep & torch.gather(v, 1, pos.clamp(0, v.shape[1] - 1).expand(v.shape[0], -1))
    return keep


def _pool_lens(lens: torch.Tensor, p: int, jcap: int, capped: bool) -> torch.Tensor:
    n = lens.to(torch.int64)
    if bool((n < 1).any()) or (capped and bool((n > jcap * p).any())):
        raise KVCapacityError(f"sequence lengths {n.tolist()} must be in 1..{jcap * p} (the pool's context)")
    return n


def _page(side: list[torch.Tensor], blk: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """bf16 ``[B, H, P, D]``: blocks ``blk [B, H]`` decoded where ``packed [B, 1]``, zeros elsewhere
    (bound-checked; a block marked overflowed raises)."""
    lo, code, base, meta, exc, raw = side
    out = torch.zeros_like(raw)
    sel = packed.expand_as(blk)
    if not bool(sel.any()):
        return out
    i = blk[sel].to(torch.int64)
    m = meta[i]
    if bool((m[:, 1] < 0).any()):
        raise KVCapacityError("a KV page's exceptions did not fit the pool's exception arena (its values are lost); "
                              "reserve more with exc_fraction")
    out[sel] = unpack_blocks(lo[i], code[i], base[i], m, exc)
    return out


# q [B, Hq, D] bf16; lens [B] int32; starts [B] int or None; block_index [B, H, J] int32; k_side/v_side:
# [lo, code, base, meta, exc, raw] as write_torch takes them (exc: any arena meta points into) -> [B, Hq, DV] bf16.
def attention_torch(q, lens, starts, block_index, k_side, v_side, scale: float, capped: bool = True,
                    valid: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention over the pool, page by page through ``block_index`` (the kernel's algorithm).
    ``capped``: ``block_index`` lists every page a sequence may have (a pool; a store lists its full
    pages only, and its raw page comes after them). ``valid [B, S]`` (bool or uint8, or None): position
    ``t`` of sequence ``b`` is attended only where ``t < S`` and ``valid[b, t]`` (the attention mask's row)."""
    b, hq, d = q.shape
    h, jcap = block_index.shape[1], block_index.shape[2]
    p, dv = k_side[0].shape[1], v_side[0].shape[2]
    if q.is_cuda and torch.cuda.is_current_stream_capturing():  # its host reads would break the capture
        raise UnsupportedError(f"no CUDA kernel reads a pool of {p}-token pages and head dims {d}/{dv}, and the "
                               "torch twin cannot run in a CUDA graph: use pages of >= 32 tokens, or "
                               "generate(..., disable_compile=True)")
    g = hq // h
    n = _pool_lens(lens, p, jcap, capped)
    qf = q.reshape(b, h, g, d).float()
    m = torch.full((b, h, g), float("-inf"), device=q.device)
    l_ = torch.zeros(b, h, g, device=q.device)
    acc = torch.zeros(b, h, g, dv, device=q.device)
    n_full = n // p
    t_idx = torch.arange(p, device=q.device)
    for j in range(math.ceil(int(n.max()) / p)):
        packed = (j < n_full)[:, None]
        blk = block_index[:, :, min(j, jcap - 1)] if jcap else torch.zeros(b, h, dtype=torch.int32, device=q.device)
        is_raw = ~packed[:, :, None, None]
        kb = torch.where(is_raw, k_side[5], _page(k_side, blk, packed))
        vb = torch.where(is_raw, v_side[5], _page(v_side, blk, packed))
        pos = j * p + t_idx[None, :]
        keep = (pos < n[:, None]) & kept(pos, starts, valid)
        vb = torch.where(keep[:, None, :, None], vb, torch.zeros((), dtype=vb.dtype, device=vb.device))
        m, l_, acc = softmax_step(qf, kb, vb, keep, m, l_, acc, scale)
    return (acc / l_[..., None]).reshape(b, hq, dv).to(torch.bfloat16)
