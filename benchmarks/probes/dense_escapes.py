#!/usr/bin/env python3
"""Issue 35, step 3: escape schemes for the ``nibswar``/``niblut`` arrangements whose cost does not
depend on the busiest run's escape count (reference codecs, torch, any device; sizes on the CPU).

The H200 (2026-12-04) said the escape pass, not the code arrangement, is what keeps the dense
layout's GEMV at 2.2-2.5x bf16: its rounds run as often as a tile's busiest run has escapes, each a
chain of dependent loads. The schemes here keep every bit of ``dense11``'s information (the 3-bit
codes mark the escapes, a 4-bit digit each, in a stream ranked by position) and change where the
digits lie and what a kernel reads to find them:

- ``win`` (escape "windows"): digits in column order within a run (dense11's own stream, with the
  ``nibswar``/``niblut`` code words), and a second offset array ``esc_sub`` (one int32 a
  1024-column block: the escapes before columns 256, 512 and 768 of the block, 10 bits each), so a
  256-column step knows its rows' first ranks from two loads, with no count carried from the step
  before. A run reads one 64-bit window of the stream (two words at its rank) and looks its first 8
  digits up in the escape table once (``prmt``); each lane word of 4 weights then patches its
  escapes with its ranks (a multiply-add of its flags) as a selector: 4 ``prmt`` a lane word, no
  loop, no per-weight load. A run with more than 8 escapes (about 1 in 70,000 at 4.4%) sets bit 15
  of its block's ``esc_off`` (free: a super block's offsets need 15 bits), and only such blocks run
  a pass of rounds for ranks 8 and up.
- ``winc``: ``win`` without ``esc_sub`` (dense11's size to the bit): a step's first ranks are
  carried from the step before inside each 1024-column block (four steps of 256).
- ``wincx``: ``winc`` with no rounds at all: an escape of rank 8 or more in its run keeps its place
  in the stream with digit 15 and joins the exception list (flat index and exponent, 40 bits; the
  kernels leave it at exponent 0 and the exception pass patches it, as any digit-15 weight). No flag.

    PYTHONPATH=src python benchmarks/probes/dense_escapes.py          # bits a weight, round trips

The kernels: ``dense_escape_kernels.py``; the timing: ``probe_dense_decode.py`` (variants
``niblut+win/...``, ``nibswar+win/...``, ``niblut+winc/...``, ``niblut+wincx/...``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import dense_candidates as DC  # noqa: E402

SCHEMES = ("win", "winc", "wincx")
LAYOUTS = ("nibswar+win", "niblut+win", "niblut+winc", "niblut+wincx")
SUB = 256  # columns a sub-block: the GEMV's step, whose first ranks ``esc_sub`` gives
CAP = 8  # escapes a run's window patches; a run with more flags its block (bit 15 of esc_off)
BIG = 0x8000


def split(name: str) -> tuple[str, str]:
    """(arrangement, scheme) of a layout name ``arrangement+scheme``."""
    lay, _, scheme = name.partition("+")
    if lay not in ("nibswar", "niblut") or scheme not in SCHEMES:
        raise ValueError(f"unknown escape layout {name!r}; choose one of {', '.join(LAYOUTS)}")
    return lay, scheme


def pack(w: torch.Tensor, name: str) -> dict[str, torch.Tensor]:
    """The arrays of ``w`` (bf16 [N, K]) in escape layout ``name`` (``split``): dense11's arrays with
    the code words in the arrangement's order, bit 15 of ``esc_off`` set on blocks holding a run of
    more than ``CAP`` escapes, and (``win``) ``esc_sub``."""
    lay, scheme = split(name)
    n, k = w.shape
    a = DC.pack(w, "planes")  # dense11's arrays: digits in column order
    runs = a["sm"].shape[1] // DC.RUN
    cols = DC.codes_of(a["code"].view(n, runs, 3), "planes")  # [N, R, 32] in column order
    perm = torch.tensor(DC.perm(lay), dtype=torch.int64, device=w.device)
    a["code"] = DC.words_of(cols[:, :, perm], lay).view(n, 3 * runs)
    nbr = DC.D.blocks_per_row(k)
    rpb = DC.BLOCK // DC.RUN  # runs a block
    per_run = torch.zeros(n, nbr * rpb, dtype=torch.int64, device=w.device)
    per_run[:, :runs] = (cols == DC.D.ESCAPE).sum(-1)
    big = (per_run.view(n * nbr, rpb) > CAP).any(1)
    off = a["esc_off"].view(torch.int16).to(torch.int64) & 0xFFFF
    if off.numel() and int(off.max()) >= BIG:
        raise ValueError("esc_off needs bit 15 (a super block of more than 32767 escapes)")
    off = off | torch.where(big, BIG, 0)
    if scheme == "wincx":  # ranks 8 and up: digit 15 and an exception each; no flag, no rounds
        return _overflow_as_exceptions(a, cols, w)
    a["esc_off"] = torch.where(off >= BIG, off - 2**16, off).to(torch.int16).view(torch.uint16)
    if scheme == "win":
        sub = per_run.view(n * nbr, DC.BLOCK // SUB, SUB // DC.RUN).sum(-1).cumsum(-1)[:, :-1]  # [nblk, 3] <= 768
        word = sub[:, 0] | (sub[:, 1] << 10) | (sub[:, 2] << 20)
        a["esc_sub"] = word.to(torch.int32)
    return a


def _overflow_as_exceptions(a: dict[str, torch.Tensor], cols: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    # the escapes of rank 8 and up in their run get digit 15 in the stream (which keeps every rank)
    # and join the exception list (flat index, true exponent)
    n, k = w.shape
    esc = cols == DC.D.ESCAPE  # [N, R, 32], column order = the stream's
    over = (esc & (esc.cumsum(-1) > CAP)).reshape(-1)[esc.reshape(-1)]  # a flag a digit, stream order
    dev = w.device
    nd = int(esc.sum())
    i = torch.arange(nd, device=dev)
    words = a["esc"].to(torch.int64) & 0xFFFFFFFF
    dig = (words[i // 8] >> (4 * (i % 8))) & 15
    over = over & (dig != DC.D.RAW)  # one that is an exception already stays listed once
    dig = torch.where(over, torch.full_like(dig, DC.D.RAW), dig)
    pad = torch.zeros(words.numel() * 8, dtype=torch.int64, device=dev)
    pad[:nd] = dig
    a["esc"] = DC._to_i32((pad.view(-1, 8) << (4 * torch.arange(8, device=dev))).sum(1))
    flat = torch.nonzero(esc.reshape(-1)).squeeze(1)[over]  # index in [N, Kp]
    kp = a["sm"].shape[1]
    row, col = flat // kp, flat % kp
    new = row * k + col
    idx = torch.cat([a["exc_idx"].to(torch.int64), new])
    order = torch.argsort(idx)
    exp = (w.view(torch.int16).to(torch.int64) >> 7) & 0xFF
    vals = torch.cat([a["exc_exp"].to(torch.int64), exp[row, col]])
    if torch.unique(idx).numel() != idx.numel():
        raise AssertionError("an exception listed twice: the GEMV's exception pass would add it twice")
    a["exc_idx"] = idx[order].to(a["exc_idx"].dtype)
    a["exc_exp"] = vals[order].to(torch.uint8)
    return a


def to_planes(a: dict[str, torch.Tensor], shape: tuple[int, int], name: str) -> dict[str, torch.Tensor]:
    """The same matrix as ``dense_candidates``' ``planes`` arrays (dense11's), for its reference decode."""
    lay, _ = split(name)
    n = shape[0]
    runs = a["sm"].shape[1] // DC.RUN
    cp = DC.codes_of(a["code"].view(n, runs, 3), lay)  # mask-bit order of lay
    cols = torch.empty_like(cp)
    cols[:, :, torch.tensor(DC.perm(lay), dtype=torch.int64, device=cp.device)] = cp
    out = {x: t for x, t in a.items() if x in DC.D.ARRAYS}
    out["code"] = DC.words_of(cols, "planes").view(n, 3 * runs)
    out["esc_off"] = (a["esc_off"].view(torch.int16) & 0x7FFF).view(torch.uint16)
    return out


def bits(a: dict[str, torch.Tensor], shape: tuple[int, int], name: str, **opts) -> torch.Tensor:
    """int16 [N, K]: the bf16 bits the arrays give (``opts``: ``dense_candidates.exponents``')."""
    return DC.bits(to_planes(a, shape, name), shape, "planes", **opts)


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import platform

    import numpy as np

    import glyd
    from probe_dense_decode import make_matrix
    from realweights import sources

    torch.set_num_threads(1)
    srcs = {"normal(0, 0.02) 4096 x 4096 (probe's: + 128 outliers)": {"w": make_matrix(4096, 4096, "cpu", "normal")},
            "whisper-like 4096 x 4096 (probe's)": {"w": make_matrix(4096, 4096, "cpu", "whisper")}}
    srcs.update(sources())
    print(f"glyd {glyd.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
          f"python {platform.python_version()}, {platform.machine()}")
    print("\n| weights | weights (M) | dense11 | " + " | ".join(LAYOUTS)
          + " | blocks flagged (> 8 a run) | escapes made exceptions (wincx) | round trips |")
    print("|---" * (6 + len(LAYOUTS)) + "|")
    for src, mats in srcs.items():
        numel = sum(m.numel() for m in mats.values())
        tot = dict.fromkeys(("dense11", *LAYOUTS), 0)
        checked = flagged = blocks = moved = 0
        for w in mats.values():
            tot["dense11"] += 8 * DC.D.pack_v1(w).nbytes  # format version 1 (version 2 is niblut+wincx)
            for name in LAYOUTS:
                a = pack(w, name)
                if name == "niblut+win":
                    flagged += int(((a["esc_off"].view(torch.int16).to(torch.int32) & 0xFFFF) >= BIG).sum())
                    blocks += a["esc_off"].numel()
                if name == "niblut+wincx":
                    moved += a["exc_idx"].numel() - DC.D.pack_v1(w).arrays["exc_idx"].numel()
                if not torch.equal(bits(a, tuple(w.shape), name), w.view(torch.int16)):
                    raise SystemExit(f"{name}: round trip of a {tuple(w.shape)} matrix of {src} failed")
                tot[name] += 8 * DC.nbytes(a)
                checked += 1
        cells = " | ".join(f"{tot[x] / numel:.3f}" for x in ("dense11", *LAYOUTS))
        print(f"| {src} | {numel / 1e6:.2f} | {cells} | {flagged} of {blocks} | {moved} | {checked} bit-exact |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
