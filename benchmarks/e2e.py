#!/usr/bin/env python3
"""End-to-end harness: bf16 and Glyd on the same model in one run (the code of ``glyd eval``).

Perplexity, next-token agreement, MMLU accuracy and agreement with bf16, decode step time at several
batch sizes (static cache, one CUDA graph a step) and weight memory; see glyd/apps/evaluate.py.

    python benchmarks/e2e.py qwen2.5-7b --random --modes fixed12 --no-merge --compile   # + torch.compile step

    python benchmarks/e2e.py MODEL_FOLDER --modes fixed12,tiered,exact
    python benchmarks/e2e.py qwen2.5-7b --random --modes fixed12,tiered --decode-batches 1,8,32,64

How time and memory grow with model size (0.5B to 70B, bf16 against each layout and KV code):
``benchmarks/scale.py``, which builds its random models the same way (``glyd.hf.synthetic``).

Runs from a checkout without installing glyd (it puts ../src on the path).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from glyd.errors import GlydError  # noqa: E402
from glyd.apps import cli_models as cli  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="e2e.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_eval_arguments(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return cli._eval(args)
    except GlydError as exc:
        print(f"e2e: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
