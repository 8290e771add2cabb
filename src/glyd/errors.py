"""Exceptions raised by glyd. Every one names the file, tensor or field at fault."""

import os
import stat


class GlydError(Exception):
    """Base class of glyd's errors."""


class FormatError(GlydError, ValueError):
    """A file or packed array set is not in a format glyd can read (bad magic, version, shape)."""


class CorruptError(GlydError):
    """Data is damaged: truncated, a checksum or sha256 that does not match."""


class DestinationExistsError(GlydError, FileExistsError):
    """An output path already exists; glyd never overwrites."""


class MissingDependencyError(GlydError, ImportError):
    """An optional package that a command or function needs is not installed; the message names it
    and the extra of glyd that installs it."""


class UnsupportedError(GlydError, ValueError):
    """A request glyd cannot honour (for a packed model: an option, a placement, a dtype; a
    destination inside the folder being read); it is refused before anything is loaded, written or
    changed, never dropped silently."""


def show_path(path: object) -> str:
    """``path`` as a message prints it: as it is, or quoted (its repr) when it holds a line break, a
    terminal escape or another character that is not printable (a byte that is not UTF-8), so that a
    one-line message stays one line and says exactly which path.

    >>> show_path("/tmp/model"), show_path("/tmp/a\\nb")
    ('/tmp/model', "'/tmp/a\\\\nb'")
    """
    text = os.fsdecode(path) if isinstance(path, (bytes, os.PathLike)) else str(path)
    return text if text.isprintable() else repr(text)


def cause(exc: BaseException, limit: int = 200) -> str:
    """``exc`` for a one-line message that it caused: its type and its first sentence, line breaks
    folded (transformers' messages run to several lines and sentences), cut to ``limit`` characters.

    >>> cause(ValueError("Validation error for field 'n':\\n    TypeError: expected int. See the docs."))
    "ValueError: Validation error for field 'n': TypeError: expected int"
    """
    why = " ".join(str(exc).split()).split(". ")[0]
    why = why if len(why) <= limit else why[: limit - 3] + "..."
    return f"{type(exc).__name__}: {why}"


def not_a_file(path: object) -> str | None:
    """What ``path`` is when it is not a regular file (after links), for a message that says why it
    is refused (``"missing"``, ``"a folder"``, ``"a symbolic link to /dev/zero, a character device"``);
    None for a regular file. Reading a FIFO would block and a device never ends: check first.

    >>> not_a_file("/dev/null"), not_a_file(__file__)
    ('a character device', None)
    """
    p = os.fspath(path)
    link = os.path.islink(p)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        return "a broken symbolic link" if link else "missing"
    except OSError as exc:  # a loop of links, a name too long, no permission
        return f"unreadable ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    kind = next((what for test, what in kinds if test(mode)), "not a regular file")
    return f"a symbolic link to {os.path.realpath(p)}, {kind}" if link else kind
