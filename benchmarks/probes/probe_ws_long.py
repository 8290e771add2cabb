#!/usr/bin/env python3
"""Issue 38 probe: the warp-specialized wgmma tile (``fixed12_wgmma_warpspec``, decoded weights as
wgmma's register A operand) at prompt lengths, with and without ``WsConfig.pipe``, against bf16 and
the H200 table's unpack + cuBLAS, on the merged Qwen2.5-7B matrices.

Why: run 86 (2026-12-01) timed this tile at bm 256 (8 warps, ring 2) at 2.27x / 2.37x bf16 on gate/up
at M = 512 / 2048, and found its warpgroups idle the tensor cores while they decode: each waited
for a step's MMAs before reading the next step. ``pipe`` decodes the next step's first half while
the step's MMAs run (static sm_90 build: no spills, the next slot's shared loads and decode sit
between the step's HGMMAs and its wait). The shared-memory decoder of ``long_fused.py`` reached
1.73-1.84x at M >= 2048; no Nsight profile of this tile at long M exists yet (``--profile``).

Variants (``ws.bBT.sNS[.p]``: BT x rows a tile, a ring of NS, pipe; 128 weight rows and 8 warps,
one program an SM; ``--variants`` picks others: the wgmma tile without the ring, ``wg.b64.nBN.p.wvW``, and unpack +
cuBLAS in chunks of C weight rows, ``long.cC``, with the unpacks overlapped on a second stream, ``long.cC.o``, whose
bits must equal ``long.cC``'s): each output checked against float64 (``probe_long_fused.check``, the buffer
filled with NaN first) and each piped (overlapped) output against its plain twin bit for bit (same MMAs in
the same order). Timing: CUDA graph replays, ratio to bf16 in the same run; a table last.

    PYTHONPATH=src python3 benchmarks/probes/probe_ws_long.py --out $OUT                      # H200
    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \\
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \\
        python3 benchmarks/probes/probe_ws_long.py --profile gate_up:2048:ws.b256.s2.p     # and :bf16
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import glyd  # noqa: E402
from glyd import kernels  # noqa: E402
from glyd.kernels import LongConfig, WgConfig, WsConfig  # noqa: E402
from probe_long_fused import SHAPES, check, make_weights  # noqa: E402

MS = (96, 128, 512, 2048, 4608)
VARIANTS = {f"ws.b{bt}.s{ns}{'.p' if pipe else ''}": WsConfig(bm=bt, bn=128, warps=8, stages=ns, waves=1, pipe=pipe)
            for bt, ns in ((256, 2), (128, 3)) for pipe in (False, True)}
DEFAULT = tuple(VARIANTS)
# the register-operand wgmma tile without the TMA ring (fixed12_wgmma) past its M = 64 tile: its M tiles decode the
# weights again (bm 128, 8 warps, bn 128 took 1.70-5.60x bf16 at M = 65-512 on an H100, 2026-12-05: dropped)
VARIANTS.update({f"wg.b64.n{bn}.p.wv{wv}": WgConfig(bm=64, bn=bn, warps=bn // 16, waves=wv, exc_tile=True, pipe=True)
                 for bn, wv in ((64, 2), (128, 1))})
# unpack + cuBLAS in chunks of weight rows (long.cC), with each chunk's unpack on a second stream beside the GEMM of
# the chunk before it (.o: LongConfig.overlap)
VARIANTS.update({f"long.c{c}{'.o' if o else ''}": LongConfig(chunk=c, overlap=o)
                 for c in (512, 1024, 2048, 4096) for o in (False, True)})


def fns(x, w, p, names=None) -> dict:
    out = {"bf16": lambda o: torch.matmul(x, w.T, out=o), "table": lambda o: o.copy_(kernels.linear(x, p))}
    for name, cfg in VARIANTS.items():
        if names is not None and name not in names:
            continue
        out[name] = (lambda cfg: lambda o: o.copy_(kernels.linear(x, p, None, cfg)))(cfg)
    return out


def run_shape(name, ms, args, gen, t_end) -> list:
    from glyd.timing import cuda_graph_ms

    n, k = SHAPES[name]
    dev = torch.device("cuda")
    w = make_weights(n, k, dev, gen)
    p = glyd.pack(w, "fixed12")
    rows = []
    for m in ms:
        if time.monotonic() > t_end:
            rows.append(dict(shape=name, m=m, skipped="budget"))
            continue
        x = (torch.randn(m, k, device=dev, generator=gen) * 0.5).to(torch.bfloat16)
        ref, twin = x.double() @ w.double().T, F.linear(x, w)
        res, outs = dict(shape=name, m=m), {}
        for v, fn in fns(x, w, p, args.variants).items():
            o = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
            try:
                fn(o)
                torch.cuda.synchronize()
                c = check(o, ref, twin)
                if v.endswith((".p", ".o")) and v[:-2] in outs:  # piped, overlapped: the plain twin's bits
                    c["same_bits"] = torch.equal(o.view(torch.int16), outs[v[:-2]].view(torch.int16))
                    c["ok"] = c["ok"] and c["same_bits"]
                outs[v] = o
                res[v] = dict(ms=cuda_graph_ms(lambda: fn(o), args.replays) if c["ok"] else math.nan, **c)
            except Exception as exc:  # a variant that fails to build or run is reported, the rest go on
                res[v] = dict(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                torch.cuda.synchronize()
        rows.append(res)
        print(json.dumps(res), flush=True)
        del x, ref, twin, outs
    return rows


def profile(spec: str) -> int:
    """One launch of VARIANT on SHAPE at M inside the profiler range, after a warm-up outside it."""
    name, m, v = spec.split(":")
    n, k = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(38)
    w = make_weights(n, k, torch.device("cuda"), gen)
    p = glyd.pack(w, "fixed12")
    x = (torch.randn(int(m), k, device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
    fn, o = fns(x, w, p)[v], torch.empty(int(m), n, dtype=torch.bfloat16, device="cuda")
    fn(o)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn(o)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


def table(rows, names) -> str:
    vs = ["table"] + list(names)
    lines = ["| shape | M | bf16 ms | " + " | ".join(vs) + " |", "|---" * (3 + len(vs)) + "|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['shape']} | {r['m']} | skipped ({r['skipped']}) |")
            continue
        b = r.get("bf16", {}).get("ms", math.nan)
        cells = []
        for v in vs:
            d = r.get(v, {})
            cells.append("error" if "error" in d else f"{d['ms'] / b:.2f}x" if d.get("ok") else
                         f"WRONG (excess {d.get('excess', math.nan):.3g}, bits {d.get('same_bits', '-')})")
        lines.append(f"| {r['shape']} | {r['m']} | {b:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop timing new cells after this")
    ap.add_argument("--profile", default=None, metavar="SHAPE:M:VARIANT", help="one launch for ncu (bf16, "
                    "table or a ws variant)")
    ap.add_argument("--variants", default=",".join(DEFAULT), help="comma-separated: " + ", ".join(VARIANTS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.variants = args.variants.split(",")
    if unknown := sorted(set(args.variants) - set(VARIANTS)):
        raise SystemExit(f"probe_ws_long: unknown variants {unknown} (known: {', '.join(VARIANTS)})")
    if not torch.cuda.is_available():
        raise SystemExit("probe_ws_long: needs a Hopper GPU (the ws tile is Gluon: no interpreter)")
    if args.profile:
        return profile(args.profile)
    gen = torch.Generator(device="cuda").manual_seed(38)
    t_end = time.monotonic() + args.budget_s
    rows = []
    for s in args.shapes.split(","):
        rows += run_shape(s, [int(v) for v in args.ms.split(",")], args, gen, t_end)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "ws_long.json").write_text(json.dumps(rows, indent=1))
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(table(rows, args.variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
