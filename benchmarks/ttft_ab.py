#!/usr/bin/env python3
"""Time to first token, bf16 against Glyd, with both models resident and their prefills interleaved.

``scale.py`` times one variant after the other; an eager prefill is host-bound for small models and
for mixture-of-experts models, and the H200 machine's host speed drifts by ~30% between minutes
(history/2026-12-04-h200-6.md: bf16's own Qwen3-30B-A3B first token moved 72 -> 105 ms in four runs).
Here each round times bf16 and every variant back to back (the order alternating between rounds), so
drift hits both sides of a ratio alike; the ratio reported is the median of the rounds' ratios.

Per model shape (``glyd fit``'s configs, random weights as ``scale.py`` makes them, q|k|v and gate|up
merged in both) and prompt length: median wall ms (host issue + GPU, one synchronised prefill of one
sequence, logits of the last position), median GPU span (CUDA events), and the median ratio to bf16.

    python3 benchmarks/ttft_ab.py --sizes qwen2.5-0.5b --out $OUT/ab              # H200
    python3 benchmarks/ttft_ab.py --sizes qwen3-30b-a3b --prompts 512,2048 --out $OUT/ab_moe
    python3 benchmarks/ttft_ab.py --sizes qwen2.5-0.5b --compile --out $OUT/ab_c  # both under torch.compile
    python3 benchmarks/ttft_ab.py --tiny --out /tmp/ab                            # the pipeline on the CPU

``--compile``: every model's forward through ``torch.compile(mode="reduce-overhead")`` (CUDA graphs
a prompt length on a GPU): what a host-bound prefill costs once the host's share is gone (Glyd's ops
are custom ops with fake implementations, so the packed products compile as bf16's do).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import scale  # noqa: E402
import scale_parts as sp  # noqa: E402

log = logging.getLogger("ttft_ab")


def _once(model, ids, cuda: bool) -> tuple[float, float]:
    """(wall ms, GPU span ms) of one synchronised prefill (GPU span NaN on the CPU)."""
    if cuda:
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
    t = time.perf_counter()
    sp.prefill(model, ids)
    if cuda:
        b.record()
        b.synchronize()
    wall = 1e3 * (time.perf_counter() - t)
    return wall, (a.elapsed_time(b) if cuda else float("nan"))


def interleaved(models: dict, prompt: int, rounds: int, device: str, vocab: int) -> dict:
    """Each model's prefill of ``prompt`` tokens, ``rounds`` times, the models' order alternating
    (``models``: name -> the forward to call, bf16's first)."""
    ids = torch.randint(0, vocab, (1, prompt), generator=torch.Generator().manual_seed(3)).to(device)
    cuda = device.startswith("cuda")
    names = list(models)
    walls: dict[str, list[float]] = {n: [] for n in names}
    gpus: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for n in names:  # warm-up: compiles (CUDA graphs record on the third call), plans, scratch buffers
            for _ in range(sp.COMPILE_WARMUP):
                sp.prefill(models[n], ids)
        for r in range(rounds):
            for n in (names if r % 2 == 0 else names[::-1]):
                w, g = _once(models[n], ids, cuda)
                walls[n].append(w)
                gpus[n].append(g)
    base = names[0]
    out = {}
    for n in names:
        ratios = [w / b for w, b in zip(walls[n], walls[base])]
        out[n] = {"wall_ms": statistics.median(walls[n]), "gpu_ms": statistics.median(gpus[n]),
                  "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                  "walls": walls[n]}
    return out


def _table(results: list[dict]) -> str:
    lines = ["| size | prompt | variant | wall ms | GPU span ms | x bf16 (median of rounds) | range |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        for n, v in r["variants"].items():
            lines.append(f"| {r['size']} | {r['prompt']} | {n} | {v['wall_ms']:.2f} | {v['gpu_ms']:.2f} | "
                         f"{v['ratio']:.2f} | {v['ratio_min']:.2f}-{v['ratio_max']:.2f} |")
    return "\n".join(lines)


def _header(device: str) -> str:
    import transformers

    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "CPU"
    return f"{gpu}; torch {torch.__version__}, transformers {transformers.__version__}; " \
           f"{time.strftime('%Y-%m-%d %H:%M:%S')}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    strs = lambda s: tuple(x for x in s.split(",") if x)  # noqa: E731
    ints = lambda s: tuple(int(x) for x in s.split(",") if x)  # noqa: E731
    ap.add_argument("--sizes", type=strs, default=("qwen2.5-0.5b",), help="model shapes (default qwen2.5-0.5b)")
    ap.add_argument("--variants", type=strs, default=("fixed12",), help="Glyd layouts beside bf16 (default fixed12)")
    ap.add_argument("--prompts", type=ints, default=(512, 2048), help="prompt lengths (default 512,2048)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    ap.add_argument("--device", default=None, help="default cuda (cpu with --tiny)")
    ap.add_argument("--compile", action="store_true",
                    help=f"{sp.PREFILL_COMPILED} every model's forward (scale_parts.compile_prefill: one eager prefill "
                         "a prompt length first; on the CPU inductor without graphs, needing a C compiler)")
    ap.add_argument("--tiny", action="store_true", help="the two-layer model on the CPU, prompts 16,32, 3 rounds")
    ap.add_argument("--out", default=None, help="a folder for ab.json and ab.md")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    for v in args.variants:
        if v == "bf16" or v not in scale.LAYOUTS:
            ap.error(f"--variants takes Glyd layouts ({', '.join(scale.LAYOUTS)}), got {v!r}")
    if args.tiny:
        args.sizes = ("tiny",) if args.sizes == ("qwen2.5-0.5b",) else args.sizes
        args.prompts, args.rounds, args.device = (16, 32), 3, args.device or "cpu"
    device = args.device or "cuda"
    if device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("no CUDA GPU here: use --tiny (or --device cpu)")
    how = sp.PREFILL_COMPILED if args.compile else sp.PREFILL_EAGER
    results = []
    for size in args.sizes:
        cfg = scale._config(size)
        models = {"bf16": scale._build(cfg, "bf16", device)}
        for v in args.variants:
            models[v] = scale._build(cfg, v, device)
        vocab = models["bf16"].config.get_text_config().vocab_size
        if args.compile:
            models = {n: sp.compile_prefill(m, args.prompts, device) for n, m in models.items()}
        for prompt in args.prompts:
            res = interleaved(models, prompt, args.rounds, device, vocab)
            results.append({"size": size, "prompt": prompt, "prefill": how, "variants": res})
            log.info("%s prompt %d: %s", size, prompt,
                     ", ".join(f"{n} {v['wall_ms']:.2f} ms ({v['ratio']:.2f}x)" for n, v in res.items()))
        del models
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    text = _table(results) + f"\n\n{_header(device)}; {args.rounds} interleaved rounds, {how} prefill, no_grad\n"
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "ab.json").write_text(json.dumps(results, indent=1))
        (out / "ab.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
