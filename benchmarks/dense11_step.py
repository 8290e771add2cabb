"""dense11 beside bf16 and fixed12: the merged decode step of a Qwen2.5-7B-shaped model, one GPU.

All linears of 28 layers with q|k|v and gate|up merged (qkv 4608 x 3584, o 3584 x 3584, gate_up
37888 x 3584, down 3584 x 18944; distinct random weights per layer, std 0.02) plus the 152064 x 3584
lm_head; one CUDA graph a step, median of 30 replays (``glyd.timing.cuda_graph_ms``), at M = 1, 16,
32, 64; bf16 ``F.linear`` (cuBLAS) in the same run with the same shapes. ``dense11`` runs what the
registry picks from the GPU's table (format version 3 since 2026-12-05, ``glyd.pack``'s:
``dense11_v3_gemv`` up to M = 64, its tile decoded once for 16, 32 or 64 x rows; unpack + cuBLAS
above), as ``dense11 gemv`` the version-3 fused
GEMV with its default tile (bn 16, bk 256, 4 warps) at every M, and as ``dense11 v1`` the
registry's choice for the same weights packed in format version 1 (bit planes: the kernels timed on
2026-12-03, for the before/after in one run). Before timing: the GPU pack equals the CPU codec on
the first qkv, o and down matrix (both versions), the unpack is bit-exact, every product is within
5e-3 (relative norm) of float64 ``F.linear``.

    python benchmarks/dense11_step.py [--out DIR] [--layers 28] [--ms 1,16,32,64] [--dot tile|tile_wx|lanes]
        [--mb 64] [--gemv bn=32,bk=128,prefetch=1 ...] [--wg bm=64 ...] [--long unpack=wg ...] [--no-v1]

``--dot`` picks the M >= 2 product form of ``dense11 gemv`` (``Dense11V3GemvConfig.dot``; the
registry's ``dense11`` keeps the table's, the default ``tile``), ``--mb`` its most x rows a decode
(16: M = 17-64 decode each tile 2-4 times, as before 2026-12-05). ``--gemv SPEC`` (repeatable) times
the version-3 GEMV with ``Dense11V3GemvConfig(**SPEC)`` as a column of its own, ``gemv SPEC``, in
place of ``dense11 gemv``; ``--wg SPEC`` (repeatable, a Hopper GPU) the wgmma tile (``dense11_wgmma``) with
``Dense11WgConfig(**SPEC)`` as ``wg SPEC``; ``--long SPEC`` (repeatable) unpack + cuBLAS with
``Dense11LongConfig(**SPEC)`` as ``long SPEC`` (``unpack=wg``: the wgmma tile's decode, Hopper); ``--no-v1`` leaves
version 1 out (the slowest column). The JSON records the
registry's choice for each shape and M (``choice``).

Without a CUDA GPU it is a dry run under ``TRITON_INTERPRET=1``: tiny shapes, every check, times
NaN (about 3.5 minutes on 2 CPU cores with ``--ms 1,32``). Prints a markdown table; ``--out`` also
gets dense11_step.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import glyd
from glyd import kernels
from glyd.codec.dense11 import pack_v1
from glyd.kernels import Dense11V3GemvConfig
from glyd.kernels.gpu_pack import pack_dense11_v1
from glyd.timing import cuda_graph_ms

DEV = "cuda" if torch.cuda.is_available() else "cpu"
H, I, KV, VOCAB, LAYERS = 3584, 18944, 512, 152064, 28
if DEV == "cpu":  # the dry run: tiny shapes (K > 1024 somewhere: K splits and several blocks a row)
    H, I, KV, VOCAB, LAYERS = 64, 1056, 32, 128, 1
SHAPES = [("qkv", H + 2 * KV, H), ("o", H, H), ("gate_up", 2 * I, H), ("down", H, I)]
VARIANTS = ("bf16", "fixed12", "dense11", "dense11 gemv", "dense11 v1")
#: the index in a layer's tuple (bf16 W, fixed12, dense11 v3, dense11 v1) each variant multiplies
WHICH = {"bf16": 0, "fixed12": 1, "dense11": 2, "dense11 gemv": 2, "dense11 v1": 3}


def _which(variant: str) -> int:
    return 2 if variant.startswith(("gemv ", "wg ", "long ")) else WHICH[variant]


def gemv_spec(spec: str) -> Dense11V3GemvConfig:
    """``Dense11V3GemvConfig`` of ``"bn=32,bk=128,prefetch=1,dot=tile"`` (ints, ``prefetch`` 0/1, or 2 for
    ``prefetch_depth=2`` with it, ``x_prefetch`` 0/1, ``dot`` a name).

    >>> gemv_spec("bn=32,prefetch=1")  # doctest: +NORMALIZE_WHITESPACE
    Dense11V3GemvConfig(bn=32, bk=256, mb=64, split=0, warps=4, dot='tile', prefetch=True, prefetch_depth=1,
                        x_prefetch=False)
    >>> gemv_spec("bn=64,bk=128,dot=mma,prefetch=2,mb=16").prefetch_depth
    2
    """
    kw: dict = {}
    for part in filter(None, spec.split(",")):
        key, _, val = part.partition("=")
        if key == "prefetch":
            kw[key] = val in ("1", "2", "true", "True")
            if val == "2":
                kw["prefetch_depth"] = 2
        elif key == "x_prefetch":
            kw[key] = val in ("1", "true", "True")
        elif key == "dot":
            kw[key] = val
        else:
            kw[key] = int(val)
    return Dense11V3GemvConfig(**kw)


FLAGS = ("prefetch", "pipe", "ahead", "after_mma", "fixup", "wave_split", "xperm")  # wg_spec's 0/1 fields


def wg_spec(spec: str):
    """``Dense11WgConfig`` of ``"bm=32,split=2,prefetch=0"`` (ints, ``stages`` among them; ``prefetch``, ``pipe``,
    ``ahead``, ``after_mma``, ``fixup``, ``wave_split`` and ``xperm`` 0/1): the wgmma tile (``dense11_wgmma``, Hopper
    only).

    >>> wg_spec("bm=32,prefetch=0").bm, wg_spec("bm=128,stages=3,xperm=1").xperm
    (32, True)
    """
    from glyd.kernels import Dense11WgConfig

    kw: dict = {}
    for part in filter(None, spec.split(",")):
        key, _, val = part.partition("=")
        kw[key] = val in ("1", "true", "True") if key in FLAGS else int(val)
    return Dense11WgConfig(**kw)


def long_spec(spec: str):
    """``Dense11LongConfig`` of ``"unpack=wg"`` (unpack + cuBLAS, its unpack named: ``triton`` or ``wg``).

    >>> long_spec("unpack=wg").unpack, long_spec("").unpack
    ('wg', 'triton')
    """
    from glyd.kernels import Dense11LongConfig

    return Dense11LongConfig(**dict(part.partition("=")[::2] for part in filter(None, spec.split(","))))


def build(layers: int, exc: float = 0.0) -> dict:
    """{name: [(bf16 W, fixed12, dense11 v3, dense11 v1) per layer]} with the lm_head, packed on the device;
    ``exc``: that share of each matrix's weights set to 1e-30, outside both layouts' windows (real weights have
    0.01-0.13% outside fixed12's; normal ones about 0.008%)."""
    mats = {}
    for name, n, k in SHAPES + [("lm_head", VOCAB, H)]:
        mats[name] = []
        for _ in range(1 if name == "lm_head" else layers):
            w = (torch.randn(n, k, device=DEV) * 0.02).to(torch.bfloat16)
            if exc:
                w.view(-1)[torch.randint(0, w.numel(), (int(w.numel() * exc),), device=DEV)] = torch.tensor(
                    1e-30, device=DEV).to(torch.bfloat16)
            v1 = pack_dense11_v1(w) if DEV == "cuda" else pack_v1(w)
            mats[name].append((w, glyd.pack(w, "fixed12"), glyd.pack(w, "dense11"), v1))
    return mats


def check(mats: dict, ms: list[int], gemvs: dict, v1: bool) -> list[str]:
    """Failures of the GPU pack, the unpack and every variant's product (``gemvs``: label -> config)."""
    fails = []
    for name, reps in mats.items():
        w, p12, p11, p1 = reps[0]
        if name in ("qkv", "o", "down"):  # the CPU codec is slow on the largest matrices
            for ref, got in ((glyd.pack(w.cpu(), "dense11"), p11), (pack_v1(w.cpu()), p1))[:2 if v1 else 1]:
                for a, t in ref.arrays.items():
                    if t.numpy().tobytes() != got.arrays[a].cpu().numpy().tobytes():
                        fails.append(f"GPU pack dense11 v{ref.version} {name} array {a} differs from the CPU codec")
        for p in (p11, p1)[:2 if v1 else 1]:
            if not torch.equal(kernels.unpack(p).view(torch.int16), w.view(torch.int16)):
                fails.append(f"unpack dense11 v{p.version} {name} is not bit-exact")
        for m in ms:
            x = torch.randn(m, w.shape[1], device=DEV).to(torch.bfloat16)
            want = F.linear(x.double(), w.double())
            runs = [("fixed12", p12, None), ("dense11", p11, None)] + [(g, p11, c) for g, c in gemvs.items()]
            for label, p, c in runs + ([("dense11 v1", p1, None)] if v1 else []):
                try:
                    y = kernels.linear(x, p, None, c)
                except Exception as exc:  # a column that does not build is left out, not the run
                    fails.append(f"{label} {name} M={m}: {type(exc).__name__}: {str(exc)[-300:]}")
                    continue
                err = ((y.double() - want).norm() / want.norm()).item()
                if not err < 5e-3 or not torch.isfinite(y).all():
                    fails.append(f"{label} {name} M={m}: rel err {err:.3g}")
    return fails


def failed_columns(fails: list[str], gemvs: dict) -> set[str] | None:
    """The config columns (``gemvs``' labels) that ``check`` failed, or None where anything else failed (the pack,
    the unpack, fixed12 or the registry's dense11: then nothing is timed).

    >>> failed_columns(["wg bm=64,xperm=1 qkv M=16: rel err 1"], {"wg bm=64": 0, "wg bm=64,xperm=1": 0})
    {'wg bm=64,xperm=1'}
    >>> failed_columns(["dense11 qkv M=16: rel err 1"], {"wg bm=64": 0}) is None
    True
    """
    bad = {g for g in gemvs if any(f.startswith(g + " ") for f in fails)}
    return bad if all(f.startswith(tuple(g + " " for g in bad)) for f in fails) else None


def step(mats: dict, xs: dict, variant: str, cfg: Dense11V3GemvConfig | None):
    which = _which(variant)

    def run():
        for reps in mats.values():
            for trip in reps:
                obj = trip[which]
                x = xs[obj.shape[1]]
                F.linear(x, obj) if which == 0 else kernels.linear(x, obj, None, cfg)

    return run


def choices(mats: dict, ms: list[int]) -> dict:
    """{M: {shape: the registry's kernel and config for dense11 v3}}."""
    out = {}
    for m in ms:
        for name, reps in mats.items():
            p = reps[0][2]
            kern, cfg = kernels.choose(torch.empty(m, p.shape[1], dtype=torch.bfloat16, device=DEV), p)
            try:  # the fields that differ from the family's defaults
                diff = {k: v for k, v in dataclasses.asdict(cfg).items() if getattr(type(cfg)(), k) != v}
            except TypeError:
                diff = cfg
            out.setdefault(str(m), {})[name] = f"{kern.name} {diff or ''}".strip()
    return out


def table(res: dict, variants: list[str]) -> str:
    """The markdown table: ms of every variant, then each against bf16."""
    lines = ["| M | " + " | ".join(f"{v} ms" for v in variants) + " | "
             + " | ".join(f"{v} / bf16" for v in variants[1:]) + " |", "|---" * (2 * len(variants)) + "|"]
    for m, row in res["ms"].items():
        lines.append(f"| {m} | " + " | ".join(f"{row[v]:.3f}" for v in variants) + " | "
                     + " | ".join(f"{row[v] / row['bf16']:.3f}x" for v in variants[1:]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--ms", default="1,16,32,64")
    ap.add_argument("--dot", default="tile", choices=("tile", "tile_wx", "lanes"))
    ap.add_argument("--mb", type=int, default=64, choices=(16, 32, 64))
    ap.add_argument("--gemv", action="append", default=[], metavar="SPEC",
                    help="a version-2 GEMV config as its own column, e.g. bn=32,bk=128,prefetch=1 (repeatable)")
    ap.add_argument("--wg", action="append", default=[], metavar="SPEC",
                    help="the dense11 wgmma tile (Hopper) with this config as its own column, e.g. bm=64 (repeatable)")
    ap.add_argument("--long", action="append", default=[], metavar="SPEC",
                    help="unpack + cuBLAS with this config as its own column, e.g. unpack=wg (repeatable)")
    ap.add_argument("--no-v1", action="store_true", help="leave format version 1 out")
    ap.add_argument("--exc", type=float, default=0.0, help="this share of the weights set to 1e-30 (exceptions of "
                    "fixed12 and dense11; real weights: 0.01-0.13%%)")
    args = ap.parse_args(argv)
    gemvs = {f"gemv {g}": gemv_spec(g) for g in args.gemv} or {"dense11 gemv": Dense11V3GemvConfig(dot=args.dot, mb=args.mb)}
    if DEV == "cuda":  # the wgmma tile runs on a Hopper GPU only: no dry run of it
        gemvs.update({f"wg {g}": wg_spec(g) for g in args.wg})
    gemvs.update({f"long {g}": long_spec(g) for g in args.long})
    variants = ["bf16", "fixed12", "dense11", *gemvs] + ([] if args.no_v1 else ["dense11 v1"])
    ms = [int(m) for m in args.ms.split(",")]
    t0 = time.time()
    mats = build(args.layers, args.exc)
    for reps in mats.values():  # the derived per-matrix data (host syncs) before any graph capture
        for _, *packs in reps:
            for p in packs:
                kernels.prepare(p)
    built = time.time() - t0
    fails = check(mats, ms, gemvs, not args.no_v1)
    bad = failed_columns(fails, gemvs)
    if fails:
        print("\n".join(f"FAIL {f}" for f in fails), flush=True)
        if bad is None:
            return 1  # the pack, the unpack or the registry's choice: nothing is timed
        # a config column that failed is left out (never timed); the others are timed, and the run still fails
        variants = [v for v in variants if v not in bad]
        gemvs = {g: c for g, c in gemvs.items() if g not in bad}
        print(f"left out (failed their check): {', '.join(sorted(bad))}", flush=True)
    sizes = {v: sum((t[0].numel() * 2 if v == "bf16" else t[WHICH[v]].nbytes) for r in mats.values()
                    for t in r) for v in ("bf16", "fixed12", "dense11", "dense11 v1")}
    res = {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (dry run)", "torch": torch.__version__,
           "glyd": glyd.__version__, "dot": args.dot, "mb": args.mb, "gemv": {g: str(c) for g, c in gemvs.items()},
           "layers": args.layers, "shapes": [[n, k] for _, n, k in SHAPES + [("lm_head", VOCAB, H)]], "exc_share": args.exc, "build_s": round(built, 1), "bytes": sizes, "choice": choices(mats, ms), "ms": {}}
    if DEV == "cuda":  # bf16's step once, untimed, first: the first M's bf16 ran 16% slow (2026-12-07, h100-34)
        xs = {k: torch.randn(ms[0], k, device=DEV).to(torch.bfloat16) for k in {k for _, _, k in SHAPES} | {H}}
        cuda_graph_ms(step(mats, xs, "bf16", None), 30)
    for m in ms:
        xs = {k: torch.randn(m, k, device=DEV).to(torch.bfloat16) for k in {k for _, _, k in SHAPES} | {H}}
        for v in variants:
            fn = step(mats, xs, v, gemvs.get(v))
            if DEV == "cuda":
                res["ms"].setdefault(str(m), {})[v] = cuda_graph_ms(fn, 30)
            else:
                fn()
                res["ms"].setdefault(str(m), {})[v] = float("nan")
        row = res["ms"][str(m)]  # each M as it is timed: a call cut short keeps the rows it finished
        print(f"M={m}: " + ", ".join(f"{v} {row[v] / row['bf16']:.3f}x" for v in variants), flush=True)
        _save(res, args.out)
    print(f"{res['device']}, torch {res['torch']}, glyd {res['glyd']}, {args.layers} layers (merged), built in {built:.0f} s; "
          + "; ".join(f"{g}: {c}" for g, c in res["gemv"].items()))
    print("weight bytes vs bf16: " + ", ".join(f"{v} {sizes[v] / sizes['bf16']:.4f}"
                                               for v in ("fixed12", "dense11", "dense11 v1")))
    print("registry's choice: " + "; ".join(f"M={m} " + ", ".join(f"{k} {c}" for k, c in row.items())
                                            for m, row in res["choice"].items()))
    print("\n" + table(res, variants))
    res["failed_columns"] = sorted(bad or ())
    _save(res, args.out)
    return 1 if fails else 0


def _save(res: dict, out: str | None) -> None:
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "dense11_step.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
