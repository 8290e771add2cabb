"""Ran against commit 497582d (check that commit out to run it).
Probe: long prompts with the unpack of the next linear overlapped with the current GEMM.

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

import contextlib

from glyd import kernels
from glyd.kernels import fixed12
from glyd.timing import cuda_graph_ms

H, I, KV = 3584, 18944, 512
LAYER = [(H, H), (KV, H), (KV, H), (H, H), (I, H), (I, H), (H, I)]


@contextlib.contextmanager
def carveout(sms):
    """cuBLAS matmuls inside use ``sms`` fewer SMs (torch's experimental setting; None: all)."""
    if not sms:
        yield
        return
    old = torch._C._get_sm_carveout_experimental()
    torch._C._set_sm_carveout_experimental(sms)
    try:
        yield
    finally:
        torch._C._set_sm_carveout_experimental(old)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="512,2048")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--carveouts", default="8,16,32", help="SMs kept from cuBLAS for the side stream's unpack")
    ap.add_argument("--chunks", default="2,4", help="row chunks of one linear, unpacked one ahead")
    args = ap.parse_args(argv)
    shapes = LAYER * args.layers
    ws = [(torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16) for n, k in shapes]
    ps = [kernels.pack(w, "fixed12") for w in ws]
    big = max(n * k for n, k in shapes)
    bufs = [torch.empty(big, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    side = torch.cuda.Stream()
    carves = [int(v) for v in args.carveouts.split(",") if v]
    chunk_counts = [int(v) for v in args.chunks.split(",") if v]
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

        def overlapped(carve=None):
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
                with carveout(carve):
                    outs_ovl.append(F.linear(xs[p.shape[1]], w))
                done_gemm[i].record(main)
            main.wait_stream(side)

        def chunked(nc, carve=None):
            # within each linear: rows in nc chunks, chunk c + 1 unpacked on the side stream while
            # cuBLAS multiplies chunk c (a linear's first chunk is not hidden)
            outs_ovl.clear()
            main = torch.cuda.current_stream()
            for p in ps:
                n, k = p.shape
                x = xs[k]
                out = torch.empty(x.shape[0], n, dtype=torch.bfloat16, device="cuda")
                step = -(-n // nc)
                bounds = [(r, min(n, r + step)) for r in range(0, n, step)]
                ready = [torch.cuda.Event() for _ in bounds]
                used = [torch.cuda.Event() for _ in bounds]
                side.wait_stream(main)
                prep = fixed12.prepare(p)

                def unpack_chunk(c):
                    r0, r1 = bounds[c]
                    with torch.cuda.stream(side):
                        if c >= 2:
                            side.wait_event(used[c - 2])
                        fixed12._unpack_rows(p, prep, r0, r1, bufs[c % 2][:(r1 - r0) * k].view(r1 - r0, k))
                        ready[c].record(side)

                unpack_chunk(0)
                for c, (r0, r1) in enumerate(bounds):
                    if c + 1 < len(bounds):
                        unpack_chunk(c + 1)
                    main.wait_event(ready[c])
                    with carveout(carve):
                        torch.mm(x, bufs[c % 2][:(r1 - r0) * k].view(r1 - r0, k).t(), out=out[:, r0:r1])
                    used[c].record(main)
                main.wait_stream(side)
                outs_ovl.append(out)

        variants = [("unpack ahead on a side stream", overlapped)]
        for cv in carves:
            variants.append((f"unpack ahead, cuBLAS {cv} SMs fewer", lambda cv=cv: overlapped(cv)))
        for nc in chunk_counts:
            for cv in [None] + carves:
                name = f"{nc} chunks a linear" + (f", cuBLAS {cv} SMs fewer" if cv else "")
                variants.append((name, lambda nc=nc, cv=cv: chunked(nc, cv)))
        seq()
        ref = [o.clone() for o in outs_seq]
        t16 = cuda_graph_ms(bf16, 20)
        for name, fn in [("bf16 F.linear", bf16), ("unpack only", unpack_only), ("unpack then GEMM", seq)] + variants:
            t = t16 if fn is bf16 else cuda_graph_ms(fn, 20)
            if fn not in (bf16, unpack_only, seq):
                # every overlapped variant must give the sequential chain's bits (cuBLAS with fewer
                # SMs may pick another kernel: then the difference is reported, not hidden)
                fn()
                torch.cuda.synchronize()
                if not all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(ref, outs_ovl)):
                    name += " (bits differ from sequential)"
            rows.append((m, name, t, t / t16))
    print(f"\n{args.layers} Qwen2.5-7B-shaped layers, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'M':>5}  {'variant':<62} {'ms':>9} {'x bf16':>7}")
    for m, name, t, r in rows:
        print(f"{m:>5}  {name:<62} {t:>9.3f} {r:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
