"""A zstd chunk or blob is exactly one zstd frame: bytes after it (junk, a second frame, a
skippable frame) make the archive corrupt, named by the archive, file and chunk."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
import torch
import zstandard as zstd
from safetensors.torch import save_file

import glyd.filecodec as fc
from glyd.errors import CorruptError
from glyd.filecodec import archive as arc
from glyd.filecodec import floats as F
from glyd.filecodec import zframe


def chunk_offsets(blob: bytes) -> list[tuple[int, int, int, int]]:
    """(file, chunk, payload offset, payload length) of every chunk record."""
    _, _, _, tlen = arc._HEAD.unpack_from(blob, 0)
    pos, out = arc._HEAD.size + tlen + 4, []
    while blob[pos : pos + 1] != b"Z":
        if blob[pos : pos + 1] == b"E":
            pos += arc._END.size
            continue
        _, fi, ci, _, _, plen, _ = arc._CHUNK.unpack_from(blob, pos)
        out.append((fi, ci, pos + arc._CHUNK.size, plen))
        pos += arc._CHUNK.size + plen
    return out


def assert_rejected(tmp_path, blob: bytes, match: str) -> None:
    """test, decompress (leaving nothing) and decompress_bytes all refuse ``blob``."""
    bad = tmp_path / "bad.glyd"
    bad.write_bytes(blob)
    out = tmp_path / "out"
    out.mkdir()
    for run in (lambda: fc.test(bad), lambda: fc.decompress(bad, out), lambda: fc.decompress_bytes(blob)):
        with pytest.raises(CorruptError, match=match):
            run()
    assert list(out.iterdir()) == []

TRAILERS = {
    "junk": b"junk",
    "one zero": b"\0",
    "second frame": zstd.ZstdCompressor().compress(b"more"),
    "empty frame": zstd.ZstdCompressor().compress(b""),
    "skippable frame": struct.pack("<II", 0x184D2A50, 3) + b"abc",
}


def with_payload(blob: bytes, at: int, payload: bytes) -> bytes:
    """``blob`` with the chunk record at payload offset ``at`` given a new payload (and a CRC
    that matches it: the damage is crafted, not a flipped bit)."""
    head = at - arc._CHUNK.size
    _, fi, ci, codec, raw_len, plen, _ = arc._CHUNK.unpack_from(blob, head)
    rec = b"".join(arc._record(fi, ci, codec, raw_len, payload))
    return blob[:head] + rec + blob[at + plen :]


@pytest.mark.parametrize("trailer", TRAILERS, ids=list(TRAILERS))
def test_zstd_chunk_with_trailing_bytes_is_corrupt(tmp_path, trailer):
    blob = fc.compress_bytes(b"hello zstd " * 500, "notes.txt")
    ((_, ci, off, plen),) = chunk_offsets(blob)
    assert blob[off - arc._CHUNK.size + 9] == arc.CODEC_ZSTD
    bad = with_payload(blob, off, blob[off : off + plen] + TRAILERS[trailer])
    assert_rejected(tmp_path, bad, rf"(bad\.glyd|<bytes>): file 'notes\.txt' chunk {ci}: \d+ bytes after the zstd frame")


def float_blobs(payload: bytes) -> tuple[int, list[tuple[int, int, int, int]]]:
    """(offset of the blob heads, [(codec, stored, raw_len, data offset)]) of a float payload."""
    off = F._HEADER.size
    (ntab,) = struct.unpack_from("<H", payload, off)
    off += 2 + ntab
    (nblobs,) = struct.unpack_from("<I", payload, off)
    heads_at = off + 4
    data = heads_at + nblobs * F._BLOB.size
    out = []
    for i in range(nblobs):
        codec, stored, raw_len = F._BLOB.unpack_from(payload, heads_at + i * F._BLOB.size)
        out.append((codec, stored, raw_len, data))
        data += stored
    return heads_at, out


@pytest.mark.parametrize("trailer", TRAILERS, ids=list(TRAILERS))
def test_float_blob_with_trailing_bytes_is_corrupt(tmp_path, trailer):
    p = tmp_path / "m.safetensors"
    save_file({"w": (torch.randn(300, 256, generator=torch.Generator().manual_seed(0)) * 0.02).to(torch.bfloat16)}, str(p))
    blob = fc.compress_bytes(p.read_bytes(), "m.safetensors")
    (fi, ci, off, plen) = next(o for o in chunk_offsets(blob) if blob[o[2] - arc._CHUNK.size + 9] == arc.CODEC_FLOAT)
    payload = bytearray(blob[off : off + plen])
    heads_at, blobs = float_blobs(bytes(payload))
    i, (codec, stored, raw_len, at) = next((i, b) for i, b in enumerate(blobs) if b[0] == F.BLOB_ZSTD)
    junk = TRAILERS[trailer]
    struct.pack_into("<BII", payload, heads_at + i * F._BLOB.size, codec, stored + len(junk), raw_len)
    payload[at + stored : at + stored] = junk
    bad = with_payload(blob, off, bytes(payload))
    assert_rejected(tmp_path, bad, rf"file 'm\.safetensors' chunk {ci}: \d+ bytes after the zstd frame")


@pytest.mark.parametrize("size", [0, 1, 100, 200_000, 1 << 20])
@pytest.mark.parametrize("kw", [{"level": 1}, {"level": 19}, {"level": 3, "write_checksum": True}])
def test_frame_end_matches_zstandard(size, kw):
    # random bytes give raw blocks, zeros RLE blocks, text compressed ones
    rng = np.random.default_rng(size)
    for data in (rng.bytes(size), bytes(size), (b"weights and biases " * (size // 19 + 1))[:size]):
        frame = zstd.ZstdCompressor(**kw).compress(data)
        assert zframe.frame_end(frame + os.urandom(7), "f") == len(frame)
        assert bytes(zframe.decode(frame, size, "f")) == data
        out = np.empty(size, np.uint8)
        assert zframe.decode(frame, size, "f", out=out) is out and out.tobytes() == data
        for cut in (1, 3, len(frame) // 2):
            if cut < len(frame):
                with pytest.raises(CorruptError, match="f: "):
                    zframe.decode(frame[: len(frame) - cut], size, "f")
