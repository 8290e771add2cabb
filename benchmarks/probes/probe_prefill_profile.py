"""Where a small model's prefill spends its host time: one prompt through a random model in bf16 and in
a Glyd layout, profiled with torch.profiler (self CPU time by op) and cProfile (Python functions).

Why: Qwen2.5-0.5B's first token at 512 tokens takes about 2x bf16's wall time while its GPU time is
within 15%; probe_host_time.py puts a packed product's host time at ~47 us (bf16's ~14 us), which is
~3 ms over 97 products, not the ~16 ms measured. This probe looks at the whole forward.

    PYTHONPATH=src python3 benchmarks/probes/probe_prefill_profile.py --model qwen2.5-0.5b --prompt 512
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402

import scale  # noqa: E402


def _forward(model, ids):
    return model(input_ids=ids, use_cache=True, logits_to_keep=1).logits


def _wall(model, ids, reps: int) -> tuple[float, float]:
    """(median wall ms, median GPU ms) of one prefill."""
    walls, gpus = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        a.record()
        _forward(model, ids)
        b.record()
        b.synchronize()
        walls.append(1e3 * (time.perf_counter() - t))
        gpus.append(a.elapsed_time(b))
    return sorted(walls)[reps // 2], sorted(gpus)[reps // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--variants", default="bf16,fixed12")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None, help="a folder for the full profiles")
    args = ap.parse_args()
    cfg = scale._config(args.model)
    rows = []
    for variant in args.variants.split(","):
        model = scale._build(cfg, variant, "cuda")
        vocab = model.config.get_text_config().vocab_size
        ids = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(3)).to("cuda")
        with torch.inference_mode():
            for _ in range(3):
                _forward(model, ids)
            wall, gpu = _wall(model, ids, 9)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    _forward(model, ids)
                torch.cuda.synchronize()
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(3):
                _forward(model, ids)
            torch.cuda.synchronize()
            pr.disable()
        rows.append((variant, wall, gpu))
        print(f"\n== {args.model} {variant} prefill {args.prompt}: wall {wall:.2f} ms, GPU {gpu:.2f} ms")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(args.top)
        print(s.getvalue())
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(120)
            (Path(args.out) / f"cprofile_{variant}.txt").write_text(s.getvalue())
        del model
        torch.cuda.empty_cache()
    print("\nvariant   wall ms   GPU ms  (3 profiled prefills: the tables above are for 3 calls)")
    for v, w, g in rows:
        print(f"{v:8s} {w:8.2f} {g:8.2f}")


if __name__ == "__main__":
    main()
