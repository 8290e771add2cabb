"""``glyd pack | unpack | verify | info``: packed checkpoints from the command line.

    glyd pack MODEL_DIR PACKED_DIR [--layout fixed12|dense11|tiered|auto] [--memory-limit SIZE]
    glyd verify PACKED_DIR
    glyd info PACKED_DIR [--totals]
    glyd unpack PACKED_DIR OUT_DIR

Progress bars go to stderr; the summary table goes to stdout.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import time
from collections import Counter
from pathlib import Path

from glyd.apps.cli_models import limit_option, memory_arg, path_arg
from glyd.apps.layouts import layout_help, layout_names
from glyd.errors import FormatError, GlydError, UnsupportedError, show_path
from glyd.store import folder
from glyd.store._atomic import is_glyd_temporary
from glyd.store.checkpoint import CheckpointReader

log = logging.getLogger(__name__)


#: ``glyd pack --memory-limit``'s help.
PACK_MEMORY_HELP = ("the most the packed weights may take on disk and in memory (e.g. 40GB = 40 x 10^9 bytes, 40GiB "
                    "= 40 x 2^30), counted from the source's headers before anything is written: with layout auto "
                    "the whole model takes the fastest layout that fits (fixed12, else dense11, else tiered; a log "
                    "line says which and why); a layout that does not fit is refused (default: no limit)")


def _progress(args: argparse.Namespace) -> bool:
    return not getattr(args, "quiet", False)


def _os_errors(handler):
    """Turn an OSError (disk full, permission denied) into glyd's one-line error, naming the
    destination when the failing file was one of its temporaries (removed by then)."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except GlydError:
            raise
        except OSError as exc:
            name, dst = exc.filename, getattr(args, "dst", None)
            inside_tmp = name is not None and any(is_glyd_temporary(part) for part in Path(os.fsdecode(name)).parts)
            if dst is not None and (inside_tmp or (name is None and not isinstance(exc, BrokenPipeError))):
                name = dst  # a write into the destination's temporary (a broken pipe is stdout's)
            where = f"{show_path(name)}: " if name else ""
            after = "; nothing was written" if dst is not None and name == dst and not Path(dst).exists() else ""
            raise GlydError(f"{where}{exc.strerror or exc}{after}") from exc

    return run


def _choose():
    # layout "auto" from the measurements of the GPU this runs on (none without one)
    import torch

    if not torch.cuda.is_available():
        return None
    from glyd.ops import choose_layout

    return lambda shape: choose_layout(shape, torch.device("cuda"))


def _loader_keep(args: argparse.Namespace) -> frozenset[str]:
    """The 2-D bf16 tensors of the source that the packed folder's loader would not run packed (a
    router, BART's ``final_logits_bias``): kept as they are, so that ``glyd.from_pretrained`` loads
    the folder. Without transformers, or for a config it cannot build, none (every 2-D bf16 tensor
    is packed, as before) with a warning; UnsupportedError (one line) for a tensor that transformers
    converts while loading (experts stored one matrix per expert), naming the command to use."""
    from glyd.store._source import read_config, source_shards

    src = Path(args.src)
    config = read_config(src)
    if config is None or config[0].get("quantization_config"):
        return frozenset()  # pack_folder says what is wrong with it
    _, headers, _ = source_shards(src)
    tensors = {n: (i.dtype, list(i.shape)) for h in headers.values() for n, i in h.tensors.items()}
    unchecked = "every 2-D bf16 tensor is packed and whether glyd.from_pretrained loads the folder was not checked"
    try:
        from glyd.hf.pack_plan import loader_plan

        plan = loader_plan(src, tensors, dst=Path(args.dst), layout=args.layout)
    except ModuleNotFoundError as exc:  # transformers or accelerate: the loader needs both
        log.warning("%s: %s is not installed: %s", show_path(src), exc.name, unchecked)
        return frozenset()
    except UnsupportedError:
        raise
    except FormatError as exc:
        log.warning("%s: %s", exc, unchecked)
        return frozenset()
    _warn_unloadable(src, plan)
    if plan.keep:
        log.info("%s: %d 2-D bf16 tensor(s) kept as they are: %s runs them unpacked", show_path(src), len(plan.keep),
                 plan.model)
    return plan.keep


def _warn_unloadable(src: Path, plan) -> None:
    """Say, a warning each, what makes glyd.from_pretrained refuse the packed folder (it is packed all the
    same: glyd unpack gives every tensor back)."""
    refuse = "glyd.from_pretrained will refuse the packed folder"
    if plan.unused:
        more = f" and {len(plan.unused) - 5} more" if len(plan.unused) > 5 else ""
        log.warning("%s: tensor(s) %s%s have no place in %s: %s (glyd unpack gives them back; remove them from the "
                    "source to load it)", show_path(src), ", ".join(plan.unused[:5]), more, plan.model, refuse)
    if plan.mismatched:
        shown = ", ".join(f"{k} {stored} ({plan.model}'s is {want})" for k, stored, want in plan.mismatched[:3])
        more = f" and {len(plan.mismatched) - 3} more" if len(plan.mismatched) > 3 else ""
        log.warning("%s: tensor(s) %s%s have another dtype or shape than config.json's model: %s (glyd unpack gives "
                    "them back; correct config.json to load it)", show_path(src), shown, more, refuse)
    if plan.missing:
        more = f" and {len(plan.missing) - 3} more" if len(plan.missing) > 3 else ""
        log.warning("%s: the folder lacks tensor(s) %s needs: %s%s: %s (correct config.json, or add them, to load "
                    "it)", show_path(src), plan.model, ", ".join(plan.missing[:3]), more, refuse)


def _limit_layout(args: argparse.Namespace, keep: frozenset[str]) -> str:
    """The layout ``--memory-limit`` allows, chosen (auto: the fastest that fits) or checked from the
    source's headers before anything is written: its 2-D bf16 tensors packed at the layout's planning
    bits, every other tensor at its stored bytes (``glyd.hf.memory``, as ``from_pretrained`` counts)."""
    from glyd.hf.memory import WeightsCount, fit_layout
    from glyd.store._source import source_shards

    _, headers, _ = source_shards(Path(args.src))
    packable = other = 0
    rows: Counter[int] = Counter()  # rows by K: each layout pads K (glyd.hf.memory.packable_rows)
    for h in headers.values():
        for name, info in h.tensors.items():
            if info.dtype == "bfloat16" and len(info.shape) == 2 and name not in keep:
                packable += info.shape[0] * info.shape[1]
                rows[info.shape[1]] += info.shape[0]
            else:
                other += info.end - info.begin
    count = WeightsCount(packable, other, tuple(sorted(rows.items())))
    return fit_layout(count, args.layout, args.memory_limit)


def _pack(args: argparse.Namespace) -> int:
    from glyd.store._source import check_utf8_path

    check_utf8_path(Path(args.dst), "destination")  # before the plan, whose refusal names a command writing there
    keep = _loader_keep(args)
    layout = args.layout if args.memory_limit is None else _limit_layout(args, keep)
    summary = folder.pack_folder(args.src, args.dst, layout=layout, progress=_progress(args),
                                 choose=_choose() if layout == "auto" else None, keep=keep)
    print(summary)  # its "kept unpacked" rows list the tensors left as they are, once
    if args.memory_limit is not None:
        _check_packed_folder(Path(args.dst), args.memory_limit, layout)
    return 0


def _check_packed_folder(dst: Path, limit: int, layout: str) -> None:
    # what from_pretrained(dst, memory_limit=limit) will count: the shards' tensors, headers left out
    from glyd.hf.memory import shown, stored_bytes

    reader = CheckpointReader(dst)
    stored = stored_bytes(dst, sorted({reader.entry(n)["file"] for n in reader.names()}))
    if stored > limit:
        size = shown(limit, stored)
        log.warning("%s: the weights take %s as stored, more than the %s --memory-limit allows (counted before "
                    "packing at %s's planning bits a weight)", show_path(dst), size(stored), size(limit), layout)


def _unpack(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    counts = folder.unpack_folder(args.src, args.dst, progress=_progress(args))
    print(
        f"unpacked {counts['tensors']} tensors ({folder._human(counts['bytes'])}) in {counts['shards']} shard(s) "
        f"and {counts['files']} files to {args.dst}, every sha256 checked ({time.perf_counter() - t0:.1f} s)"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    counts = CheckpointReader(args.dir).verify(progress=_progress(args))
    print(
        f"OK {args.dir}: {counts['tensors']} tensors ({counts['packed']} packed, {counts['raw']} raw, "
        f"{counts['weights']:,} weights) and {counts['files']} files match glyd.json "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    return 0


def _info(args: argparse.Namespace) -> int:
    rows, t = folder.info(args.dir)
    if not args.totals:
        table = [
            (
                show_path(r["name"]),  # a name read from the shard (a line break, a terminal escape): quoted
                r["layout"] or "raw",
                f"v{r['format_version']}" if r["layout"] else "-",
                r["dtype"],
                "x".join(map(str, r["shape"])) or "scalar",
                f"{r['bytes']:,}",
                f"{r['bits_per_weight']:.3f}",
            )
            for r in rows
        ]
        print(folder.format_table(["tensor", "layout", "version", "dtype", "shape", "bytes", "bits/weight"], table))
        print()
    layouts = ", ".join(f"{n} {k}" for k, n in sorted(t["layouts"].items())) or "none"
    raw = ", ".join(f"{n} {d}" for d, n in sorted(t["raw_dtypes"].items())) or "none"
    versions = ", ".join(f"{k} v{v}: {n} tensor{'s' if n != 1 else ''}"
                         for (k, v), n in sorted(t["layout_versions"].items())) or "none"
    summary = [
        ("checkpoint", f"{args.dir} (layout {t['layout']})"),
        ("tensors", f"{t['tensors']}: {t['packed']} packed ({layouts}), {t['raw']} kept as is ({raw})"),
        ("format versions", versions),  # per layout: which of its versions the arrays are (docs/format.md)
        (
            "packed matrices",
            f"{t['packed_weights']:,} weights, {folder._human(t['packed_bytes'])}, "
            f"{t['packed_bits_per_weight']:.3f} bits a weight",
        ),
        (
            "all tensors",
            f"{folder._human(t['original_bytes'])} original -> {folder._human(t['bytes'])} stored, "
            f"{t['bits_per_weight']:.3f} bits an element",
        ),
        ("files", str(t["files"])),
    ]
    print(folder.format_table(["", ""], summary, header=False))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "pack",
        help="pack a transformers safetensors folder into a glyd checkpoint",
        description="Pack the 2-D bf16 tensors of a transformers safetensors folder that the model runs packed "
        "(nn.Linear and nn.Embedding weights, found on the model built from config.json on the meta device) "
        "losslessly; keep other tensors as they are; copy config, tokenizer and other files.",
    )
    p.add_argument("src", type=path_arg, help="model folder (model.safetensors or model.safetensors.index.json + shards)")
    p.add_argument("dst", type=path_arg, help="new folder for the packed checkpoint (must not exist)")
    p.add_argument(
        "--layout",
        choices=layout_names(auto=True),
        default="fixed12",
        help=layout_help(auto=True, default="fixed12"),
    )
    p.add_argument("--memory-limit", type=memory_arg, default=None, metavar="SIZE", help=PACK_MEMORY_HELP)
    p.set_defaults(func=_os_errors(limit_option(_pack)))

    p = subparsers.add_parser("unpack", help="write the original bf16 safetensors folder back, bit for bit")
    p.add_argument("src", type=path_arg, help="packed checkpoint folder")
    p.add_argument("dst", metavar="out", type=path_arg, help="new folder for the bf16 model (must not exist)")
    p.set_defaults(func=_os_errors(_unpack))

    p = subparsers.add_parser("verify", help="unpack every tensor and check it against the manifest's sha256")
    p.add_argument("dir", type=path_arg, help="packed checkpoint folder")
    p.set_defaults(func=_os_errors(_verify))

    p = subparsers.add_parser("info", help="list the tensors of a packed checkpoint, their layouts, format versions "
                              "and sizes")
    p.add_argument("dir", type=path_arg, help="packed checkpoint folder")
    p.add_argument("--totals", action="store_true", help="print only the totals")
    p.set_defaults(func=_os_errors(_info))
