#!/usr/bin/env python3
"""How time and memory grow with model size, bf16 against Glyd (issue 28): 0.5B to 70B on one GPU.

For each model shape (Qwen2.5-0.5B, -7B, -32B, Llama-3.1-70B; the mixture-of-experts shapes
Qwen3-30B-A3B and Mixtral-8x7B with ``--sizes``; ``glyd fit``'s configs, no hub) and
each variant (weights ``bf16``, ``fixed12``, ``tiered``; ``+kv``: glyd's lossless KV cache):

* the model with random weights made a tensor at a time on the GPU and packed as each is made
  (``glyd.hf.synthetic``: the bf16 model is never held whole), q|k|v and gate|up merged (bf16 too);
* **weight memory** (bytes of parameters and buffers) beside ``glyd fit``'s prediction;
* **decode step** at 1, 8, 32, 64 sequences: ``glyd eval``'s step (static cache of ``--context``
  positions, one CUDA graph, median GPU time of replays); ``+kv``: the same step over
  ``GlydStaticCache`` (a static pool of kvf12 pages, the fused decode attention, one CUDA graph);
* **time to first token** at 512 and 2048 prompt tokens (one sequence, eager prefill, median;
  ``--compile-prefill``: through ``torch.compile(mode="reduce-overhead")``, as ``ttft_ab.py --compile``,
  ``+kv`` too: a prompt into the pool traces as one graph);
* **largest context** at ``--capacity-batch`` sequences: bisection over static caches that fit with
  one decode step at their last position (``+kv``: the largest GlydStaticCache pool that the free memory
  holds, filled to its last position, and one decode step there), beside
  ``glyd fit``'s largest context for the same weights (its margin included, the model's
  max_position_embeddings not applied, so both are memory bounds).

bf16 runs where fit says its weights fit; a batch, prompt or cache that runs out of memory is "OOM" in
the table. After every variant the JSON and the markdown table are rewritten (a run cut short keeps
what it measured); the PNG plot (matplotlib, imported lazily) at the end and after each size.

    python3 benchmarks/scale.py --out $OUT                                  # everything (H200)
    python3 benchmarks/scale.py --sizes qwen2.5-0.5b,qwen2.5-7b,qwen2.5-32b --out $OUT/a
    python3 benchmarks/scale.py --sizes llama-3.1-70b --out $OUT/b
    python3 benchmarks/scale.py --combine $OUT/a/scale.json $OUT/b/scale.json --out $OUT  # one table, one plot
    python3 benchmarks/scale.py --sizes qwen3-30b-a3b --variants bf16,fixed12 --out $OUT/moe   # an MoE shape
    python3 benchmarks/scale.py --sizes qwen2.5-0.5b,qwen2.5-7b --compile-prefill --no-capacity --out $OUT/c
    python3 benchmarks/scale.py --tiny --out /tmp/scale                    # the whole pipeline on the CPU
    python3 benchmarks/scale.py --tiny --sizes tiny-moe --out /tmp/scale   # its MoE path on the CPU

MoE models (``MOE_SIZES``): every expert packed (``glyd.nn.GlydExperts``); up to 255 rows (tokens x
top-k: decode steps up to 31 sequences at top-8) the grouped fixed12 GEMV over the chosen experts, 256
to 2048 rows the grouped tensor-core product ``fixed12_experts_mma``, above that
``experts_unpack_grouped`` (the experts with rows unpacked into one bf16 scratch, one
``torch._grouped_mm``), all three in CUDA graphs too; bf16 runs transformers'
own experts implementation (``grouped_mm``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from glyd.codec import LAYOUTS  # noqa: E402

import scale_parts as sp  # noqa: E402
from scale_report import table, write_outputs  # noqa: E402

log = logging.getLogger("scale")
GiB = 2**30
SIZES = ("qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-32b", "llama-3.1-70b")
#: Mixture-of-experts shapes (``--sizes``): 128 experts of width 768 (8 a token), 8 of 14336 (2 a token).
MOE_SIZES = ("qwen3-30b-a3b", "mixtral-8x7b")
VARIANTS = ("bf16", "fixed12", "tiered", "fixed12+kv")
#: A two-layer Llama for ``--tiny`` (the whole pipeline on the CPU in seconds).
TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=4096,
            tie_word_embeddings=False, _name="tiny")
#: A two-layer Qwen3-MoE (8 experts, 2 a token) for ``--tiny``: the MoE path of the pipeline on the CPU.
TINY_MOE = dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=4096,
                tie_word_embeddings=False, _name="tiny-moe")
TINY_CONFIGS = {"tiny": TINY, "tiny-moe": TINY_MOE}


def _config(name: str) -> dict:
    from glyd.apps.fit import load_config

    return dict(TINY_CONFIGS[name]) if name in TINY_CONFIGS else load_config(name)


def _hf_config(cfg: dict):
    from glyd.apps.fit_meta import build_config

    config = build_config(cfg)
    if getattr(config, "initializer_range", None) is None:
        config.initializer_range = 0.02
    return config


def fit_prediction(cfg: dict, weights: str, gpu_bytes: int, batch: int) -> dict:
    """``glyd fit``'s weight bytes and largest context (its memory bound, no max_position cap)."""
    from glyd.apps.fit import estimate, max_context, model_shape

    shape = model_shape(cfg)
    layout = "fixed12" if weights == "bf16" else weights
    e = estimate(shape, gpu_bytes=gpu_bytes, context=512, batch=batch, layout=layout)
    w = e.weights_bf16 if weights == "bf16" else e.weights_glyd
    uncapped = dataclasses.replace(shape, max_positions=None)
    per_token = sum(a.kv_heads * a.head_dim * 2 * 2 for a in shape.attention) * batch
    return {"params": shape.params, "weight_bytes": w, "max_context": max_context(e, uncapped, w),
            "kv_bytes_per_token": per_token, "max_positions": shape.max_positions}


def _build(cfg: dict, weights: str, device: str, tiny_share: float = 0.0):
    from glyd.apps.eval_models import merge_bf16
    from glyd.hf.synthetic import random_model

    # tiny_share: of each matrix's values outside fixed12's window, as real weights have them (every variant the same)
    model = random_model(_hf_config(cfg), layout=None if weights == "bf16" else weights, device=device, merge=True,
                         progress=True, tiny_share=tiny_share)
    if weights == "bf16":
        merge_bf16(model)  # the same products as Glyd's merged ones
    return model


def _capacity(model, rec: dict, args, device: str, lossless: bool) -> None:
    """Largest context at ``args.capacity_batch`` sequences, measured on a GPU (not on the CPU)."""
    if not device.startswith("cuda") or args.no_capacity:
        rec["capacity_note"] = "not measured" + (" (CPU)" if not device.startswith("cuda") else "")
        return
    b = args.capacity_batch
    free = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    per_token = rec["fit"]["kv_bytes_per_token"]
    guess = max(int(free / per_token * (1.6 if lossless else 1.1)), 1024)
    step = max(64, (guess // 2048) // 64 * 64)
    t = time.perf_counter()
    if lossless:
        chunk = max(64, guess // 48 // 64 * 64)  # about 2% of the capacity a write: 48 rounds, not thousands
        rec["capacity_tokens"] = sp.lossless_capacity(model, b, device, chunk=chunk)
        rec["capacity_note"] = ("the largest GlydStaticCache pool in the free memory, filled with random bf16 to "
                                "its last position, then one fused decode step there")
    else:
        rec["capacity_tokens"] = sp.largest(lambda n: sp.static_fits(model, b, n, device), guess, step)
        rec["capacity_note"] = f"static cache + one decode step at its last position, bisection to {step} tokens"
    rec["capacity_s"] = time.perf_counter() - t
    log.info("%s %s: largest context at %d sequence(s) %d tokens (fit: %d) in %.1f s", rec["size"], rec["variant"], b,
             rec["capacity_tokens"], rec["fit"]["max_context"], rec["capacity_s"])


def run_variant(name: str, cfg: dict, variant: str, args, device: str) -> dict:
    """Build one size in one variant and measure it; a dict for the JSON (no exception escapes for OOM)."""
    weights, _, kv = variant.partition("+")
    lossless = kv == "kv"
    gpu = torch.cuda.get_device_properties(device).total_memory if device.startswith("cuda") else 0
    rec = {"size": name, "variant": variant, "weights": weights, "kv": "lossless" if lossless else "bf16",
           "exc_share": args.exc}
    rec["fit"] = fit_prediction(cfg, weights, gpu or 80 * GiB, args.capacity_batch)
    rec["params"] = rec["fit"]["params"]
    if gpu and weights == "bf16" and rec["fit"]["weight_bytes"] + GiB > gpu:
        rec["status"] = f"bf16 weights do not fit ({rec['fit']['weight_bytes'] / GiB:.1f} GiB + 1 GiB > {gpu / GiB:.1f})"
        return rec
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    model = sp.oom_safe(lambda: _build(cfg, weights, device, args.exc), device, f"{name} {weights}: building")
    if model is None:
        rec["status"] = "OOM while building"
        return rec
    from glyd.apps.eval_models import weight_bytes

    rec.update(status="ok", build_s=time.perf_counter() - t, weight_bytes=weight_bytes(model))
    if device.startswith("cuda"):
        rec.update(allocated_bytes=torch.cuda.memory_allocated(), build_peak_bytes=torch.cuda.max_memory_allocated())
    log.info("%s %s: weights %.3f GiB (fit %.3f GiB), built in %.1f s", name, variant, rec["weight_bytes"] / GiB,
             rec["fit"]["weight_bytes"] / GiB, rec["build_s"])
    _measure(model, rec, args, device, lossless)
    del model
    sp.free_memory(device)
    return rec


def _measure(model, rec: dict, args, device: str, lossless: bool) -> None:
    batches = tuple(args.batches)
    t = time.perf_counter()
    ms, rec["decode_method"] = sp.decode_static(model, batches, args.context, args.replays, device,
                                                kv="lossless" if lossless else "bf16")
    if lossless:
        rec["kv_ratio"] = sp.lossless_ratio(model, batches[0], args.context - 1, device)
    rec["decode_ms"] = {str(b): v for b, v in ms.items()}
    # +kv compiles too: a prompt into GlydStaticCache takes its position from the pool's host count, which
    # torch.compile guards on (reset() before each prefill: 0), so the prompt's write is one graph (issue 38)
    compiled = args.compile_prefill
    rec["prefill"] = sp.PREFILL_COMPILED if compiled else sp.PREFILL_EAGER
    breaks = sp.graph_breaks()
    rec["ttft_ms"] = sp.ttfts(model, args.prompts, device, args.ttft_reps, lossless, compiled)
    breaks = sp.graph_breaks() - breaks
    if compiled and breaks:  # a compiled prompt in pieces (or eager past the recompile limit) is no compiled number
        rec["prefill_note"] = f"the compiled prefill broke its graph {breaks} times (TORCH_LOGS=graph_breaks)"
        log.warning("%s %s: %s", rec["size"], rec["variant"], rec["prefill_note"])
    rec["measure_s"] = time.perf_counter() - t
    log.info("%s %s: step ms %s; first token ms %s", rec["size"], rec["variant"], rec["decode_ms"], rec["ttft_ms"])
    _capacity(model, rec, args, device, lossless)


def _environment(device: str) -> dict:
    import platform

    import glyd
    import transformers

    env = {"glyd": glyd.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version(), "argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name()
        env["gpu_bytes"] = torch.cuda.get_device_properties(device).total_memory
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    def ints(s: str) -> tuple[int, ...]:
        return tuple(int(v) for v in s.split(",") if v.strip())

    def strs(s: str) -> tuple[str, ...]:
        return tuple(v.strip() for v in s.split(",") if v.strip())

    ap = argparse.ArgumentParser(prog="scale.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=strs, default=SIZES, help=f"model shapes (default {','.join(SIZES)})")
    ap.add_argument("--variants", type=strs, default=VARIANTS,
                    help=f"bf16 or a layout ({', '.join(LAYOUTS)}), each optionally +kv (default {','.join(VARIANTS)})")
    ap.add_argument("--batches", type=ints, default=(1, 8, 32, 64), help="decode sequences (default 1,8,32,64)")
    ap.add_argument("--context", type=int, default=512, help="decode cache positions (default 512)")
    ap.add_argument("--replays", type=int, default=20, help="timed decode steps a batch size (default 20)")
    ap.add_argument("--prompts", type=ints, default=(512, 2048), help="prompt tokens for first-token time (default 512,2048)")
    ap.add_argument("--ttft-reps", type=int, default=5, help="timed prefills a prompt length (default 5)")
    ap.add_argument("--compile-prefill", action="store_true",
                    help=f"first token through {sp.PREFILL_COMPILED} (ttft_ab.py's --compile): one eager prefill "
                         f"a prompt length, the compile, {sp.COMPILE_WARMUP} warm-up calls, then the timed prefills; "
                         "CUDA graphs on a GPU, inductor without graphs on the CPU (--tiny: needs a C compiler); +kv "
                         "variants too (a GlydStaticCache a prompt length, emptied before each prefill: its write is "
                         "in the graph)")
    ap.add_argument("--capacity-batch", type=int, default=1, help="sequences of the largest-context search (default 1)")
    ap.add_argument("--no-capacity", action="store_true", help="skip the largest-context search")
    ap.add_argument("--exc", type=float, default=0.0,
                    help="a share of each matrix's weights outside fixed12's window, as real weights have 0.0002-0.0013 "
                         "(default 0: normal weights, about 0.00008)")
    ap.add_argument("--device", default=None, help="default: cuda when available")
    ap.add_argument("--tiny", action="store_true",
                    help=f"a two-layer model on the CPU, small batches and prompts (--sizes: {', '.join(TINY_CONFIGS)})")
    ap.add_argument("--combine", nargs="+", metavar="JSON", help="only merge these runs' JSON into one table and plot")
    ap.add_argument("--out", required=True, help="folder for scale.json, scale.md and scale.png")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.tiny:
        # context 72: one packed page of the lossless cache (64 tokens) and a raw tail
        sizes = ("tiny",) if args.sizes == SIZES else args.sizes
        if any(s not in TINY_CONFIGS for s in sizes):
            ap.error(f"--tiny runs {', '.join(TINY_CONFIGS)} only")
        args.sizes, args.batches, args.context, args.prompts = sizes, (1, 2), 72, (16, 32)
        args.replays, args.ttft_reps, args.device = 3, 2, args.device or "cpu"
        torch.set_num_threads(1)  # tiny products: threads only wait on each other (15 ms against 0.1 ms here)
    bad = [v for v in args.variants if v.partition("+")[0] not in ("bf16", *LAYOUTS)
           or v.partition("+")[2] not in ("", "kv")]
    if bad:
        ap.error(f"unknown variant(s) {', '.join(bad)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.combine:
        runs = [json.loads(Path(p).read_text()) for p in args.combine]
        report = {"environment": runs[0]["environment"], "results": [r for run in runs for r in run["results"]]}
        write_outputs(report, out, plot=True)
        print(table(report))
        return 0
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    report = {"environment": _environment(device), "results": []}
    for name in args.sizes:
        cfg = _config(name)
        for variant in args.variants:
            log.info("=== %s %s", name, variant)
            report["results"].append(run_variant(name, cfg, variant, args, device))
            write_outputs(report, out, plot=False)
        write_outputs(report, out, plot=True)
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
