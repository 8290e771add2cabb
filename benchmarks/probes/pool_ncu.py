#!/usr/bin/env python3
"""The static pool's decode attention (kvf12 pages) under Nsight Compute, beside bf16 SDPA (issue 34).

Why: on 2026-12-05 the word-decode kernel (the H200 table's since then) took 1.45-2.28x SDPA's time,
worst at 16K tokens and one sequence (2.28x) and at 4K x 4-16 (1.9-2.0x); the last profile (the byte
decode, 2026-12-04) found 11% occupancy. This profiles one call a case of the table's kernel and of
SDPA (keys and values of the same real pages) after a checked warm-up, so the next change is chosen
from stalls, occupancy and bandwidth rather than guessed. Cases are TOKENSxSEQS; one layer of the
Qwen2.5-7B shape (28 query heads, 4 KV heads, head dim 128, pages of 64), as ``kv.py speed``:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \\
        --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \\
        python3 benchmarks/probes/pool_ncu.py --cases 16384x1,4096x16       # carry .carry (kv.py pool)
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/probes/pool_ncu.py --cases 128x2   # CPU check
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kv import PAGE, QWEN, fill, static_pool  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-2  # kv.py speed's bound against SDPA (relative Frobenius error)


def cases(s: str) -> list[tuple[int, int]]:
    out = []
    for part in s.split(","):
        t, _, b = part.partition("x")
        if not (t.isdigit() and b.isdigit()) or int(t) % PAGE or int(t) <= 0 or int(b) <= 0:
            raise argparse.ArgumentTypeError(f"want TOKENSxSEQS with TOKENS a multiple of {PAGE}, got {part!r}")
        out.append((int(t), int(b)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=cases, default=cases("16384x1,4096x16"))
    ap.add_argument("--pool", default=str(ROOT / ".carry" / "kv_pool.pt"),
                    help="real pages from `python benchmarks/kv.py pool` (Gaussian pages when missing)")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    pages = None
    if Path(args.pool).exists():
        pages = {k: v.to(dev) for k, v in torch.load(args.pool).items()}
    else:
        print(f"no {args.pool}: Gaussian pages", flush=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    kscale = torch.exp(torch.randn(1, QWEN["kv_heads"], 1, QWEN["head_dim"], device=dev, generator=gen))
    runs = []
    for t, b in args.cases:
        k = fill(b, t, None if pages is None else pages["k"], gen, kscale)
        v = fill(b, t, None if pages is None else pages["v"], gen, torch.ones_like(kscale))
        q = torch.randn(b, QWEN["q_heads"], QWEN["head_dim"], device=dev, generator=gen).to(torch.bfloat16)
        pool = static_pool(k, v, None)
        q4 = q[:, :, None, :]
        ref = F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)[:, :, 0].float()
        got = pool.attend(0, q).float()  # warm-up and check: compiled, the table's config, right values
        err = float((got - ref).norm() / ref.norm())
        print(f"T={t} B={b}: pool attention rel err {err:.2e} against SDPA", flush=True)
        if not err <= TOL:
            raise SystemExit(f"T={t} B={b}: relative error {err:.2e} over {TOL}")
        runs.append((q, q4, k, v, pool))
    if dev.type != "cuda":
        print("CPU: checked only (nothing to profile)")
        return
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for q, q4, k, v, pool in runs:  # one call each, in case order: SDPA, then the pool's kernels
        F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)
        pool.attend(0, q)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("profiled: " + ", ".join(f"{t}x{b}" for t, b in args.cases))


if __name__ == "__main__":
    main()
