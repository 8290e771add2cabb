"""Kernel benchmark on one GPU (DESIGN.md protocol).

All linears of a Qwen2.5-7B-shaped model (28 layers, distinct random weights per layer, std 0.02,
plus the 152064 x 3584 lm_head), one CUDA graph per decode step, median of >= 20 replays, at
M = 1, 2, 4, 8, 16, 32, 64 (decode) and 65, 128, 256, 512, 1024, 2048, 4608 (prompts), unmerged
(q, k, v, o, gate, up, down) and merged (qkv, o, gate_up, down) shapes; bf16 F.linear (cuBLAS) in
the same run with the same shapes. It first checks bit-exact GPU pack/unpack and the fused linear on
fresh random inputs, then times, then prints a short table last. Packing uses the GPU pack (torch ops).

    python benchmarks/kernels.py --out DIR [--quick] [--layers 28]

Writes DIR/kernels.json (every number), DIR/table.md and DIR/measured_times.json (per-shape M=1
times for glyd.ops.choose_layout: paste its "layout" value as the "layout" section of the GPU's
table, src/glyd/kernels/tables/<GPU>.json, e.g. NVIDIA_H200.json).

The variants name their kernel family's config (``glyd.kernels.GemvConfig``, ``MmaConfig``, ...);
"default" is what ``glyd.kernels.registry`` chooses from the GPU's table. Without a CUDA GPU it
runs as a dry run under ``TRITON_INTERPRET=1``: tiny shapes, every check, nothing timed (times
are NaN).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import glyd
from glyd import kernels
from glyd.kernels import registry
from glyd.timing import cuda_graph_ms

log = logging.getLogger("bench")

H, I, KV, VOCAB, LAYERS = 3584, 18944, 512, 152064, 28
MS = [1, 2, 4, 8, 16, 32, 64, 65, 128, 256, 512, 1024, 2048, 4608]  # decode sizes, then prompts (issue 38)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cpu":  # a dry run of this script on the CPU (TRITON_INTERPRET=1): tiny shapes, nothing timed
    H, I, KV, VOCAB, LAYERS = 128, 256, 64, 256, 1
    MS = [1, 2, 16, 64, 512]
UNMERGED = [("q", H, H), ("k", KV, H), ("v", KV, H), ("o", H, H), ("gate", I, H), ("up", I, H), ("down", H, I)]
MERGED = [("qkv", H + 2 * KV, H), ("o", H, H), ("gate_up", 2 * I, H), ("down", H, I)]


def read_bandwidth() -> float:
    """Streaming-read bandwidth (bytes/s): fp32 sum over a 4 GiB buffer, median of 20."""
    if DEV != "cuda":
        return float("nan")
    x = torch.randn(1 << 30, device="cuda")  # 4 GiB
    for _ in range(3):
        x.sum()
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x.sum()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    bw = x.numel() * 4 / statistics.median(ts)
    del x
    torch.cuda.empty_cache()
    return bw


def graph_time(fn, replays: int = 30) -> float:
    """Median ms of replaying a CUDA graph of ``fn`` (after eager warm-up); NaN in a CPU dry run
    (``fn`` runs once)."""
    if DEV != "cuda":
        fn()
        return float("nan")
    return cuda_graph_ms(fn, replays)


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def build(shapes, layers: int):
    """{name: [(bf16 W, fixed12 Packed, tiered Packed) per layer]} plus the lm_head, all on the GPU."""
    t0 = time.time()
    mats = {}
    for name, n, k in shapes + [("lm_head", VOCAB, H)]:
        reps = 1 if name == "lm_head" else layers
        mats[name] = []
        for _ in range(reps):
            w = (torch.randn(n, k, device=DEV) * 0.02).to(torch.bfloat16)
            mats[name].append((w, glyd.pack(w, "fixed12"), glyd.pack(w, "tiered")))
    sync()
    weights = sum(n * k * (1 if name == "lm_head" else layers) for name, n, k in shapes + [("lm_head", VOCAB, H)])
    log.info("built %d weights in %.1f s (GPU pack, both layouts)", weights, time.time() - t0)
    return mats


def nbytes(mats, which: int) -> int:
    total = 0
    for reps in mats.values():
        for trip in reps:
            obj = trip[which]
            total += obj.numel() * 2 if which == 0 else obj.nbytes
    return total


def check(mats, fails: list, ms=None) -> None:
    """Bit-exact pack/unpack on each first matrix; fused linear vs F.linear on fresh inputs."""
    for name, reps in mats.items():
        w, p12, ptr = reps[0]
        for lay, p in (("fixed12", p12), ("tiered", ptr)):
            if name in ("k", "q", "down"):
                ref = glyd.pack(w.cpu(), lay)
                for a in ref.arrays:
                    x, y = ref.arrays[a], p.arrays[a].cpu()
                    if x.dtype == torch.uint16:
                        x, y = x.view(torch.int16), y.view(torch.int16)
                    if not torch.equal(x, y):
                        fails.append(f"GPU pack {lay} {name} array {a} differs from the CPU codec")
            if not torch.equal(kernels.unpack(p).view(torch.int16), w.view(torch.int16)):
                fails.append(f"unpack {lay} {name} is not bit-exact")
            for m in ms or MS:
                x = torch.randn(m, w.shape[1], device=DEV).to(torch.bfloat16)
                b = torch.randn(w.shape[0], device=DEV).to(torch.bfloat16)
                ref = F.linear(x.double(), w.double(), b.double())
                y = kernels.linear(x, p, b)
                err = ((y.double() - ref).norm() / ref.norm()).item()
                if not err < 5e-3 or not torch.isfinite(y).all():
                    fails.append(f"linear {lay} {name} M={m}: rel err {err:.3g}")
    sync()


def config_for(f, p, x):
    """The config variant ``f`` runs ``p`` with at ``x`` (None: the registry's choice)."""
    c = f(p.layout, x.shape[0])
    return c(p, x) if callable(c) else c


def check_variant(mats, which: int, f, m: int, vname: str, fails: list) -> None:
    """A timed variant against float64 F.linear on fresh inputs, on each shape's first matrix."""
    for name, reps in mats.items():
        w, p = reps[0][0], reps[0][which]
        x = torch.randn(m, w.shape[1], device=DEV).to(torch.bfloat16)
        ref = F.linear(x.double(), w.double())
        y = kernels.linear(x, p, None, config_for(f, p, x))
        err = ((y.double() - ref).norm() / ref.norm()).item()
        if not err < 5e-3 or not torch.isfinite(y).all():
            fails.append(f"variant {vname} {name} M={m}: rel err {err:.3g}")


def step_fn(mats, xs, which: int, cfg=None):
    """One decode step: every linear of every layer, then the lm_head."""
    outs = []

    def run():
        outs.clear()
        for name, reps in mats.items():
            for trip in reps:
                obj = trip[which]
                x = xs[obj.shape[1]]
                if which == 0:
                    outs.append(F.linear(x, obj))
                else:
                    outs.append(kernels.linear(x, obj, None, config_for(cfg, obj, x) if cfg else None))

    return run


def with_fixup(p, x):
    """The registry's config for ``p`` at ``x`` with split-K summed in the kernel (``fixup``); a
    config without that field (wg, ws, long) as chosen."""
    _, cfg = kernels.choose(x, p)
    return dataclasses.replace(cfg, fixup=True) if hasattr(cfg, "fixup") else cfg


# Variants timed besides the defaults: (layout, M) -> a kernel family's config, a function
# (packed, x) -> config for a per-matrix choice, or None (not timed at this M).
def variants():
    from glyd.kernels import GemvConfig, MmaConfig

    Gv, Mma = GemvConfig, MmaConfig
    f12 = lambda lay, m: lay == "fixed12"  # noqa: E731
    f12s = lambda lay, m: f12(lay, m) and m <= 64  # noqa: E731
    bmm = lambda m: max(16, 1 << (m - 1).bit_length())  # noqa: E731
    return {
        # M = 1: the group-major GEMV under the "fma gm ... s1" names of earlier runs (the FMA loops
        # they were timed against, "f12 fma gm bn32 bk512 s3" and "f12 gv old masked loop bm1", and
        # the byte-tile GEMV "f12 byte bn16 g4 s1 wv8" are gone: their last version is in 497582d)
        "f12 fma gm bn32 bk512 s1 wv16": lambda lay, m: Gv(bm=1, bn=32, bk=512, waves=16)
        if f12(lay, m) and m == 1 else None,
        "f12 fma gm bn64 bk256 s1 wv8": lambda lay, m: Gv(bm=1, bn=64, bk=256, waves=8)
        if f12(lay, m) and m == 1 else None,
        "f12 fma gm bn32 bk512 s1 w8 wv8": lambda lay, m: Gv(bm=1, bn=32, bk=512, warps=8, waves=8)
        if f12(lay, m) and m == 1 else None,
        # the group-major GEMV kernel (x as bf16 pairs, prmt decode, unmasked on whole shapes):
        # "f12 gv bmB bnN bkK wvW [pf]", B x rows a program on one decoded tile; pf = register prefetch
        **{f"f12 gv bm{bm} bn{bn} bk{bk} wv{wv}{' pf' if pf else ''}": (
            lambda lay, m, bm=bm, bn=bn, bk=bk, wv=wv, pf=pf, ms=ms: Gv(bm=bm, bn=bn, bk=bk, waves=wv, prefetch=pf)
            if f12(lay, m) and m in ms else None)
           for bm, bn, bk, wv, pf, ms in [
               (1, 32, 512, 4, False, (1,)), (1, 32, 256, 8, False, (1,)), (1, 32, 256, 16, False, (1,)),
               (1, 32, 256, 8, True, (1,)), (1, 64, 256, 8, False, (1,)),
               (2, 32, 256, 8, False, (2, 4)), (2, 32, 256, 8, True, (2,)), (2, 16, 256, 8, False, (2,)),
               (4, 32, 128, 8, False, (4, 8)), (4, 16, 256, 8, False, (4,)),
               (8, 32, 128, 8, False, (8, 16)), (8, 16, 128, 8, False, (8, 16)), (16, 16, 128, 8, False, (16,)),
           ]},
        # mma tile kernel: a few neighbours of its old defaults at M = 2-64
        "f12 mma bn32 g2 s4 wv16": lambda lay, m: Mma(bm=bmm(m), bn=32, g=2, stages=4, waves=16)
        if f12s(lay, m) and 1 < m <= 16 else None,
        "f12 mma bn32 g2 s3 wv8": lambda lay, m: Mma(bm=bmm(m), bn=32, g=2, stages=3, waves=8)
        if f12s(lay, m) and 1 < m <= 16 else None,
        "f12 mma bn64 g2 s3 wv8": lambda lay, m: Mma(bm=bmm(m), bn=64, g=2, stages=3, waves=8)
        if f12s(lay, m) and m > 16 else None,
        # the GEMV with 2 or 4 x rows a program on one decoded tile (static SASS: 9.4 instructions
        # a weight at bm 2 against 7.3 at bm 1; bm 4 spills at bn 32)
        "f12 fma gm bm2 bn32 bk512 wv8": lambda lay, m: Gv(bm=2, bn=32, bk=512, waves=8)
        if f12(lay, m) and 2 <= m <= 4 else None,
        "f12 fma gm bm4 bn16 bk512 wv8": lambda lay, m: Gv(bm=4, bn=16, bk=512, waves=8)
        if f12(lay, m) and m == 4 else None,
        # each matrix's default with split-K summed by each tile's last program (no finalize kernel)
        "f12 fix default": lambda lay, m: with_fixup if f12(lay, m) and m <= 64 else None,
        "f12 fix gm bn32 bk512 s1 wv16": lambda lay, m: Gv(bm=1, bn=32, bk=512, waves=16, fixup=True)
        if f12(lay, m) and m == 1 else None,
        # long prompts (the default unpacks then calls cuBLAS)
        "f12 mma long bn64 bm128 w4": lambda lay, m: Mma(bm=128, bn=64, g=1, stages=3, warps=4)
        if f12(lay, m) and m >= 512 else None,
    }


def unpack_sweep(mats) -> dict:
    """us to unpack one of the 28 gate matrices (18944 x 3584) per layout, fixed12 unpack configs
    and tiered (blocks, warps)."""
    from glyd.kernels import TieredUnpackConfig, UnpackConfig

    reps = mats["gate"]
    out = {}
    for which, lay in ((1, "fixed12"), (2, "tiered")):
        def run(which=which):
            for trip in reps:
                kernels.unpack(trip[which])
        out[lay] = graph_time(run, 20)
    # fixed12: the byte tiles (what padded rows and the chunked long-prompt path use) and a wider
    # flat kernel; the default ("fixed12") is the flat kernel (whole rows as one stream of groups)
    for name, cfg in (("fixed12 bytes", UnpackConfig(flat_groups=0)),
                      ("fixed12 bytes r16 g4 w4", UnpackConfig(flat_groups=0, rows=16, groups=4, warps=4)),
                      ("fixed12 flat 32 groups w4", UnpackConfig(flat_groups=32, flat_warps=4))):
        try:
            ref = reps[0][0].view(torch.int16)
            if not torch.equal(kernels.unpack(reps[0][1], None, cfg).view(torch.int16), ref):
                log.warning("unpack %s is not bit-exact", name)
                continue

            def run(cfg=cfg):
                for trip in reps:
                    kernels.unpack(trip[1], None, cfg)
            out[name] = graph_time(run, 20)
        except Exception as exc:
            log.warning("unpack %s failed: %s", name, exc)
    for bb, warps in ((1, 1), (2, 1), (4, 4), (8, 8)):
        def run(bb=bb, warps=warps):
            for trip in reps:
                kernels.unpack(trip[2], None, TieredUnpackConfig(blocks=bb, warps=warps))
        try:
            out[f"tiered bb{bb} w{warps}"] = graph_time(run, 20)
        except Exception as exc:
            log.warning("tiered unpack bb=%d warps=%d failed: %s", bb, warps, exc)
    return {k: round(v / len(reps) * 1e3, 1) for k, v in out.items()}  # us a matrix


def bench_mode(mode: str, shapes, layers: int, bw: float, quick: bool, res: dict, fails: list,
               ms=None, only=None, tiered=True, extras=True) -> None:
    mats = build(shapes, layers)
    b16, b12, btr = nbytes(mats, 0), nbytes(mats, 1), nbytes(mats, 2)
    res[mode] = {"bytes": {"bf16": b16, "fixed12": b12, "tiered": btr}, "rows": {}}
    log.info("%s: bf16 %.2f GB, fixed12 %.2f GB (%.2f bits), tiered %.2f GB (%.2f bits)", mode, b16 / 1e9,
             b12 / 1e9, 16 * b12 / b16, btr / 1e9, 16 * btr / b16)
    check(mats, fails, ms)
    log.info("%s: checks done, %d failures so far", mode, len(fails))
    var = {k: v for k, v in variants().items() if not only or any(o in k for o in only)}
    for m in ms or MS:
        xs = {k: torch.randn(m, k, device=DEV).to(torch.bfloat16) for k in (H, I)}
        row = {"bf16": graph_time(step_fn(mats, xs, 0))}
        row["fixed12"] = graph_time(step_fn(mats, xs, 1))
        row["tiered"] = graph_time(step_fn(mats, xs, 2)) if tiered else float("nan")
        if not quick and mode == "unmerged":
            for vname, f in var.items():
                if f("fixed12", m) is not None or f("tiered", m) is not None:
                    which = 1 if vname.startswith("f12") else 2
                    try:
                        check_variant(mats, which, f, m, vname, fails)
                        row[vname] = graph_time(step_fn(mats, xs, which, f))
                    except Exception as exc:  # a variant that fails to compile is reported, not fatal
                        row[vname] = None
                        log.warning("variant %s at M=%d failed: %s", vname, m, exc)
        res[mode]["rows"][m] = row
        log.info("%s M=%d %s", mode, m, {k: (round(v, 3) if v else v) for k, v in row.items()})
    if mode == "unmerged" and extras:
        res["per_shape"] = per_shape(mats)
        if not quick:
            res["unpack_us"] = unpack_sweep(mats)
    del mats
    torch.cuda.empty_cache()


def per_shape(mats) -> dict:
    """M=1 time (us) of each distinct matrix shape, over its layers' copies (no L2 reuse)."""
    out = {}
    x = {k: torch.randn(1, k, device=DEV).to(torch.bfloat16) for k in (H, I)}
    for name, reps in mats.items():
        n, k = reps[0][0].shape
        t = {}
        for which, lay in ((0, "bf16"), (1, "fixed12"), (2, "tiered")):
            def run(which=which):
                for trip in reps:
                    obj = trip[which]
                    if which == 0:
                        F.linear(x[k], obj)
                    else:
                        kernels.linear(x[k], obj)
            t[lay] = round(1e3 * graph_time(run) / len(reps), 2)
        out[f"{n}x{k}"] = t
    return out


def table(res: dict, bw: float) -> str:
    lines = []
    for mode in ("unmerged", "merged"):
        if mode not in res:
            continue
        by = res[mode]["bytes"]
        lines.append(f"\n{mode}: bf16 {by['bf16'] / 1e9:.2f} GB, fixed12 {by['fixed12'] / 1e9:.2f} GB "
                     f"({16 * by['fixed12'] / by['bf16']:.2f} bits), tiered {by['tiered'] / 1e9:.2f} GB "
                     f"({16 * by['tiered'] / by['bf16']:.2f} bits); read bandwidth {bw / 1e12:.2f} TB/s\n")
        lines.append("| M | bf16 ms | fixed12 ms | ratio | floor frac | tiered ms | ratio | floor frac |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for m, row in res[mode]["rows"].items():
            cells = [str(m), f"{row['bf16']:.3f}"]
            for lay in ("fixed12", "tiered"):
                floor = by[lay] / bw * 1e3
                cells += [f"{row[lay]:.3f}", f"{row[lay] / row['bf16']:.3f}", f"{floor / row[lay]:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
        m0 = min(res[mode]["rows"], key=int)  # the smallest M timed (--ms may leave out M = 1)
        lines.append(f"(bf16 floor frac at M={m0}: {by['bf16'] / bw * 1e3 / res[mode]['rows'][m0]['bf16']:.2f})")
    return "\n".join(lines)



def _write(path: str, text: str) -> None:
    """``text`` into ``path`` under a temporary name, then renamed: a run cut short (the device's time
    limit) leaves the last complete file, never a truncated one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--quick", action="store_true", help="defaults only (no variant sweep)")
    ap.add_argument("--modes", default="unmerged,merged")
    ap.add_argument("--ms", default=None, help="comma-separated M values (default: the protocol's)")
    ap.add_argument("--only", default=None, help="comma-separated substrings: time only variants named so")
    ap.add_argument("--no-tiered", action="store_true", help="skip timing the tiered step")
    ap.add_argument("--no-extras", action="store_true", help="skip the per-shape and unpack sweeps")
    args = ap.parse_args(argv)
    ms = [int(v) for v in args.ms.split(",")] if args.ms else None
    only = args.only.split(",") if args.only else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    os.makedirs(args.out, exist_ok=True)
    import triton

    dev = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (interpreter dry run)"
    res = {"device": dev, "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d"), "layers": args.layers}
    bw = read_bandwidth()
    res["read_bw"] = bw
    log.info("%s, torch %s, triton %s, read bandwidth %.2f TB/s", dev, torch.__version__, triton.__version__, bw / 1e12)
    fails: list[str] = []
    modes = {"unmerged": UNMERGED, "merged": MERGED}
    for mode in args.modes.split(","):
        bench_mode(mode, modes[mode], args.layers, bw, args.quick, res, fails, ms, only,
                   not args.no_tiered, not args.no_extras)
        _write(os.path.join(args.out, "kernels.json"), json.dumps(res, indent=1))
    res["failures"] = fails
    _write(os.path.join(args.out, "kernels.json"), json.dumps(res, indent=1))
    table_path = f"src/glyd/kernels/tables/{registry.table_file(dev).name}"
    if "per_shape" in res:
        _write(os.path.join(args.out, "measured_times.json"), json.dumps(
            {"about": f"paste the value of 'layout' as the 'layout' section of {table_path} (the table "
                      "of this GPU; glyd.ops.choose_layout reads it for layout='auto')",
             "table": table_path, "layout": {"date": res["date"], "m": 1, "shapes": res["per_shape"]}}, indent=1))
    # Variant sweep (unmerged), then the per-shape times, then the main table last.
    if "unmerged" in res:
        for m, row in res["unmerged"]["rows"].items():
            extra = {k: round(v / row["bf16"], 3) for k, v in row.items() if k not in ("bf16", "fixed12", "tiered") and v}
            if extra:
                print(f"variants M={m} (ratio to bf16): {extra}")
        print("unpack, us a 18944x3584 matrix:", res.get("unpack_us"))
        for shape, t in res.get("per_shape", {}).items():
            print(f"per-matrix M=1 {shape}: " + ", ".join(f"{k} {v} us" for k, v in t.items()))
        if "per_shape" in res:
            print(f"per-matrix M=1 times: paste the 'layout' of {os.path.join(args.out, 'measured_times.json')} "
                  f"as the 'layout' section of {table_path}")
    tab = table(res, bw)
    _write(os.path.join(args.out, "table.md"), tab + "\n")
    print("\nFAILURES:\n" + "\n".join(fails) if fails else "\nall correctness checks passed")
    print(f"{dev}  torch {torch.__version__}  triton {triton.__version__}  {res['date']}")
    print(tab)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
