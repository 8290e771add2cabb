"""The Gluon decode kernel's group decode (``glyd.kv._gluon``) in torch, for
:func:`glyd.kv.pages.unpack_blocks_swar`: its 32-bit word helpers (the kernel's names without the
underscore), then its stages (``_dir``, ``_stage1`` to ``_stage4``), step for step.

Words are held in int64 tensors, one 32-bit word each, so that shifts and sums past bit 31 do not
overflow; results are masked back to 32 bits where the kernel's uint32 arithmetic wraps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def words(x: torch.Tensor) -> torch.Tensor:
    """The little-endian 32-bit words of ``x``'s last axis (uint8, 4 bytes a word)."""
    b = x.reshape(*x.shape[:-1], -1, 4).to(torch.int64)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def popc32(x: torch.Tensor) -> torch.Tensor:
    """The set bits of each 32-bit word."""
    return sum((x >> i) & 1 for i in range(32))


def prmt(a: torch.Tensor, b: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """PTX ``prmt.b32`` (default mode) on int64 tensors holding 32-bit words: result byte ``i`` is byte
    ``sel``'s nibble ``i`` (bits 0-2) of ``b:a``, or that byte's sign replicated when the nibble's bit 3
    is set."""
    src = torch.stack([(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)], -1)
    out = torch.zeros_like(a)
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = torch.gather(src, -1, (nib & 7)[..., None])[..., 0]
        byte = torch.where((nib & 8) != 0, torch.where((byte & 0x80) != 0, 0xFF, 0), byte)
        out |= byte << (8 * i)
    return out


def shr64(lo: torch.Tensor, hi: torch.Tensor, sh: torch.Tensor) -> torch.Tensor:
    """``(hi:lo) >> sh``, low 32 bits (the funnel shift)."""
    return ((lo | (hi << 32)) >> sh) & 0xFFFFFFFF


def window(tailw: torch.Tensor, sw: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per group, 16 consecutive 2-bit digits of a tier from digit ``b`` on (the tier starts at word
    ``sw`` of the tail words ``tailw``), from two aligned word loads."""
    i = (sw[:, None] + (b >> 4)).clamp(0, tailw.numel() - 2)
    return shr64(tailw[i], tailw[i + 1], 2 * (b & 15))


def expand(win: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Each group's first ``popc(m)`` 2-bit digits of ``win``, placed in order at ``m``'s set bits,
    every other value 0: one escaped value a step, as many steps as the most escapes a group has."""
    out = torch.zeros_like(m)
    for _ in range(int(popc32(m).max())):
        low = m & ((-m) & 0xFFFFFFFF)
        out = out + (win & 3) * low
        win = win >> 2
        m = m ^ low
    return out


def part1by1(x: torch.Tensor) -> torch.Tensor:
    """Bit ``p`` of a 16-bit ``x`` to bit ``2p``."""
    x = (x | (x << 8)) & 0x00FF00FF
    x = (x | (x << 4)) & 0x0F0F0F0F
    x = (x | (x << 2)) & 0x33333333
    return (x | (x << 1)) & 0x55555555


def excl_nibbles(x: torch.Tensor) -> torch.Tensor:
    """The exclusive prefix sum over the 8 nibbles of ``x``."""
    x = (x << 4) & 0xFFFFFFFF
    x = (x + (x << 4)) & 0xFFFFFFFF
    x = (x + (x << 8)) & 0xFFFFFFFF
    return (x + (x << 16)) & 0xFFFFFFFF


def raw_wide(w4: list[torch.Tensor], sel: torch.Tensor) -> torch.Tensor:
    """The raw bytes of 4 values by their ranks (``sel``: 4 rank nibbles, up to 15) from the group's 16
    raw bytes ``w4`` (4 words): two 8-byte halves, chosen by each nibble's bit 3."""
    hb = (sel >> 3) & 0x1111  # ranks 8-15 from the window's second half
    hb = (hb & 0x11) | ((hb & 0x1100) << 8)
    hb = ((hb | (hb << 4)) & 0x01010101) * 0xFF
    s7 = sel & 0x7777
    return (prmt(w4[0], w4[1], s7) & ~hb) | (prmt(w4[2], w4[3], s7) & hb)


def quad(k: int, se: torch.Tensor, so: torch.Tensor, t: torch.Tensor, sm: torch.Tensor, rq: torch.Tensor,
         fsel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Values ``4k .. 4k+3`` of every group in byte lanes: the exponent ``top - offset`` (offsets as
    nibbles of ``se``, ``so``; ``top`` bytes in ``t``), or the raw exponent (``rq``'s byte) where
    ``fsel``'s nibble picks it, then the bf16 words with the sign/mantissa bytes ``sm``. Returns 2
    words of bf16 pairs (values 4k, 4k+1 and 4k+2, 4k+3)."""
    a = prmt(se, so, torch.full_like(se, k | ((4 + k) << 4) | (k << 8) | ((4 + k) << 12)))
    off = (a & 0x00000F0F) | ((a >> 4) & 0x0F0F0000)
    e = (((t | 0x80808080) - off) ^ (~t & 0x80808080)) & 0xFFFFFFFF  # bytewise t - off
    e = prmt(e, rq, fsel)
    hi = (sm & 0x80808080) | ((e >> 1) & 0x7F7F7F7F)
    lo = (sm & 0x7F7F7F7F) | ((e << 7) & 0x80808080)
    return prmt(lo, hi, torch.full_like(lo, 0x5140)), prmt(lo, hi, torch.full_like(lo, 0x7362))


# ----------------------------------------------------------------------------- the kernel's stages


def column_bases(tail: torch.Tensor, mt: torch.Tensor, rows: int, cw: int, dev: torch.device) -> Callable:
    """The kernel's ``_dir``: each block's column directory, as ``base(cnt, k) [n, g]``, each group's
    first escape to tier ``k + 2`` (its column's start plus the escapes ``cnt`` of the groups above)."""
    n = mt.shape[0]
    tb = tail.to(torch.int64)
    if tb.numel() < 2:
        tb = torch.zeros(2, dtype=torch.int64, device=dev)
    di = (mt[:, :1] + torch.arange(3 * cw, device=dev) * 2).clamp_max(tb.numel() - 2)
    direc = (tb[di] | (tb[di + 1] << 8)).reshape(n, 1, cw, 3)

    def base(cnt: torch.Tensor, k: int) -> torch.Tensor:
        c = cnt.reshape(n, rows, cw)
        return (direc[..., k] + torch.cumsum(c, 1) - c).reshape(n, rows * cw)

    return base


def escape_tiers(w1: torch.Tensor, tailw: torch.Tensor, mt: torch.Tensor, base: Callable, db: int) -> tuple:
    """The kernel's ``_stage1`` to ``_stage3`` for every group: the tier-2 and tier-3 digits put back at
    their values (``w2``, ``w3``), the raw flags ``r`` and the tail byte ``b4`` of its first raw exponent
    (``db``: the bytes of a block's column directory)."""
    # _stage1: tier-1 escape flags, the tier-2 windows
    m1 = w1 & (w1 >> 1) & 0x55555555  # bit 2j: value j escaped tier 1
    s2w = (mt[:, 0] + db) // 4
    win2 = window(tailw, s2w, base(popc32(m1), 0))
    # _stage2: tier-2 digits at their values, tier-2 escape flags, the tier-3 windows
    w2 = expand(win2, m1)
    m2 = w2 & (w2 >> 1) & 0x55555555
    s3w = s2w + (mt[:, 1] + 15) // 16
    win3 = window(tailw, s3w, base(popc32(m2), 1))
    # _stage3: tier-3 digits at their values, raw flags, each group's first raw exponent
    w3 = expand(win3, m2)
    r = w3 & (w3 >> 1) & 0x55555555  # raw (tier-4) values
    s4 = 4 * (s3w + (mt[:, 2] + 15) // 16)
    b4 = s4[:, None] + base(popc32(r), 2)
    return w2, w3, r, b4


def group_values(
    w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, r: torch.Tensor, b4: torch.Tensor,
    tailw: torch.Tensor, smw: torch.Tensor, tw: torch.Tensor,
) -> torch.Tensor:
    """The kernel's ``_stage4``: the 16 values of every group as bf16 bit patterns ``[n, g, 16]``."""
    # offsets top - exponent as nibbles: even values in se, odd in so (9: raw)
    mk = 0x33333333
    se = (w1 & mk) + (w2 & mk) + (w3 & mk)
    so = ((w1 >> 2) & mk) + ((w2 >> 2) & mk) + ((w3 >> 2) & mk)
    # raw flags a nibble a value: prmt selectors that take a raw value's byte from the raw word, and
    # each value's rank among the group's raw values
    plo, phi = part1by1(r & 0xFFFF), part1by1(r >> 16)
    fsel = [(plo << 2) | 0x32103210, (phi << 2) | 0x32103210]
    ranks = [excl_nibbles(plo), (excl_nibbles(phi) + popc32(r & 0xFFFF) * 0x11111111) & 0xFFFFFFFF]
    last = tailw.numel() - 1
    wi = (b4 >> 2).clamp(0, last - 4)
    x = [tailw[wi + i] for i in range(5)]
    w4 = [shr64(x[i], x[i + 1], (b4 & 3) * 8) for i in range(4)]  # the group's first 16 raw bytes
    out = []
    for k in range(4):
        rq = raw_wide(w4, ranks[k // 2] >> (16 * (k % 2)))
        for pair in quad(k, se, so, tw[..., k], smw[..., k], rq, fsel[k // 2] >> (16 * (k % 2))):
            out += [pair & 0xFFFF, pair >> 16]
    return torch.stack(out, -1)
