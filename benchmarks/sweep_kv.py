"""Sweep of the static pool's decode attention (kvf12, ``glyd.kv._triton_fixed``) on this GPU, and the kernel
table rows it picks: for each number of sequences, the launch config that is fastest against bf16 SDPA over the
context lengths timed, written as ``kv.kvf12.attention`` candidates with ``"batches"`` ranges (what was tuned per
GPU is data: ``glyd.kv.registry`` reads these rows).

    # a GPU: one Qwen2.5-7B layer (28 query heads, 4 KV heads, head dim 128), real pages (kv.py pool writes them)
    PYTHONPATH=src python3 benchmarks/sweep_kv.py --pool .carry/kv_pool.pt --out $OUT/sweep_kv \\
        --table $OUT/sweep_kv/NVIDIA_H200.json          # the GPU's table with the kvf12 attention rows replaced
    # the CPU: a dry run under TRITON_INTERPRET=1 at a small shape (every config checked, nothing timed)
    PYTHONPATH=src python3 benchmarks/sweep_kv.py --dry-run --out /tmp/sweep_kv

Every config's output is checked against SDPA (relative error <= 1e-2) before it is timed (a CUDA graph of the one
launch, median of the replays, bf16 SDPA timed in the same run). ``--configs w,s,p,r[,x[,n[,d]]] ...``: warps,
sub-tile tokens, programs an SM, maxnreg (0: none), swar 0/1, num_stages (0: Triton's), pdl 0/1/2 ("", "combine",
"all": ``AttentionConfig.pdl``), as ``kv.py --pool-variants`` reads them; the default: the H200 table's config at
2, 4, 8 and 16 programs an SM, and with the combine launched early at 4 and 16; and 2-warp programs with it, 4 or
8 an SM at 128 registers, 6 at 168. Writes ``sweep_kv.json`` (every
time) and prints a table last.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import logging
import math
import os
import sys
import tempfile
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
if not torch.cuda.is_available():  # the dry run: Triton's interpreter, set before any kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _bench_kv():
    # this folder's kv.py (pages, the pool, CUDA-graph timing; it puts src/ first), loaded by its path: under
    # pytest, the name kv is tests/kv's package
    spec = importlib.util.spec_from_file_location("glyd_bench_kv", BENCH / "kv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


K = _bench_kv()

log = logging.getLogger("sweep_kv")
KERNEL = "kvf12_attention_triton"
#: the largest batch a table row's range reaches (the H100 table's rows use it)
MAX_BATCH = 1 << 20
DEFAULT_CONFIGS = ("4,32,2,96,1,2", "4,32,4,96,1,2", "4,32,8,96,1,2", "4,32,16,96,1,2",
                   "4,32,4,96,1,2,1", "4,32,16,96,1,2,1",
                   # 2-warp programs at 128 or 168 registers (no spills; at 96 they spill): on an H100 (2026-12-07)
                   # 8 an SM took 0.78-0.89 of the 4-warp launches' time at 4-64 sequences
                   "2,32,8,128,1,2,1", "2,32,4,128,1,2,1", "2,32,6,168,1,2,1")


def config_of(v: tuple) -> dict:
    """``AttentionConfig`` fields of a parsed ``--configs`` entry (``kv.parse_pool_variant``)."""
    w, ts, pps, mr, swar, st, *more = v
    pdl = more[0] if more else ""
    cfg = {"num_warps": w, "sub_tile": ts, "programs_per_sm": pps, "maxnreg": mr, "swar": swar, "num_stages": st}
    if pdl:
        cfg["pdl"] = pdl
    return cfg


def label(cfg: dict) -> str:
    return (f"w{cfg['num_warps']} s{cfg['sub_tile']} p{cfg['programs_per_sm']} r{cfg['maxnreg'] or '-'}"
            + (" swar" if cfg["swar"] else "") + (f" n{cfg['num_stages']}" if cfg["num_stages"] else "")
            + (f" pdl:{cfg['pdl']}" if cfg.get("pdl") else ""))


def picks(times: dict, batches: list[int]) -> dict[int, str]:
    """The config a batch takes: the least geometric mean, over the context lengths, of its time over SDPA's.
    ``times[(tokens, batch)]``: {"sdpa": us, label: us or NaN (failed)}; a config that failed at a length of the
    batch is not picked for it."""
    out = {}
    for b in batches:
        cells = [c for (t, bb), c in sorted(times.items()) if bb == b]
        names = {n for c in cells for n in c if n != "sdpa"}
        score = {}
        for n in sorted(names):
            ratios = [c.get(n, float("nan")) / c["sdpa"] for c in cells]
            if all(r > 0 and math.isfinite(r) for r in ratios):
                score[n] = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        if score:
            out[b] = min(score, key=lambda n: (score[n], n))
    return out


def table_rows(chosen: dict[int, str], configs: dict[str, dict]) -> list[dict]:
    """Table candidates from each batch's pick: a run of batches that pick one config is one row, its range from
    the batch after the run before it (1 for the first) to its last batch (``MAX_BATCH`` for the last). The
    first run's config is also the last row without a range: a launch whose batch is not known takes it."""
    if not chosen:
        raise ValueError("no config ran at any batch: no rows to write")
    runs: list[list] = []  # [name, first batch, last batch]
    for b in sorted(chosen):
        if runs and runs[-1][0] == chosen[b]:
            runs[-1][2] = b
        else:
            runs.append([chosen[b], b, b])
    rows, lo = [], 1
    for i, (name, _, last) in enumerate(runs):
        hi = MAX_BATCH if i == len(runs) - 1 else last
        rows.append({"kernel": KERNEL, "batches": [lo, hi], "config": configs[name]})
        lo = hi + 1
    rows.append({"kernel": KERNEL, "config": configs[runs[0][0]]})
    return rows


def write_table(src: Path, dest: Path, rows: list[dict]) -> None:
    """``src``'s table with its ``kv.kvf12.attention`` Triton rows replaced by ``rows`` (its other candidates, the
    twin's, kept after them), checked as the registry checks a table, written to ``dest`` through a temporary."""
    from glyd.kernels import registry

    table = json.loads(src.read_text(encoding="utf-8"))
    cell = table.setdefault("kv", {}).setdefault("kvf12", {})
    cell["attention"] = rows + [c for c in cell.get("attention", []) if c.get("kernel") != KERNEL]
    registry.check_table(table, str(dest))
    from glyd.kv._triton_fixed import AttentionConfig

    for row in rows:  # each config as the registry will build it: refused here, not at a launch
        AttentionConfig(**row["config"])
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(table, f, indent=2)
        f.write("\n")
    os.replace(tmp, dest)


def time_case(t: int, b: int, configs: dict[str, dict], pool, gen, kscale, failed: dict) -> dict:
    """SDPA's and each config's microseconds at ``t`` tokens x ``b`` sequences (NaN: not timed, on the CPU, or the
    config failed: then ``failed[(t, b, name)]`` says why)."""
    import torch.nn.functional as F

    from glyd.kv._triton_fixed import attention_triton

    hq, d = K.QWEN["q_heads"], K.QWEN["head_dim"]
    k = K.fill(b, t, None if pool is None else pool["k"], gen, kscale)
    v = K.fill(b, t, None if pool is None else pool["v"], gen, torch.ones_like(kscale))
    q = torch.randn(b, hq, d, device=k.device, generator=gen).to(torch.bfloat16)
    q4 = q[:, :, None, :]
    sdpa = lambda: F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)  # noqa: E731
    ref = sdpa()[:, :, 0].float()
    cell = {"sdpa": K.cuda_graph_time(sdpa)}
    spool = K.static_pool(k, v, None)
    for name, cfg in configs.items():
        opts = dict(num_warps=cfg["num_warps"], sub_tile=cfg["sub_tile"], programs_per_sm=cfg["programs_per_sm"],
                    maxnreg=cfg["maxnreg"] or None, swar=cfg["swar"], num_stages=cfg["num_stages"] or None)
        if cfg.get("pdl"):
            opts["pdl"] = cfg["pdl"]
        fn = lambda: attention_triton(q, spool.lens, None, spool.block_index, spool.k.layer(0),  # noqa: E731,B023
                                      spool.v.layer(0), 1.0 / math.sqrt(d), **opts)  # noqa: B023
        try:
            err = float((fn().float() - ref).norm() / ref.norm())
            if not err <= 1e-2:
                raise RuntimeError(f"relative error {err:.3g} against SDPA")
            cell[name] = K.cuda_graph_time(fn)
        except Exception as exc:  # the other configs still run; the record says what failed
            log.warning("T=%d B=%d %s failed: %s", t, b, name, str(exc)[:300])
            failed[(t, b, name)] = str(exc)[:300]
            cell[name] = float("nan")
    return cell


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pool", help="real pages (kv.py pool writes them); without one, Gaussian values")
    ap.add_argument("--tokens", type=int, nargs="+", default=[16384, 4096], help="context lengths (default 16384 4096)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64],
                    help="sequences a launch (default 1 2 4 8 16 32 64)")
    ap.add_argument("--configs", type=K.parse_pool_variant, nargs="+",
                    default=[K.parse_pool_variant(c) for c in DEFAULT_CONFIGS],
                    help="launch configs 'w,s,p,r[,x[,n[,d]]]' (default: " + " ".join(DEFAULT_CONFIGS) + ")")
    ap.add_argument("--table", help="write the GPU's kernel table here with the kvf12 attention rows the sweep picks")
    ap.add_argument("--dry-run", action="store_true",
                    help="the CPU: 128 tokens x 1-2 sequences under the interpreter, nothing timed, no table")
    ap.add_argument("--out", required=True, help="folder for sweep_kv.json")
    args = ap.parse_args(argv)
    if any(t < K.PAGE or t % K.PAGE for t in args.tokens) or any(b < 1 for b in args.batches):
        ap.error(f"--tokens must be multiples of the page ({K.PAGE}) and --batches >= 1")
    if args.dry_run:
        args.tokens, args.batches = [2 * K.PAGE], [1, 2]
    elif not torch.cuda.is_available():
        ap.error("no CUDA GPU: --dry-run checks the script on the CPU")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    pool = None
    if args.pool:
        pool = {k: v.to(dev) for k, v in torch.load(args.pool).items()}
    gen = torch.Generator(device=dev).manual_seed(0)
    kscale = torch.exp(torch.randn(1, K.QWEN["kv_heads"], 1, K.QWEN["head_dim"], device=dev, generator=gen))
    configs = {label(c): c for c in map(config_of, args.configs)}
    times, failed = {}, {}
    for t in args.tokens:
        for b in args.batches:
            times[(t, b)] = time_case(t, b, configs, pool, gen, kscale, failed)
            log.info("T=%d B=%d: %s", t, b, ", ".join(f"{n} {us:.1f}" for n, us in times[(t, b)].items()))
    chosen = picks(times, args.batches)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "CPU dry run"
    record = {"gpu": name, "torch": torch.__version__, "date": str(datetime.date.today()),
              "pages": "real" if pool is not None else "Gaussian", "configs": configs,
              "times_us": [{"tokens": t, "batch": b, **{n: us if math.isfinite(us) else None for n, us in c.items()}}
                           for (t, b), c in times.items()],
              "failed": [{"tokens": t, "batch": b, "config": n, "why": why} for (t, b, n), why in failed.items()],
              "picks": {str(b): n for b, n in chosen.items()}}
    if not args.dry_run:
        record["rows"] = table_rows(chosen, configs)
        if args.table:
            from glyd.kernels import registry

            src = registry.table_file(name)
            if not src.is_file():
                log.info("%s has no table: the sweep's rows go into a copy of the %s table", name, registry.FALLBACK)
                src = registry.table_file(registry.FALLBACK)
            write_table(src, Path(args.table), record["rows"])
    (out / "sweep_kv.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"\n{name}; torch {torch.__version__}; {record['pages']} pages; us, ratio to SDPA; * the batch's pick\n")
    print("| tokens x seqs | SDPA us | " + " | ".join(configs) + " |")
    print("|---|---|" + "---|" * len(configs))
    for (t, b), c in times.items():
        cells = [f"{c[n]:.1f} ({c[n] / c['sdpa']:.2f}x)" + ("*" if chosen.get(b) == n else "") for n in configs]
        print(f"| {t} x {b} | {c['sdpa']:.1f} | " + " | ".join(cells) + " |")
    for (t, b, n), why in failed.items():
        print(f"failed: {t} x {b} {n}: {why}")
    return 1 if failed and args.dry_run else 0  # on the GPU a failed config is a result (never picked)


if __name__ == "__main__":
    sys.exit(main())
