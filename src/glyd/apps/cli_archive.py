"""``glyd compress``, ``glyd decompress`` and ``glyd test``: the ``.glyd`` file archive."""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING
from pathlib import Path

from glyd.apps.cli_models import path_arg
from glyd.errors import GlydError, show_path

if TYPE_CHECKING:
    from glyd.filecodec import archive as arc


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:  # the archive code reads 0 as "the default" and a negative count as 1: say so instead
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return n


def _jobs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", "-j", type=_positive, default=None, metavar="N",
                   help="threads (default: all cores, at most 8)")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "compress",
        help="compress files or folders into a .glyd archive (lossless, smaller than zstd on weights)",
        description="Compress files and folders (recursively) into one .glyd archive. safetensors "
        "tensors in bf16, fp16, fp32 and fp8 are entropy coded by dtype; everything else goes through zstd.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", type=path_arg, help="files or folders")
    p.add_argument("-o", "--output", metavar="OUT.glyd", type=path_arg,
                   help="archive to create, never overwritten (default for one PATH: PATH.glyd beside it)")
    _jobs(p)
    p.set_defaults(func=_compress)

    p = subparsers.add_parser("decompress", help="restore the files of a .glyd archive byte for byte")
    p.add_argument("archive", metavar="ARCHIVE", type=path_arg)
    p.add_argument("-o", "--output", metavar="DIR", type=path_arg,
                   help="folder to restore into (default: the archive's folder, so X.glyd gives back X beside it)")
    _jobs(p)
    p.set_defaults(func=_decompress)

    p = subparsers.add_parser("test", help="check every chunk and file hash of a .glyd archive, writing nothing")
    p.add_argument("archive", metavar="ARCHIVE", type=path_arg)
    _jobs(p)
    p.set_defaults(func=_test)


def _summary(verb: str, rep: "arc.Report", seconds: float) -> str:
    mb = rep.original_bytes / 1e6
    return (
        f"{verb} {len(rep.entries)} file(s), {rep.chunks} chunk(s): {rep.original_bytes:,} bytes "
        f"<-> {rep.archive_bytes:,} ({100 * rep.ratio:.2f}%), {mb / max(seconds, 1e-9):.0f} MB/s"
    )


def _os_errors(fn):
    """OS errors (a missing archive, a full disk) as one-line glyd errors."""

    def wrapped(args) -> int:
        try:
            return fn(args)
        except GlydError:
            raise
        except OSError as exc:  # "[Errno 2] No such file or directory: 'x'" becomes "x: No such file or directory"
            where = f"{show_path(os.fsdecode(exc.filename))}: " if exc.filename is not None else ""
            raise GlydError(f"{where}{exc.strerror or exc}") from None

    return wrapped


def default_archive(paths: list[str]) -> Path:
    """``PATH.glyd`` beside the one ``PATH`` (as gzip, xz and zstd name theirs); several paths, or
    one without a name of its own (``.``, ``/``), need ``-o``."""
    src = Path(paths[0])
    if len(paths) != 1 or src.name in ("", ".", ".."):
        what = "several paths" if len(paths) != 1 else repr(paths[0])
        raise GlydError(f"no default archive name for {what}: pass -o OUT.glyd")
    return src.with_name(src.name + ".glyd")


@_os_errors
def _compress(args) -> int:
    from glyd.filecodec import archive as arc  # zstandard: only when a .glyd archive is made or read

    out = Path(args.output) if args.output else default_archive(args.paths)
    t = time.perf_counter()
    rep = arc.compress_files(args.paths, out, jobs=args.jobs, progress=True)  # refuses an existing out
    print(_summary(f"compressed into {out}:", rep, time.perf_counter() - t))
    return 0


@_os_errors
def _decompress(args) -> int:
    from glyd.filecodec import archive as arc  # zstandard: only when a .glyd archive is made or read

    out = Path(args.output) if args.output else Path(args.archive).parent
    t = time.perf_counter()
    rep = arc.decompress(args.archive, out, jobs=args.jobs, progress=True)
    print(_summary(f"restored into {out}:", rep, time.perf_counter() - t))
    return 0


@_os_errors
def _test(args) -> int:
    from glyd.filecodec import archive as arc  # zstandard: only when a .glyd archive is made or read

    t = time.perf_counter()
    rep = arc.test(args.archive, jobs=args.jobs, progress=True)
    print(_summary(f"{args.archive}: OK,", rep, time.perf_counter() - t))
    return 0
