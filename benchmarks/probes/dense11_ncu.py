"""dense11 (format version 2) products under Nsight Compute, beside bf16 and fixed12 on one matrix.

Why: the 2026-12-05 step (dense11_step.py) took 1.46x bf16 at M = 1 and 3.9x at M = 16; this shows
where the GEMV's time goes (speed of light, stalls, instruction mix) before the decode is changed.
One 18944 x 3584 random matrix (Qwen2.5-7B's gate/up half), warm-up outside the profiled range:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \\
        --section InstructionStats --section LaunchStats --section Occupancy \\
        python3 benchmarks/probes/dense11_ncu.py --ms 1,16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import glyd  # noqa: E402
from glyd import kernels  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,16")
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    torch.manual_seed(0)
    w = (torch.randn(18944, 3584, device="cuda") * 0.02).to(torch.bfloat16)
    packs = {"fixed12": glyd.pack(w, "fixed12"), "dense11": glyd.pack(w, "dense11")}
    xs = {m: torch.randn(m, 3584, device="cuda").to(torch.bfloat16) for m in ms}
    want = {m: F.linear(xs[m].double(), w.double()) for m in ms}
    for name, p in packs.items():  # warm-up and a check: compiled, plans kept, products right
        for m in ms:
            y = kernels.linear(xs[m], p).double()
            err = ((y - want[m]).norm() / want[m].norm()).item()
            print(f"{name} M={m}: {kernels.choose(xs[m], p)[0].name}, rel err {err:.2e}", flush=True)
            assert err < 5e-3, (name, m, err)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for m in ms:
        F.linear(xs[m], w)
        for p in packs.values():
            kernels.linear(xs[m], p)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
