"""How the writer cuts a file into chunks (its choice; readers do not depend on it): the float
tensors of a safetensors file by whole rows, every other byte range by bytes.

>>> [(p.offset, p.length, p.dtype) for p in plan_file(20, lambda off, n: bytes(n))]
[(0, 20, 0)]
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Callable

from glyd.filecodec import floats

#: bytes of input in one chunk (float chunks: whole rows of at most this many bytes)
CHUNK_BYTES = 8 << 20
MAX_SAFETENSORS_HEADER = 100 << 20


@dataclasses.dataclass(frozen=True)
class Piece:
    """A byte range of a file and how it is coded."""

    offset: int
    length: int
    dtype: int = 0  # floats.* code; 0 = generic bytes (zstd)
    rows: int = 0
    cols: int = 0


def safetensors_regions(head: bytes, size: int, read: Callable[[int, int], bytes]) -> list[tuple[int, int, int, int]] | None:
    """(offset, length, dtype code, cols) of every float tensor of a safetensors file, sorted, or
    None when the file is not a well-formed safetensors file (it is then coded as plain bytes).
    The header is hostile input: every bound is checked before use."""
    if size < 10 or len(head) < 9:
        return None
    (hlen,) = struct.unpack_from("<Q", head, 0)
    if not 2 <= hlen <= min(MAX_SAFETENSORS_HEADER, size - 8) or head[8:9] != b"{":
        return None
    try:
        meta = json.loads(bytes(read(8, hlen)).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(meta, dict):
        return None
    data_start = 8 + hlen
    data_len = size - data_start
    regions = []
    for name, info in meta.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            return None
        dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not (
            isinstance(dtype, str)
            and isinstance(shape, list)
            and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape)
            and isinstance(offs, list)
            and len(offs) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
            and 0 <= offs[0] <= offs[1] <= data_len
        ):
            return None
        code = floats.SAFETENSORS_DTYPES.get(dtype)
        if code is None or offs[0] == offs[1]:
            continue  # other dtypes (ints, bool, f64) and empty tensors: plain bytes
        n = math.prod(shape)
        if n * floats.ITEMSIZE[code] != offs[1] - offs[0]:
            return None
        cols = shape[-1] if shape else 1
        regions.append((data_start + offs[0], offs[1] - offs[0], code, cols))
    regions.sort()
    for (a, la, _, _), (b, _, _, _) in zip(regions, regions[1:]):
        if a + la > b:
            return None  # overlapping tensors
    return regions


def plan_file(size: int, read: Callable[[int, int], bytes]) -> list[Piece]:
    """Cut a file into chunks: float tensors of a safetensors file by rows, the rest by bytes."""
    head = bytes(read(0, min(size, 9))) if size else b""
    regions = safetensors_regions(head, size, read) or []
    pieces: list[Piece] = []

    def generic(a: int, b: int) -> None:
        for off in range(a, b, CHUNK_BYTES):
            pieces.append(Piece(off, min(CHUNK_BYTES, b - off)))

    pos = 0
    for off, length, code, cols in regions:
        generic(pos, off)
        item = floats.ITEMSIZE[code]
        n = length // item
        line = cols * item
        if cols >= 1 and line <= CHUNK_BYTES:
            rows_per = max(1, CHUNK_BYTES // line)
            total_rows = n // cols
            for r in range(0, total_rows, rows_per):
                rr = min(rows_per, total_rows - r)
                pieces.append(Piece(off + r * line, rr * line, code, rr, cols))
        else:  # very long rows: 1-D slices
            per = CHUNK_BYTES // item
            for e in range(0, n, per):
                k = min(per, n - e)
                pieces.append(Piece(off + e * item, k * item, code, 1, k))
        pos = off + length
    generic(pos, size)
    return pieces
