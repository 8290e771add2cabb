"""The records of a ``.glyd`` archive (:mod:`glyd.filecodec.archive`), written and read back with
every check: the header and its file table, each chunk's record and payload codec, the per-file end
record and the end marker. The byte layout is in ``docs/format.md`` ("File archives").

A reader checks every tag, index, length and CRC here before it allocates or decodes anything; the
archive module strings these records into whole archives.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from collections.abc import Iterator

import zstandard as zstd

from glyd.errors import CorruptError, FormatError, GlydError
from glyd.filecodec import floats, zframe
from glyd.filecodec.names import MAX_FILE_SIZE, MAX_FILES, check_table
from glyd.filecodec.plan import Piece

MAGIC = b"GLYDARC\x00"
VERSION = 1

CODEC_STORE, CODEC_ZSTD, CODEC_FLOAT = 0, 1, 2
CODEC_NAMES = {CODEC_STORE: "store", CODEC_ZSTD: "zstd", CODEC_FLOAT: "float"}

#: limits a reader enforces before allocating anything
MAX_CHUNK_BYTES = 64 << 20
MAX_TABLE_BYTES = 64 << 20

_HEAD = struct.Struct("<8sHHI")  # magic, version, flags, table length
_CHUNK = struct.Struct("<cIIBIII")  # b"C", file, chunk, codec, raw length, payload length, crc32
_END = struct.Struct("<cII32s")  # b"E", file, number of chunks, sha256
_TAIL = struct.Struct("<cI8s")  # b"Z", number of files, magic


@dataclasses.dataclass(frozen=True)
class Entry:
    """One file of an archive: its path inside the archive (POSIX, relative) and size in bytes."""

    path: str
    size: int


# ----------------------------------------------------------------------------- chunk coding


def _encode_piece(piece: Piece, data) -> tuple[int, list]:
    """-> (codec, payload as a list of buffers)."""
    if piece.dtype:
        return CODEC_FLOAT, floats.encode_parts(piece.dtype, data, piece.rows, piece.cols)
    # small pieces (safetensors headers, configs) get zstd's strongest level, big ones a fast one
    level = 19 if len(data) <= 1 << 16 else 3
    z = zstd.ZstdCompressor(level=level).compress(data)
    if len(z) < len(data):
        return CODEC_ZSTD, [z]
    return CODEC_STORE, [data]


def _decode_chunk(codec: int, payload: bytes, raw_len: int, what: str):
    if codec == CODEC_STORE:
        if len(payload) != raw_len:
            raise CorruptError(f"{what}: stored chunk of {len(payload)} bytes, expected {raw_len}")
        return payload
    if codec == CODEC_ZSTD:
        return zframe.decode(payload, raw_len, what)
    if codec == CODEC_FLOAT:
        return floats.decode(payload, raw_len, what)
    raise CorruptError(f"{what}: unknown chunk codec {codec}")


def _record(file_idx: int, chunk_idx: int, codec: int, raw_len: int, payload: list) -> list:
    """A chunk record as a list of buffers; the CRC-32 covers the record header and the payload."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        payload = [payload]
    plen = sum(len(memoryview(p).cast("B")) for p in payload)
    head = _CHUNK.pack(b"C", file_idx, chunk_idx, codec, raw_len, plen, 0)[:-4]
    crc = zlib.crc32(head)
    for p in payload:
        crc = zlib.crc32(p, crc)
    return [head + struct.pack("<I", crc), *payload]


# ----------------------------------------------------------------------------- reading


class _Reader:
    def __init__(self, f, label: str):
        self.f = f
        self.label = label
        self.pos = 0

    def read(self, n: int, what: str, *args) -> bytes:
        """``n`` bytes; ``what.format(*args)`` names them if the archive ends first (formatted
        only then: this runs a few times for every file)."""
        b = self.f.read(n)
        if len(b) != n:
            raise CorruptError(f"{self.label}: truncated archive ({what.format(*args)}, at byte {self.pos})")
        self.pos += n
        return b


def _read_table(r: _Reader) -> list[Entry]:
    head = r.f.read(_HEAD.size)
    r.pos += len(head)
    if head and len(head) < 8 and MAGIC.startswith(head):
        raise CorruptError(f"{r.label}: truncated archive (magic)")
    if len(head) < 8 or head[:8] != MAGIC:
        raise FormatError(f"{r.label}: not a glyd archive (no {MAGIC!r} magic)")
    if len(head) < _HEAD.size:
        raise CorruptError(f"{r.label}: truncated archive (header)")
    _, version, flags, tlen = _HEAD.unpack(head)
    if version != VERSION:
        raise FormatError(f"{r.label}: archive version {version}; this glyd reads version {VERSION}")
    if flags != 0:
        raise FormatError(f"{r.label}: unknown header flags {flags:#x}")
    if tlen > MAX_TABLE_BYTES:
        raise CorruptError(f"{r.label}: file table of {tlen} bytes")
    table = r.read(tlen, "file table")
    (crc,) = struct.unpack("<I", r.read(4, "file table"))
    if zlib.crc32(table) != crc:
        raise CorruptError(f"{r.label}: file table checksum mismatch")
    try:
        files = json.loads(table.decode("utf-8"))["files"]
        if not isinstance(files, list) or len(files) > MAX_FILES:
            raise ValueError("files")
        table = []
        for i, e in enumerate(files):
            path, size = e["path"], e["size"]
            if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE_SIZE:
                raise ValueError(f"size of file {i}")
            table.append((path, size))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as exc:
        raise CorruptError(f"{r.label}: bad file table ({exc})") from None
    check_table(table, lambda i: f"{r.label}: file {i}")
    return [Entry(path, size) for path, size in table]


def _records(r: _Reader, entries: list[Entry]) -> Iterator[tuple]:
    """Every record of the archive, checked (tags, indices, bounds, CRC) but not decoded, in
    order: ``("file", fi)``, ``("chunk", codec, payload, raw_len, what)`` for each chunk of file
    ``fi``, ``("end", fi, sha256)``."""
    label = r.label
    for fi, entry in enumerate(entries):
        yield ("file", fi)
        got = ci = 0
        while True:
            tag = r.read(1, "file {!r} chunk {}", entry.path, ci)
            if tag == b"E":
                _, efi, n, sha = _END.unpack(tag + r.read(_END.size - 1, "end of file {!r}", entry.path))
                if efi != fi or n != ci or got != entry.size:
                    raise CorruptError(
                        f"{label}: file {entry.path!r}: end record says file {efi}, {n} chunks; "
                        f"read {ci} chunks, {got} of {entry.size} bytes"
                    )
                yield ("end", fi, sha)
                break
            what = f"{label}: file {entry.path!r} chunk {ci}"
            if tag != b"C":
                raise CorruptError(f"{what}: bad record tag {tag!r}")
            head = tag + r.read(_CHUNK.size - 1, "{}", what)
            _, cfi, cci, codec, raw_len, plen, crc = _CHUNK.unpack(head)
            if cfi != fi or cci != ci:
                raise CorruptError(f"{what}: record is labelled file {cfi} chunk {cci}")
            if raw_len == 0 or raw_len > MAX_CHUNK_BYTES or plen > MAX_CHUNK_BYTES + (1 << 16):
                raise CorruptError(f"{what}: chunk sizes {raw_len}/{plen} out of bounds")
            if got + raw_len > entry.size:
                raise CorruptError(f"{what}: chunks run past the file size {entry.size}")
            payload = r.read(plen, "file {!r} chunk {}", entry.path, ci)
            if zlib.crc32(payload, zlib.crc32(head[:-4])) != crc:
                raise CorruptError(f"{what}: checksum mismatch")
            got += raw_len
            yield ("chunk", codec, payload, raw_len, what)
            ci += 1


def _decode_record(item: tuple) -> tuple:
    """``("chunk", ...)`` of :func:`_records` -> ``("data", bytes)``."""
    _, codec, payload, raw_len, what = item
    try:
        return ("data", _decode_chunk(codec, payload, raw_len, what))
    except GlydError:
        raise
    except (ValueError, IndexError, TypeError, struct.error, zstd.ZstdError) as exc:
        # a payload that passed its CRC yet does not decode: crafted, or a writer bug
        raise CorruptError(f"{what}: undecodable payload ({type(exc).__name__}: {exc})") from None
