"""``glyd.filecodec``: lossless ``.glyd`` archives of checkpoints (and any other files), smaller
than zstd, restored byte for byte.

>>> import glyd.filecodec as fc
>>> blob = fc.compress_bytes(b"any bytes at all" * 100)
>>> fc.decompress_bytes(blob) == b"any bytes at all" * 100
True

Files and folders: ``fc.compress_files(["model/"], "model.glyd")``, ``fc.test("model.glyd")``,
``fc.decompress("model.glyd", "out/")``. Command line: ``glyd compress``, ``glyd decompress``,
``glyd test``. Guide: ``docs/filecodec.md``; byte layout: ``docs/format.md``.
"""

from __future__ import annotations

from glyd.filecodec.archive import (
    MAGIC,
    SUFFIX,
    VERSION,
    Entry,
    Report,
    compress_bytes,
    compress_files,
    decompress,
    decompress_bytes,
    list_entries,
    test,
)

__all__ = [
    "MAGIC",
    "SUFFIX",
    "VERSION",
    "Entry",
    "Report",
    "compress_bytes",
    "compress_files",
    "decompress",
    "decompress_bytes",
    "list_entries",
    "test",
]
