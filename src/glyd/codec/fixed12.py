"""``fixed12``: 12 bits a weight plus rare exceptions, fixed rate, cheapest decode.

A bf16 word is ``hi:lo`` with ``hi = sign<<7 | exponent>>1`` and ``lo = exponent&1 <<7 | mantissa``.
``lo`` is kept raw. ``hi`` becomes a 4-bit code ``sign<<3 | (exponent>>1) - base`` where the 8
values ``base .. base+7`` of ``exponent>>1`` (16 exponents) are the window that covers the most
weights of the matrix. A weight outside the window is an exception: its code holds the sign and
offset 0, and its true ``hi`` byte sits in a sorted side list that the GPU applies as a sparse
correction, off the hot path. Byte-level layout: ``docs/format.md``.
"""

from __future__ import annotations

import torch

from glyd.codec.packed import Packed, as_bf16_matrix, u16_to_bf16, check_no_extra, expect_array, round_up
from glyd.errors import CorruptError, FormatError

NAME = "fixed12"
#: K is padded to a multiple of this; the code plane pairs weight j with weight j+32 of each group.
GROUP = 64
HALF = GROUP // 2
WINDOW = 8
MAX_BASE = 127 - (WINDOW - 1)
ARRAYS = ("lo", "code", "base", "exc_idx", "exc_hi")


def padded_cols(k: int) -> int:
    return round_up(k, GROUP)


def choose_base(hi7: torch.Tensor) -> int:
    """The window start ``b`` that maximises the weights with ``b <= exponent>>1 < b+8``."""
    if hi7.numel() == 0:
        return 0
    hist = torch.bincount(hi7.reshape(-1).to(torch.int64), minlength=128)
    window = hist.unfold(0, WINDOW, 1).sum(dim=1)  # window[b] = hist[b:b+8].sum(), b = 0..120
    return int(torch.argmax(window))  # first maximum: the lowest base on ties


def pack(w: torch.Tensor) -> Packed:
    w = as_bf16_matrix(w)
    n, k = w.shape
    kp = padded_cols(k)
    bits = w.view(torch.int16).to(torch.int32) & 0xFFFF
    hi = bits >> 8
    hi7 = hi & 0x7F
    base = choose_base(hi7)
    off = hi7 - base
    inside = (off >= 0) & (off < WINDOW)
    code = ((hi >> 4) & 0x8) | torch.where(inside, off, torch.zeros_like(off))

    lo_plane = torch.zeros(n, kp, dtype=torch.uint8)
    lo_plane[:, :k] = (bits & 0xFF).to(torch.uint8)
    codes = torch.zeros(n, kp, dtype=torch.uint8)  # padding: code 0, lo 0 (finite; kernels mask x)
    codes[:, :k] = code.to(torch.uint8)
    g = codes.view(n, kp // GROUP, 2, HALF)
    code_plane = (g[:, :, 0, :] | (g[:, :, 1, :] << 4)).reshape(n, kp // 2)

    exc = torch.nonzero(~inside.reshape(-1)).reshape(-1)  # ascending flat index r*k + c
    idx_dtype = torch.int32 if n * k < 2**31 else torch.int64
    arrays = {
        "lo": lo_plane,
        "code": code_plane.contiguous(),
        "base": torch.tensor([base], dtype=torch.uint8),
        "exc_idx": exc.to(idx_dtype),
        "exc_hi": hi.reshape(-1)[exc].to(torch.uint8),
    }
    return Packed(NAME, (n, k), arrays)


def check_arrays(shape: tuple[int, int], arrays: dict[str, torch.Tensor]) -> None:
    n, k = shape
    kp = padded_cols(k)
    check_no_extra(arrays, ARRAYS, NAME)
    expect_array(arrays, "lo", torch.uint8, (n, kp))
    expect_array(arrays, "code", torch.uint8, (n, kp // 2))
    expect_array(arrays, "base", torch.uint8, (1,))
    idx = expect_array(arrays, "exc_idx", (torch.int32, torch.int64), None)
    hi = expect_array(arrays, "exc_hi", torch.uint8, None)
    if idx.dim() != 1 or hi.dim() != 1 or idx.numel() != hi.numel():
        raise FormatError(f"exc_idx {tuple(idx.shape)} and exc_hi {tuple(hi.shape)} must be 1-D of one length")
    if idx.numel() > n * k:
        raise FormatError(f"{idx.numel()} exceptions for a {n}x{k} matrix")


def _check_values(p: Packed) -> None:
    # Value checks need the data (a device sync on the GPU), so they run on unpack, not on construction.
    n, k = p.shape
    base = int(p.arrays["base"][0])
    if base > MAX_BASE:
        raise CorruptError(f"fixed12 base {base} is out of range 0..{MAX_BASE}")
    idx = p.arrays["exc_idx"]
    if idx.numel():
        if int(idx.min()) < 0 or int(idx.max()) >= n * k:
            raise CorruptError(f"exc_idx holds indices outside the {n}x{k} matrix")
        if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):
            raise CorruptError("exc_idx is not strictly increasing")


def unpack(p: Packed) -> torch.Tensor:
    _check_values(p)
    n, k = p.shape
    a = p.arrays
    base = int(a["base"][0])
    kp = a["lo"].shape[1]
    cp = a["code"].view(n, kp // GROUP, 1, HALF)
    codes = torch.cat([cp & 0xF, cp >> 4], dim=2).reshape(n, kp)[:, :k].to(torch.int32)
    hi = ((codes & 0x8) << 4) | ((codes & 0x7) + base)
    bits = (hi << 8) | a["lo"][:, :k].to(torch.int32)
    if a["exc_idx"].numel():
        flat = bits.reshape(-1)
        idx = a["exc_idx"].to(torch.int64)
        flat[idx] = (flat[idx] & 0xFF) | (a["exc_hi"].to(torch.int32) << 8)
    return u16_to_bf16(bits).reshape(n, k)
