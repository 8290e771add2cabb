"""The ``glyd`` command line.

Each area of the package registers its own sub-commands through a ``register(subparsers)``
function in its ``cli`` module, so this file only wires them together. A sub-command's handler
returns an exit code; errors derived from :class:`glyd.errors.GlydError` print one clear line
and exit with status 1; Ctrl-C exits with 130 and SIGTERM with 143, each after one line and after
the command's cleanup (nothing half-written is left).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading

from glyd import __version__
from glyd.apps._deps import EXTRAS, missing
from glyd.errors import GlydError

# Modules that add sub-commands; imported only when the CLI runs.
_COMMAND_MODULES = (
    "glyd.apps.cli_store",  # pack, unpack, verify, info
    "glyd.apps.cli_models",  # demo, fit, eval
    "glyd.apps.cli_archive",  # compress, decompress, test
    "glyd.apps.cli_bench",  # bench
    "glyd.apps.cli_serve",  # serve
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
        # Every command module is part of the package and imports without any optional dependency
        # (those are imported inside the handlers): a failing import is a bug, so it is raised, not
        # turned into a missing command.
        importlib.import_module(name).register(sub)
    return parser


class Terminated(BaseException):
    """SIGTERM, raised in the main thread like KeyboardInterrupt, so that every ``finally`` and
    ``except BaseException`` cleanup (a writer's temporary folder) runs before the exit."""


def _on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
    raise Terminated


def _install_sigterm() -> object:
    """Turn SIGTERM into :class:`Terminated` for the duration of a command; returns the handler to
    restore (a sentinel when none was installed: not the main thread, or no SIGTERM here)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return _NOT_INSTALLED
    try:
        return signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):
        return _NOT_INSTALLED


_NOT_INSTALLED = object()


def _only_version(argv: list[str]) -> bool:
    """``glyd --version`` (before any command word): answered before the commands' modules (and
    torch) are imported, so that it takes well under a second."""
    for token in argv:
        if token == "--version":
            return True
        if not token.startswith("-"):
            return False
    return False


def main(argv: list[str] | None = None) -> int:
    if _only_version(sys.argv[1:] if argv is None else list(argv)):
        print(f"glyd {__version__}")
        return 0
    previous = _install_sigterm()
    prog = "glyd"
    try:
        # Start-up imports every area's commands (torch, transformers: seconds): Ctrl-C or SIGTERM
        # there gets the same one-line answer as during a command.
        parser = build_parser()
        args = parser.parse_args(argv)
        prog = f"glyd {args.command}" if getattr(args, "command", None) else "glyd"
        level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe is reported here, not at interpreter exit
        return rc
    except GlydError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        # An optional package a command reached for is not installed: say which, and the extra.
        name = (exc.name or "").split(".")[0]
        if name not in EXTRAS:
            raise
        print(f"{prog}: error: {missing(name)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``glyd info DIR | head``): stop quietly, as other tools do; what is
        # still buffered for stdout goes nowhere instead of raising again at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141
    except Terminated:
        print(f"{prog}: terminated", file=sys.stderr)
        return 128 + int(signal.SIGTERM)
    finally:
        if previous is not _NOT_INSTALLED:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
