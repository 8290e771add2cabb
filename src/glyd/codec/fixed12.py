"""``fixed12``: 12 bits a weight plus rare exceptions, fixed rate, cheapest decode.

A bf16 word is ``hi:lo`` with ``hi = sign<<7 | exponent>>1`` and ``lo = exponent&1 <<7 | mantissa``.
``lo`` is kept raw. ``hi`` becomes a 4-bit code ``sign<<3 | (exponent>>1) - base`` where the 8
values ``base .. base+7`` of ``exponent>>1`` (16 exponents) are the window that covers the most
weights of the matrix. A weight outside the window is an exception: its code holds the sign and
offset 0, and its true ``hi`` byte sits in a sorted side list that the GPU applies as a sparse
correction, off the hot path. Byte-level layout: ``docs/format.md``.
"""

from __future__ import annotations

import numpy as np
import torch

from glyd.codec.layout import Layout, register
from glyd.codec.packed import Packed, as_bf16_matrix, check_no_extra, expect_array, round_up
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
    hist = torch.bincount(hi7.reshape(-1), minlength=128)
    window = hist.unfold(0, WINDOW, 1).sum(dim=1)  # window[b] = hist[b:b+8].sum(), b = 0..120
    return int(torch.argmax(window))  # first maximum: the lowest base on ties


def pack(w: torch.Tensor) -> Packed:
    # numpy on uint8 planes: several times faster than torch's CPU kernels for these byte ops.
    w = as_bf16_matrix(w)
    n, k = w.shape
    kp = padded_cols(k)
    b = w.view(torch.uint8).numpy().reshape(n, k, 2)  # little-endian: [..., 0] = lo, [..., 1] = hi
    hi = np.ascontiguousarray(b[..., 1])
    hi7 = hi & np.uint8(0x7F)
    base = choose_base(torch.from_numpy(hi7))
    off = hi7 - np.uint8(base)  # wraps below base: one unsigned compare tests the window
    inside = off < WINDOW
    codes = np.zeros((n, kp), dtype=np.uint8)  # padding: code 0, lo 0 (finite; kernels mask x)
    codes[:, :k] = (off * inside) | ((hi >> 4) & np.uint8(8))
    lo_plane = np.zeros((n, kp), dtype=np.uint8)
    lo_plane[:, :k] = b[..., 0]
    g = codes.reshape(n, kp // GROUP, 2, HALF)
    code_plane = (g[:, :, 0, :] | (g[:, :, 1, :] << 4)).reshape(n, kp // 2)
    exc = np.flatnonzero(~inside)  # ascending flat index r*k + c
    idx_dtype = np.int32 if n * k < 2**31 else np.int64
    arrays = {
        "lo": torch.from_numpy(lo_plane),
        "code": torch.from_numpy(code_plane),
        "base": torch.tensor([base], dtype=torch.uint8),
        "exc_idx": torch.from_numpy(exc.astype(idx_dtype)),
        "exc_hi": torch.from_numpy(hi.reshape(-1)[exc]),
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
    check_padding(p)


def check_padding(p: Packed) -> None:
    """CorruptError unless the padding columns ``K .. Kp - 1`` hold code 0 and ``lo`` 0 (a matrix, or
    packed experts' stacked rows; torch on the arrays' device). The codec drops them, but a fused
    kernel multiplies them by x's zeros: code 7 with lo 0x80 at base 120 is exponent 255, and 0 * inf is NaN."""
    k = p.shape[-1]
    lo, code = p.arrays["lo"], p.arrays["code"]
    kp = lo.shape[1]
    if lo.shape[0] == 0 or k == kp:
        return
    last = code[:, kp // 2 - HALF :]  # the last group's code bytes (Kp - K < 64)
    codes = torch.cat([last & 15, last >> 4], dim=1)  # its 64 codes in column order
    if bool(codes[:, k - kp + GROUP :].any() | lo[:, k:].any()):
        raise CorruptError(f"fixed12 padding columns {k}..{kp - 1} must hold code 0 and lo 0 (a damaged or crafted "
                           f"'code' or 'lo')")


def _pair_table(base: int) -> np.ndarray:
    """uint16 for each code byte: the hi bytes of its two weights (low nibble's in the low byte)."""
    c = np.arange(256, dtype=np.uint16)
    lo_n, hi_n = c & 15, c >> 4
    return (((lo_n & 8) << 4) | ((lo_n & 7) + base)) | ((((hi_n & 8) << 4) | ((hi_n & 7) + base)) << 8)


def unpack(p: Packed) -> torch.Tensor:
    _check_values(p)
    n, k = p.shape
    a = p.arrays
    kp = a["lo"].shape[1]
    base = int(a["base"][0])
    # One table lookup a code byte gives both hi bytes it holds: [n, groups, 32 pairs (j, j+32)].
    hi_pairs = _pair_table(base)[a["code"].numpy()].view(np.uint8).reshape(n, kp // GROUP, HALF, 2)
    out = np.empty((n, kp // GROUP, 2, HALF, 2), dtype=np.uint8)
    out[..., 0] = a["lo"].numpy().reshape(n, kp // GROUP, 2, HALF)
    out[..., 1] = hi_pairs.transpose(0, 1, 3, 2)
    bits = torch.from_numpy(out.reshape(n, kp, 2)[:, :k].copy() if kp != k else out.reshape(n, kp, 2))
    flat = bits.view(n * k, 2)
    if a["exc_idx"].numel():
        flat[a["exc_idx"].to(torch.int64), 1] = a["exc_hi"]
    return bits.view(torch.bfloat16).reshape(n, k)


LAYOUT = register(Layout(
    name=NAME, arrays=ARRAYS, pack=pack, unpack=unpack, check_arrays=check_arrays, padded_cols=padded_cols,
    padded_array="lo", about="12 bits a weight plus rare exceptions, the fastest to decode",
    # 12 bits plus the exceptions (about 0.1% of real weights, at 40 bits each): what glyd fit plans with
    bits=12.05,
    rows="glyd.ops.rows:rows_fixed12",
    device_pack="glyd.kernels.gpu_pack:pack_fixed12",
    unpack_kernel="glyd.kernels.fixed12.unpack:unpack",
    prepare_kernel="glyd.kernels.fixed12.exceptions:prepare",
    kernels={
        "fixed12_gemv": "glyd.kernels.fixed12.gemv:GemvKernel",
        "fixed12_word_dot": "glyd.kernels.fixed12.word_dot:TcKernel",
        "fixed12_operand_dot": "glyd.kernels.fixed12.operand_dot:MmaKernel",
        "fixed12_byte_dot": "glyd.kernels.fixed12.byte_dot:TileKernel",
        "fixed12_mma_v2": "glyd.kernels.fixed12.mma_v2:GluonKernel",
        "fixed12_wgmma": "glyd.kernels.fixed12.wgmma:WgKernel",
        "fixed12_wgmma_warpspec": "glyd.kernels.fixed12.wgmma_warpspec:WsKernel",
        "fixed12_unpack_cublas": "glyd.kernels.fixed12.unpack_cublas:LongKernel",
        "fixed12_experts_gemv": "glyd.kernels.fixed12.experts:ExpertsGemvKernel",
        "fixed12_experts_mma": "glyd.kernels.fixed12.experts_mma:ExpertsMmaKernel",
    },
))
