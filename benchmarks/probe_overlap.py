"""Probe: long prompts with the unpack of the next linear overlapped with the current GEMM.

Unpack + cuBLAS (the long-prompt path) runs the unpack and the GEMM one after the other, so a
step pays both. The GEMM at M >= 512 is compute-bound and the unpack memory-bound; this probe
measures whether they overlap when the next matrix is unpacked on a side stream into the other of
two scratch buffers while cuBLAS multiplies the current one. Qwen2.5-7B-shaped layers (q, k, v, o,
gate, up, down; random weights), one CUDA graph over all of them, median of replays, against bf16
F.linear on the same shapes in the same run; the outputs of the overlapped chain are checked bit
for bit against the sequential one.

    PYTHONPATH=src python benchmarks/probe_overlap.py --ms 512,2048 --layers 4
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from glyd import kernels
from glyd.timing import cuda_graph_ms

H, I, KV = 3584, 18944, 512
LAYER = [(H, H), (KV, H), (KV, H), (H, H), (I, H), (I, H), (H, I)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="512,2048")
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args(argv)
    shapes = LAYER * args.layers
    ws = [(torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16) for n, k in shapes]
    ps = [kernels.pack(w, "fixed12") for w in ws]
    big = max(n * k for n, k in shapes)
    bufs = [torch.empty(big, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    side = torch.cuda.Stream()
    rows = []
    for m in (int(v) for v in args.ms.split(",")):
        xs = {k: torch.randn(m, k, device="cuda").to(torch.bfloat16) for k in (H, I)}
        outs_seq, outs_ovl = [], []

        def bf16():
            return [F.linear(xs[w.shape[1]], w) for w in ws]

        def unpack_only():
            for p in ps:
                kernels.unpack(p, bufs[0][:p.shape[0] * p.shape[1]].view(p.shape))

        def seq():
            outs_seq.clear()
            for p in ps:
                w = kernels.unpack(p, bufs[0][:p.shape[0] * p.shape[1]].view(p.shape))
                outs_seq.append(F.linear(xs[p.shape[1]], w))

        def overlapped():
            # unpack i + 1 on the side stream into the other buffer while the GEMM i runs; buffer j
            # is rewritten only after the GEMM that read it (two back) has finished
            outs_ovl.clear()
            main = torch.cuda.current_stream()
            done_unpack = [torch.cuda.Event() for _ in ps]
            done_gemm = [torch.cuda.Event() for _ in ps]
            side.wait_stream(main)

            def launch_unpack(i):
                with torch.cuda.stream(side):
                    if i >= 2:
                        side.wait_event(done_gemm[i - 2])
                    p = ps[i]
                    kernels.unpack(p, bufs[i % 2][:p.shape[0] * p.shape[1]].view(p.shape))
                    done_unpack[i].record(side)

            launch_unpack(0)
            for i, p in enumerate(ps):
                if i + 1 < len(ps):
                    launch_unpack(i + 1)
                main.wait_event(done_unpack[i])
                w = bufs[i % 2][:p.shape[0] * p.shape[1]].view(p.shape)
                outs_ovl.append(F.linear(xs[p.shape[1]], w))
                done_gemm[i].record(main)
            main.wait_stream(side)

        seq()
        overlapped()
        torch.cuda.synchronize()
        same = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(outs_seq, outs_ovl))
        t16 = cuda_graph_ms(bf16, 20)
        for name, fn in (("bf16 F.linear", bf16), ("unpack only", unpack_only), ("unpack then GEMM", seq),
                         ("unpack ahead on a side stream", overlapped)):
            t = t16 if fn is bf16 else cuda_graph_ms(fn, 20)
            rows.append((m, name, t, t / t16))
        rows.append((m, f"overlapped outputs equal sequential: {same}", float("nan"), float("nan")))
    print(f"\n{args.layers} Qwen2.5-7B-shaped layers, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'M':>5}  {'variant':<40} {'ms':>9} {'x bf16':>7}")
    for m, name, t, r in rows:
        print(f"{m:>5}  {name:<40} {t:>9.3f} {r:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
