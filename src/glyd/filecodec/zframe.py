"""Exactly one zstd frame: the archive's zstd chunks and the float codec's zstd blobs are each one
frame that states its content size, with nothing after it (``docs/format.md``). zstandard's
decoders stop at the end of the first frame and ignore what follows, so bytes appended to a
frame would pass unseen; :func:`decode` refuses them.

>>> import zstandard
>>> frame = zstandard.ZstdCompressor().compress(b"abc" * 100)
>>> bytes(decode(frame, 300, "x")) == b"abc" * 100
True
>>> decode(frame + b"junk", 300, "x.glyd: file 'a' chunk 0")
Traceback (most recent call last):
...
glyd.errors.CorruptError: x.glyd: file 'a' chunk 0: 4 bytes after the zstd frame
"""

from __future__ import annotations

import numpy as np
import zstandard as zstd

from glyd.errors import CorruptError

_MAGIC = b"\x28\xb5\x2f\xfd"
_RESERVED_BLOCK, _RLE_BLOCK = 3, 1


def frame_end(data, what: str) -> int:
    """The compressed size of the zstd frame that starts ``data``, read from its block headers
    (RFC 8878, 3.1.1). zstandard has no call for it (libzstd's ZSTD_findFrameCompressedSize is
    not exposed); the walk reads only the 3-byte header of each block (<= 128 KiB of content)."""
    mv = memoryview(data).cast("B")
    n = len(mv)
    if mv[:4] != _MAGIC:
        raise CorruptError(f"{what}: not a zstd frame (no magic)")
    try:
        pos = zstd.frame_header_size(mv)
        checksum = zstd.get_frame_parameters(mv).has_checksum
    except zstd.ZstdError as exc:
        raise CorruptError(f"{what}: bad zstd frame header ({exc})") from None
    last = False
    while not last:
        if pos + 3 > n:
            raise CorruptError(f"{what}: truncated zstd frame")
        head = mv[pos] | mv[pos + 1] << 8 | mv[pos + 2] << 16
        pos += 3
        last, kind, size = bool(head & 1), (head >> 1) & 3, head >> 3
        if kind == _RESERVED_BLOCK:
            raise CorruptError(f"{what}: zstd block of reserved type")
        pos += 1 if kind == _RLE_BLOCK else size
    pos += 4 if checksum else 0
    if pos > n:
        raise CorruptError(f"{what}: truncated zstd frame")
    return pos


def decode(data, raw_len: int, what: str, out: np.ndarray | None = None):
    """The ``raw_len`` bytes of the one zstd frame ``data``: decoded into ``out`` (a uint8 array
    of ``raw_len``) when given, else new bytes. :class:`CorruptError` naming ``what`` when
    ``data`` is not exactly one frame of ``raw_len`` bytes."""
    try:
        size = zstd.frame_content_size(data)
    except zstd.ZstdError as exc:
        raise CorruptError(f"{what}: not a zstd frame ({exc})") from None
    if size != raw_len:
        raise CorruptError(f"{what}: zstd frame holds {size} bytes, expected {raw_len}")
    end = frame_end(data, what)
    if end != len(data):
        raise CorruptError(f"{what}: {len(data) - end} bytes after the zstd frame")
    try:
        if out is None:
            got = zstd.ZstdDecompressor().decompress(data, max_output_size=raw_len)
            n = len(got)
        else:
            reader = zstd.ZstdDecompressor().stream_reader(data, read_across_frames=False)
            dst = memoryview(out)
            n = 0
            while n < raw_len:
                k = reader.readinto(dst[n:])
                if not k:
                    break
                n += k
            if reader.read(1):
                n += 1
            got = out
    except zstd.ZstdError as exc:
        raise CorruptError(f"{what}: zstd error ({exc})") from None
    if n != raw_len:
        raise CorruptError(f"{what}: zstd frame decodes to {n} bytes, expected {raw_len}")
    return got
