#!/usr/bin/env python3
"""Serving throughput of ``glyd serve``, bf16 against fixed12 (issue 39): tokens/s at 1, 8, 32 requests.

A Qwen2.5-7B-shaped model with random weights (``glyd.hf.synthetic``: made a tensor at a time on the
GPU, packed as each is made; q|k|v and gate|up merged, bf16 too) is served by ``glyd serve``'s own
server (``glyd.apps.serve.Server``: transformers' continuous batching) on the loopback address, and
``N`` clients (threads of the ``openai`` client, streaming) each ask one text completion of
``--prompt`` tokens and ``--new`` new tokens at once (end of sequence disabled, so every request
makes exactly ``--new`` tokens). Each cell is the median of ``--reps`` rounds after one warm-up round:

* **tokens/s**: all new tokens of the round / the round's wall time (first request sent to last token);
* **TTFT**: the median time to a request's first streamed token;
* **per request**: the median of each request's own new tokens / its time after the first token.

The prompt is random tokens of a one-token-a-word tokenizer over the model's whole vocabulary (the
text is irrelevant to timing). The JSON and the markdown table are rewritten after every cell.

    python3 benchmarks/serve.py --out $OUT                         # H200: qwen2.5-7b, bf16 and fixed12
    python3 benchmarks/serve.py --tiny --out /tmp/serve-bench      # the whole pipeline on the CPU (seconds)
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

log = logging.getLogger("serve-bench")
WEIGHTS = ("bf16", "fixed12")
#: A two-layer Qwen2 for ``--tiny``.
TINY = dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=512,
            tie_word_embeddings=False, _name="tiny")


def word_tokenizer(vocab: int):
    """A fast tokenizer with one word a token for ids 0..vocab-1 (``t0 t1 ...``); no special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk)


def build_model(name: str, weights: str, device: str):
    from glyd.apps.eval_models import merge_bf16
    from glyd.apps.fit import load_config
    from glyd.apps.fit_meta import build_config
    from glyd.hf.synthetic import random_model

    cfg = dict(TINY) if name == "tiny" else load_config(name)
    config = build_config(cfg)
    if getattr(config, "initializer_range", None) is None:
        config.initializer_range = 0.02
    model = random_model(config, layout=None if weights == "bf16" else weights, device=device, merge=True,
                         progress=True)
    if weights == "bf16":
        merge_bf16(model)  # the same merged products as glyd's
    model.generation_config.eos_token_id = None  # every request makes exactly --new tokens
    return model.eval()


def _one(client, prompt: str, new: int, out: dict) -> None:
    t0 = time.perf_counter()
    first = None
    n = 0
    for chunk in client.completions.create(model="bench", prompt=prompt, max_tokens=new, stream=True):
        if chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() if first is None else first
        if chunk.usage is not None:
            n = chunk.usage.completion_tokens
    end = time.perf_counter()
    out.update(start=t0, first=first, end=end, tokens=n)


def round_(client, prompts: list[str], new: int) -> dict:
    """All prompts at once; the round's throughput, median TTFT and median per-request decode rate."""
    results = [{} for _ in prompts]
    threads = [threading.Thread(target=_one, args=(client, p, new, r)) for p, r in zip(prompts, results)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any("end" not in r for r in results):
        raise RuntimeError("a request of the round failed (see the log)")
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    rates = [(r["tokens"] - 1) / (r["end"] - r["first"]) for r in results if r["first"] and r["end"] > r["first"]]
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_s": statistics.median(r["first"] - r["start"] for r in results if r["first"]),
            "per_request_tokens_per_s": statistics.median(rates) if rates else None}


def measure(server_url: str, vocab: int, concurrency: tuple[int, ...], prompt: int, new: int, reps: int,
            seed: int) -> list[dict]:
    import openai

    client = openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0, timeout=3600)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in concurrency:
        prompts = [" ".join(f"t{i}" for i in torch.randint(0, vocab, (prompt,), generator=g).tolist())
                   for _ in range(n)]
        round_(client, prompts, new)  # warm-up: kernels, caches and CUDA graphs of this batch size
        runs = [round_(client, prompts, new) for _ in range(reps)]
        best = sorted(runs, key=lambda r: r["tokens_per_s"])[len(runs) // 2]
        rows.append({"concurrency": n, **best, "runs_tokens_per_s": [r["tokens_per_s"] for r in runs]})
        log.info("%d requests: %.1f tokens/s (TTFT %.3f s)", n, best["tokens_per_s"], best["ttft_s"])
    return rows


def serve_and_measure(args: argparse.Namespace, weights: str) -> dict:
    from glyd.apps.serve import ServeConfig, Server

    model = build_model(args.model, weights, args.device)
    vocab = model.config.get_text_config().vocab_size
    cfg = ServeConfig(f"random {args.model} ({weights})", name="bench", device=args.device, port=0,
                      max_tokens=args.new, block_size=args.block_size, num_blocks=args.num_blocks,
                      max_batch_tokens=args.max_batch_tokens, progress=False,
                      cuda_graphs={"auto": None, "on": True, "off": False}[args.cuda_graphs])
    with Server(cfg, model=model, tokenizer=word_tokenizer(vocab)) as server:
        info = dict(server.info)
        rows = measure(server.url, vocab, args.concurrency, args.prompt, args.new, args.reps, args.seed)
    return {"weights": weights, "info": info, "rows": rows}


def table(results: list[dict]) -> str:
    lines = ["| weights | requests | tokens/s | ratio to bf16 | TTFT (s) | per request (tokens/s) | weights (GiB) |",
             "|---|---|---|---|---|---|---|"]
    base = {r["concurrency"]: r["tokens_per_s"] for res in results if res["weights"] == "bf16" for r in res["rows"]}
    for res in results:
        gib = res["info"]["weight_bytes"] / 2**30
        for r in res["rows"]:
            b = base.get(r["concurrency"])
            ratio = f"{r['tokens_per_s'] / b:.2f}x" if b else "-"
            per = r["per_request_tokens_per_s"]
            lines.append(f"| {res['weights']} | {r['concurrency']} | {r['tokens_per_s']:.1f} | {ratio} | "
                         f"{r['ttft_s']:.3f} | {'-' if per is None else f'{per:.1f}'} | {gib:.2f} |")
    return "\n".join(lines) + "\n"


def environment(device: str) -> dict:
    import transformers

    env = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "device": device, "argv": sys.argv}
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name()
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-7b", help="a glyd fit config name (default qwen2.5-7b)")
    p.add_argument("--weights", default=",".join(WEIGHTS), help="comma-separated: bf16, fixed12, tiered, ...")
    p.add_argument("--concurrency", default="1,8,32", help="requests at once, comma-separated (default 1,8,32)")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens a request (default 128)")
    p.add_argument("--new", type=int, default=256, help="new tokens a request (default 256)")
    p.add_argument("--reps", type=int, default=3, help="measured rounds a cell (default 3; the median is kept)")
    p.add_argument("--device", default=None, help="default: cuda when available")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--max-batch-tokens", type=int, default=None)
    p.add_argument("--cuda-graphs", choices=("auto", "on", "off"), default="auto",
                   help="continuous batching's CUDA graphs (default auto: transformers' choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="a two-layer model on the CPU, 1 and 2 requests, 4 tokens")
    p.add_argument("--out", type=Path, required=True, help="folder for serve.json and serve.md")
    args = p.parse_args(argv)
    if args.tiny:
        args.model, args.device, args.prompt, args.new, args.reps = "tiny", "cpu", 8, 4, 1
        if args.concurrency == "1,8,32":
            args.concurrency = "1,2"
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.concurrency = tuple(int(v) for v in args.concurrency.split(","))
    args.weights = tuple(w.strip() for w in args.weights.split(",") if w.strip())
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"environment": environment(args.device), "model": args.model, "prompt": args.prompt, "new": args.new,
              "results": []}
    for weights in args.weights:
        report["results"].append(serve_and_measure(args, weights))
        gc.collect()  # the model, its server and its paged KV cache, before the next variant is built
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        (args.out / "serve.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "serve.md").write_text(table(report["results"]))
    print(table(report["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
