"""``dense11`` format version 2: the code words of a run in the ``niblut`` arrangement and the
``wincx`` escape scheme (issue 35; chosen by the H200 and CPU research of 2026-12-04:
``benchmarks/history/2026-12-04-dense-escapes-cpu.md``). Same arrays, dtypes and shapes as
version 1 (``glyd.codec.dense11``); two things change:

- **Code words.** A run of 32 weights keeps three int32 words, now as 8 nibbles each: nibble i of
  word x (x = 0, 1, 2) holds the 3-bit code of column 8x + i in its low 3 bits, and its top bit is
  bit x of the code of column 24 + i. A GPU turns ``(word >> 16h) & 0x7777`` into a ``prmt``
  selector: one byte permute looks up the exponent bytes of 4 weights.
- **Ranks.** An escape's digit stays in the stream in column order (version 1's order), but only
  a run's first 8 escapes may carry a table digit: an escape of rank 8 or more in its run has
  digit 15 and is in the exception list (a kernel patches a run's first 8 escapes from one 64-bit
  window of the stream, with no loop; the rest are exceptions). Real weights: 0.001-0.012 bits a
  weight more than version 1 (docs/format.md).

Every function here is torch on the arrays' device (the codec on the CPU, the GPU pack on CUDA).

>>> import torch
>>> from glyd.codec import dense11_v2 as V
>>> codes = torch.arange(32).remainder(8).view(1, 1, 32)
>>> torch.equal(V.codes_of(V.words_of(codes)), codes)
True
"""

from __future__ import annotations

import torch

from glyd.errors import CorruptError

#: Weights of a run (three code words).
RUN = 32
#: Escapes a run may give table digits (ranks 0..7); later ones are exceptions (digit 15).
CAP = 8
ESCAPE = 7
RAW = 15


def _nib(device) -> torch.Tensor:
    # the 8 nibble shifts of a word, made on `device`: a copy from the CPU could not be captured in a CUDA graph
    # (a dense11 row lookup in scale.py's step, 2026-12-05)
    return torch.arange(0, 32, 4, device=device)


def _to_i32(x: torch.Tensor) -> torch.Tensor:
    """int64 values 0 .. 2**32 - 1 as int32 words (two's complement)."""
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


def _u32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int64) & 0xFFFFFFFF


def words_of(codes: torch.Tensor) -> torch.Tensor:
    """int32 [N, R, 3] code words of codes [N, R, 32] (column order, 0..7)."""
    n, r, _ = codes.shape
    c = codes.to(torch.int64).view(n, r, 4, 8)  # [.., x, i]: column 8x + i
    nib = _nib(codes.device)
    words = [((c[:, :, x] | (((c[:, :, 3] >> x) & 1) << 3)) << nib).sum(-1) for x in range(3)]
    return _to_i32(torch.stack(words, -1))


def codes_of(words: torch.Tensor) -> torch.Tensor:
    """int64 codes [N, R, 32] (column order) of code words [N, R, 3] (the inverse of ``words_of``)."""
    n, r, _ = words.shape
    f = (_u32(words)[..., None] >> _nib(words.device)) & 15  # [N, R, 3, 8]: nibble i of word x
    out = torch.empty(n, r, 4, 8, dtype=torch.int64, device=words.device)
    out[:, :, :3] = f & 7
    out[:, :, 3] = ((f[:, :, 0] >> 3) & 1) | (((f[:, :, 1] >> 3) & 1) << 1) | (((f[:, :, 2] >> 3) & 1) << 2)
    return out.view(n, r, RUN)


def _compress8(f: torch.Tensor) -> torch.Tensor:
    # the nibble flags (bits 0, 4, .., 28) of f as bits 0 .. 7
    f = (f | (f >> 3)) & 0x03030303
    f = (f | (f >> 6)) & 0x000F000F
    return (f | (f >> 12)) & 0xFF


def escape_masks(words: torch.Tensor) -> torch.Tensor:
    """int64 [N, R]: each run's escapes (code 7) as a 32-bit mask in column order (bit j: column j),
    from its code words [N, R, 3] with word operations (no [N, R, 32] tensor)."""
    w = _u32(words)
    w0, w1, w2 = w[..., 0], w[..., 1], w[..., 2]
    d = ((w0 >> 3) & 0x11111111) | ((w1 >> 2) & 0x22222222) | ((w2 >> 1) & 0x44444444)
    out = torch.zeros_like(w0)
    for x, v in enumerate((w0, w1, w2, d)):
        out |= _compress8(v & (v >> 1) & (v >> 2) & 0x11111111) << (8 * x)
    return out


def stream_digits(esc: torch.Tensor, total: int) -> torch.Tensor:
    """int64 [total]: the first ``total`` 4-bit digits of the stream ``esc`` (int32 words)."""
    i = torch.arange(total, device=esc.device)
    return (_u32(esc)[i // 8] >> (4 * (i % 8))) & 15


def pack_digits(digit: torch.Tensor) -> torch.Tensor:
    """int32 words of 4-bit digits, 8 a word (nibble i of word w: digit 8w + i)."""
    nwords = (digit.numel() + 7) // 8
    pad = torch.zeros(nwords * 8, dtype=torch.int64, device=digit.device)
    pad[: digit.numel()] = digit
    return _to_i32((pad.view(nwords, 8) << _nib(digit.device)).sum(1))


def ranks(esc_mask: torch.Tensor) -> torch.Tensor:
    """int64 [N, R, 32]: each weight's rank among its run's escapes (escapes only are meaningful)."""
    return esc_mask.to(torch.int64).cumsum(-1) - 1


def from_v1(arrays: dict[str, torch.Tensor], shape: tuple[int, int]) -> dict[str, torch.Tensor]:
    """Version 2's arrays of a checked version-1 matrix (bit-exact: the same weights), on its device:
    the code words rearranged, escapes of rank 8 and up made exceptions."""
    n, k = shape
    kp = arrays["sm"].shape[1]
    r = kp // RUN
    planes = _u32(arrays["code"]).view(n, r, 3)
    bit = torch.arange(RUN, device=planes.device)
    codes = sum(((planes[:, :, p, None] >> bit) & 1) << p for p in range(3))  # [N, R, 32]
    esc = codes == ESCAPE
    total = int(esc.sum())
    digit = stream_digits(arrays["esc"], total)
    over = (ranks(esc) >= CAP)[esc] & (digit != RAW)  # stream order = row-major column order
    etab = torch.cat([arrays["etab"].to(torch.int64), digit.new_zeros(1)])
    flat = torch.nonzero(esc.reshape(-1)).squeeze(1)[over]  # index in [N, Kp]
    new_idx = (flat // kp) * k + flat % kp
    idx = torch.cat([arrays["exc_idx"].to(torch.int64), new_idx])
    exp = torch.cat([arrays["exc_exp"].to(torch.int64), etab[digit[over]]])
    order = torch.argsort(idx)
    out = dict(arrays)
    out["code"] = words_of(codes).view(n, 3 * r)
    out["esc"] = pack_digits(torch.where(over, RAW, digit)) if total else arrays["esc"]
    out["exc_idx"] = idx[order].to(arrays["exc_idx"].dtype)
    out["exc_exp"] = exp[order].to(torch.uint8)
    return out


def check_ranks(esc_mask: torch.Tensor, digit: torch.Tensor) -> None:
    """CorruptError unless every escape of rank 8 or more in its run has digit 15 (``esc_mask``:
    bool [N, R, 32]; ``digit``: the stream's digits in row-major column order)."""
    bad = (ranks(esc_mask) >= CAP)[esc_mask] & (digit != RAW)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise CorruptError(f"dense11 v2 escape {i} of the stream has rank 8 or more in its run but digit "
                           f"{int(digit[i])} (must be 15: an exception)")


def check_stream_ranks(code: torch.Tensor, esc: torch.Tensor, n: int, kp: int, chunk: int = 1 << 22) -> None:
    """``check_ranks`` over a whole matrix on its arrays' device, ``chunk`` weights at once (the GPU
    kernels' preparation; the stream's length was checked against the codes before)."""
    step, first = max(1, chunk // max(1, kp)), 0
    bit = torch.arange(RUN, device=code.device)
    for r in range(0, n, step):
        masks = escape_masks(code[r : r + step].reshape(-1, kp // RUN, 3))
        esc_mask = ((masks[..., None] >> bit) & 1).bool()
        cnt = int(esc_mask.sum())
        i = first + torch.arange(cnt, device=code.device)
        digit = (_u32(esc)[i // 8] >> (4 * (i % 8))) & 15
        check_ranks(esc_mask, digit)
        first += cnt
