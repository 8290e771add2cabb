#!/usr/bin/env python3
"""CPU token time of greedy generation: bf16 against a packed layout, on the demo model.

The model is the one ``glyd demo`` runs (SmolLM2-135M-Instruct, ``glyd.apps.smollm2``) unless
``--model`` names a bf16 folder. ``--mode bf16`` loads it with transformers in bf16; ``--mode
fixed12`` (or any layout) loads a packed folder written once beforehand by ``--prepare DIR`` (so
the timed process packs nothing), ``--exact`` turns on bf16's own products. Each run: a warm-up
generation, then ``--reps`` times a generation of one new token (the prompt's forward, "prefill")
and one of ``--tokens`` new tokens from the demo's prompt (greedy, every token generated). It
prints one JSON line: the median prefill seconds, the median seconds a decoded token
((T(tokens) - T(1)) / (tokens - 1)), the median whole generation's seconds a new token, the tokens
and their text (so runs of two modes can be compared token for token).

    python benchmarks/cpu_generate.py --prepare /tmp/smol-fixed12 --layout fixed12
    python benchmarks/cpu_generate.py --mode bf16 --tokens 32
    python benchmarks/cpu_generate.py --mode packed --folder /tmp/smol-fixed12 --tokens 32

Whole-process time (what a user waits) is measured from outside, each mode as its own process.
Runs from a checkout without installing glyd (it puts ../src on the path).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402


def _bf16_folder(model: str | None) -> Path:
    if model:
        return Path(model)
    from glyd.apps import smollm2

    return smollm2.bf16_folder()


def _load(args: argparse.Namespace):
    if args.mode == "bf16":
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(str(_bf16_folder(args.model)), dtype=torch.bfloat16)
    import glyd

    return glyd.from_pretrained(args.folder, device="cpu", exact=args.exact, progress=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("bf16", "packed"), default="bf16")
    ap.add_argument("--folder", help="the packed folder (--mode packed)")
    ap.add_argument("--model", help="a bf16 model folder (default: the demo's SmolLM2-135M)")
    ap.add_argument("--prepare", metavar="DIR", help="pack the model into DIR and exit")
    ap.add_argument("--layout", default="fixed12", help="layout for --prepare")
    ap.add_argument("--exact", action="store_true", help="bf16's own products (exact=True)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.prepare:
        import glyd

        m = glyd.from_pretrained(str(_bf16_folder(args.model)), layout=args.layout, device="cpu", progress=False)
        glyd.save_pretrained(m, args.prepare)
        return 0
    if args.mode == "packed" and not args.folder:
        ap.error("--mode packed needs --folder")
    from transformers import AutoTokenizer

    from glyd.apps.demo import DEFAULT_PROMPT, _prompt_ids

    t0 = time.perf_counter()
    model = _load(args)
    load_s = time.perf_counter() - t0
    tok = AutoTokenizer.from_pretrained(str(_bf16_folder(args.model)))
    ids = _prompt_ids(tok, DEFAULT_PROMPT)
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=args.tokens, min_new_tokens=args.tokens,
              do_sample=False, pad_token_id=tok.eos_token_id)
    one = {**kw, "max_new_tokens": 1, "min_new_tokens": 1}
    prefill, times, out = [], [], None
    with torch.inference_mode():
        model.generate(ids, **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})  # warm-up
        for _ in range(args.reps):
            t = time.perf_counter()
            model.generate(ids, **one)
            prefill.append(time.perf_counter() - t)
            t = time.perf_counter()
            out = model.generate(ids, **kw)
            times.append(time.perf_counter() - t)
    new = out[0, ids.shape[1]:]
    decode = [(t - p) / max(new.numel() - 1, 1) for t, p in zip(times, prefill)]
    print(json.dumps({
        "mode": args.mode if args.mode == "bf16" else ("exact" if args.exact else "packed"),
        "threads": torch.get_num_threads(), "prompt_tokens": int(ids.shape[1]), "new_tokens": int(new.numel()),
        "load_s": round(load_s, 3), "prefill_s": round(statistics.median(prefill), 4),
        "decode_s_per_token": round(statistics.median(decode), 5),
        "generate_s_per_token": round(statistics.median(times) / new.numel(), 5),
        "generate_s": [round(t, 4) for t in times], "tokens": new.tolist(),
        "text": tok.decode(new, skip_special_tokens=True),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
