"""One GPU run that checks the two causes found for h91's ``dot="mma"`` failures (2026-12-05 H100 log
``h91-gpu-kernels.log``) and what the fixes of branch h95-mma-fix rest on. Research: not a test.

1. Layout (garbage at M 16, N 70, K 1100, split 2, version 2): ``_gemv_mma_kernel`` assumes element
   (8 w + g, c) of its [bn / 2, 4] MMA operands sits in lane 4 g + c of warp w; Triton chooses the layout.
   An sm_90 compile of version 2's loads without K's 16-divisibility gives threadsPerWarp [32, 1]. This
   launches the MMA kernel directly (bypassing gemv_v2's version-3-only rule) for both versions at
   K 1100 and 1024 and prints each one's error against float64 and, where wrong, which output rows
   (weight rows mod 16: the MMA's m) and columns (x rows mod 8: its n) are wrong. Expected: version 3
   right at both K; version 2 wrong at K 1100 (every row), right at 1024 (its compile gets the map there).
2. Rows past M (illegal address at 3584 x 18944): the kernel through gemv_v2 at ragged M (9, 17, 33,
   mb 16 / 64) with x at the very end of a fresh allocation, synchronizing after each launch so that a
   fault names its case. Run under ``compute-sanitizer --tool memcheck`` too: h91's kernel read up to
   8 (NT - 1) rows past x (an "Invalid __global__ read" of x32_ptr), the fixed one none.
3. The PTX MMA itself on a known matrix, independent of the decode: every weight one value (power-of-two
   exponents, no escapes) times x = e_j (one-hot columns), so each output names the weight it read.

    PYTHONPATH=src python benchmarks/probes/dense11_mma_gpu_check.py
    PYTHONPATH=src compute-sanitizer --tool memcheck python benchmarks/probes/dense11_mma_gpu_check.py --rows
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests.kernels

from glyd.codec import dense11 as _codec  # noqa: E402
from glyd.kernels.dense11 import gemv_mma as GM  # noqa: E402
from glyd.kernels.dense11 import gemv_v2 as G  # noqa: E402
from glyd.kernels.dense11.decode_v2 import prepare  # noqa: E402


def direct(version: int, x: torch.Tensor, p, split: int, mb: int = 64, warps: int = 4) -> torch.Tensor:
    # _gemv_mma_kernel for either version, with gemv_v2's own grid, split and finalize
    m, k = x.shape
    n = p.shape[0]
    cfg = (G.Dense11V3GemvConfig if version == 3 else G.Dense11V2GemvConfig)(bn=16 * warps, bk=128, warps=warps,
                                                                             dot="mma", mb=mb)
    prep = prepare(p)
    x32 = G._pairs(x)
    assert x32 is not None
    rows = GM.mma_rows(m, mb)
    nbr = _codec.blocks_per_row(k)
    per = triton.cdiv(nbr, max(1, min(split, nbr)))
    split = triton.cdiv(nbr, per)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    dst = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else out
    GM.launch_mma(x, x32, p, prep, None, dst, (triton.cdiv(n, cfg.bn), split, triton.cdiv(m, rows)), per, rows,
                  cfg, version == 3)
    if split > 1:
        from glyd.kernels import _common as C

        C.finalize(dst, None, out)
    torch.cuda.synchronize()
    return out


def layout_check() -> None:
    from tests.kernels.test_dense11_v2_kernels import _weights

    for k in (1100, 1024):
        w = _weights(70, k, seed=16 + 70 + k, kind="crowded")
        x = torch.randn(16, k, generator=torch.Generator().manual_seed(k + 16)).to(torch.bfloat16).cuda()
        ref = torch.nn.functional.linear(x.double(), w.double().cuda())
        for version, pack in ((3, _codec.pack_v3), (2, _codec.pack_v2)):
            got = direct(version, x, pack(w).to("cuda"), split=2).double()
            err = float((got - ref).norm() / ref.norm())
            bad = ((got - ref).abs() > 0.05 * ref.abs().max()).nonzero()
            print(f"layout K {k} v{version}: rel err {err:.2e}, wrong outputs {len(bad)}"
                  + (f"; weight rows mod 16 {sorted(set((bad[:, 1] % 16).tolist()))}, x rows mod 8 "
                     f"{sorted(set((bad[:, 0] % 8).tolist()))}" if len(bad) else ""))


def rows_check() -> None:
    from glyd.kernels.gpu_pack import pack_dense11

    for n, k in ((3584, 18944), (512, 3584)):
        g = torch.Generator(device="cuda").manual_seed(n + k)
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        p3 = pack_dense11(w, version=3)
        for m, mb in ((9, 64), (17, 16), (33, 64), (64, 64)):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)  # fresh: x's end near a segment's
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            G.Dense11V3GemvKernel.launch(x, p3, None, G.Dense11V3GemvConfig(bn=64, bk=128, warps=4, dot="mma", mb=mb),
                                         out)
            torch.cuda.synchronize()
            ref = torch.nn.functional.linear(x.double(), w.double())
            print(f"rows {n}x{k} M {m} mb {mb}: rel err {float((out.double() - ref).norm() / ref.norm()):.2e}")


def onehot_check() -> None:
    # weights ±2^e with e = (16 r + c) % 6 - 3 (6 exponents: few escapes), x = one-hot columns: out[j, r] = w[r, j]
    n, k = 64, 128
    r = torch.arange(n)[:, None]
    c = torch.arange(k)[None, :]
    w = torch.exp2(((16 * r + c) % 6 - 3).float()) * torch.where((r + c) % 3 == 0, -1.0, 1.0)
    w = w.to(torch.bfloat16)
    for version, pack in ((3, _codec.pack_v3), (2, _codec.pack_v2)):
        p = pack(w).to("cuda")
        for j0 in range(0, k, 8):
            x = torch.zeros(8, k, dtype=torch.bfloat16, device="cuda")
            x[torch.arange(8), j0 + torch.arange(8)] = 1.0
            got = direct(version, x, p, split=1).float().cpu()
            want = w[:, j0:j0 + 8].T.float()
            bad = (got != want).nonzero()
            if len(bad):
                print(f"onehot v{version} cols {j0}-{j0 + 7}: {len(bad)} wrong, first (x row, weight row) "
                      f"{bad[:4].tolist()} got {[got[a, b].item() for a, b in bad[:4].tolist()]} want "
                      f"{[want[a, b].item() for a, b in bad[:4].tolist()]}")
                break
        else:
            print(f"onehot v{version}: every output is its weight")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", action="store_true", help="the rows-past-M check only (for compute-sanitizer)")
    a = ap.parse_args()
    if not a.rows:
        onehot_check()
        layout_check()
    rows_check()
