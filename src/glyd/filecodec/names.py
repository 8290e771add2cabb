r"""Which file tables an archive may hold: the one rule that the writer (``glyd compress``) and the
reader (``glyd test``, ``glyd decompress``) both apply, so that whatever compress accepts,
decompress restores.

A name is a relative POSIX path: no leading ``/``, no ``\`` and no NUL, no empty, ``.`` or
``..`` part, and it must map to bytes on this system (names read from a disk always do; a
crafted table may hold a lone surrogate that does not). No name twice, no file under another
file's name, at most :data:`MAX_FILES` files of at most :data:`MAX_FILE_SIZE` bytes each.
``docs/format.md`` ("File archives") states the same rules.

>>> check_table([("model/config.json", 2), ("model/w.safetensors", 10)], lambda i: f"file {i}")
>>> check_table([("a\\b", 1)], lambda i: f"file {i}")
Traceback (most recent call last):
...
glyd.errors.FormatError: file 0: bad file name 'a\\b' (archive names are POSIX paths: no '\' or NUL)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from glyd.errors import FormatError

MAX_FILES = 1 << 20
MAX_FILE_SIZE = 1 << 50


def name_problem(path: str) -> str | None:
    """Why ``path`` cannot name a file of an archive, or None when it can."""
    if not isinstance(path, str) or not path:
        return f"bad file name {path!r} (empty or not a string)"
    if "\x00" in path or "\\" in path:
        return f"bad file name {path!r} (archive names are POSIX paths: no '\\' or NUL)"
    wrapped = f"/{path}/"  # an empty, "." or ".." part, or a leading "/", shows as one of these
    if "//" in wrapped or "/./" in wrapped or "/../" in wrapped:
        return f"unsafe file name {path!r} (absolute, or with an empty, '.' or '..' part)"
    if not path.isascii():
        try:
            os.fsencode(path)
        except UnicodeError:
            return f"bad file name {path!r} (not a name this system can write)"
    return None


def check_table(entries: Sequence[tuple[str, int]], where: Callable[[int], str]) -> None:
    """Raise :class:`FormatError` for the first (path, size) of ``entries`` that an archive may
    not hold; ``where(i)`` names entry ``i`` in the message (the input file, or the archive and
    the file's index). Linear in the total length of the names."""
    if len(entries) > MAX_FILES:
        raise FormatError(f"{where(MAX_FILES)}: {len(entries)} files; an archive holds at most {MAX_FILES}")
    seen: set[str] = set()
    for i, (path, size) in enumerate(entries):
        why = name_problem(path)
        if why:
            raise FormatError(f"{where(i)}: {why}")
        if not 0 <= size <= MAX_FILE_SIZE:
            raise FormatError(f"{where(i)}: {path!r} has {size} bytes; an archive file holds 0 to {MAX_FILE_SIZE}")
        if path in seen:
            raise FormatError(f"{where(i)}: file name {path!r} is used twice (two files of the same name)")
        seen.add(path)
    for i, (path, _) in enumerate(entries):
        k = path.find("/")
        while k != -1:
            if path[:k] in seen:
                raise FormatError(f"{where(i)}: {path!r} lies under {path[:k]!r}, which is a file")
            k = path.find("/", k + 1)
