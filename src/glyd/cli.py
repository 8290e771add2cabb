"""The ``glyd`` command line.

Each area of the package registers its own sub-commands through a ``register(subparsers)``
function in its ``cli`` module, so this file only wires them together. A sub-command's handler
returns an exit code; errors derived from :class:`glyd.errors.GlydError` print one clear line
and exit with status 1.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from glyd import __version__
from glyd.errors import GlydError

# Modules that add sub-commands; imported only when the CLI runs.
_COMMAND_MODULES = (
    "glyd.store.cli",  # pack, unpack, verify, info
    "glyd.hf.cli",  # demo, fit, eval
    "glyd.filecodec.cli",  # compress, decompress, test
    "glyd.kernels.cli",  # bench
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glyd",
        description="Lossless bf16 weight compression: pack, inspect and run models at ~11 bits a weight.",
    )
    parser.add_argument("--version", action="version", version=f"glyd {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # An area not built yet, or an optional dependency missing: its commands are absent.
            logging.getLogger("glyd").debug("commands of %s unavailable: %s", name, exc)
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except GlydError as exc:
        print(f"glyd {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"glyd {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
