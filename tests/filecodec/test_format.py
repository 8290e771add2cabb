"""Format pins: the version-1 archive in tests/data/filecodec_v1 must still load, and it exercises
every coding path of format 1 (regenerate only for a new format version: make_golden.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import glyd.filecodec as fc
from glyd.filecodec import archive as arc
from glyd.filecodec import floats as F

DATA = Path(__file__).resolve().parents[1] / "data" / "filecodec_v1"


def test_magic_and_version_pinned():
    assert fc.MAGIC == b"GLYDARC\x00" and fc.VERSION == 1
    blob = (DATA / "v1.glyd").read_bytes()
    assert blob[:8] == fc.MAGIC and blob[8:10] == b"\x01\x00"
    assert blob[-8:] == fc.MAGIC
    assert arc._HEAD.size == 16 and arc._CHUNK.size == 22 and arc._END.size == 41 and arc._TAIL.size == 13


def test_v1_archive_still_restores(tmp_path):
    want = json.loads((DATA / "v1.json").read_text())
    fc.test(DATA / "v1.glyd")
    fc.decompress(DATA / "v1.glyd", tmp_path)
    got = {p.relative_to(tmp_path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.rglob("*") if p.is_file()}
    assert got == want


def test_v1_archive_covers_every_path():
    blob = (DATA / "v1.glyd").read_bytes()
    _, _, _, tlen = arc._HEAD.unpack_from(blob, 0)
    pos = arc._HEAD.size + tlen + 4
    codecs, kinds, modes, symmodes = set(), set(), set(), set()
    while blob[pos : pos + 1] != b"Z":
        if blob[pos : pos + 1] == b"E":
            pos += arc._END.size
            continue
        _, _, _, codec, _, plen, _ = arc._CHUNK.unpack_from(blob, pos)
        payload = blob[pos + arc._CHUNK.size : pos + arc._CHUNK.size + plen]
        codecs.add(codec)
        if codec == arc.CODEC_FLOAT:
            kind, mode, _, symmode, _, _ = F._HEADER.unpack_from(payload, 0)
            kinds.add(kind)
            modes.add(mode)
            if kind in (F.BF16, F.F32):
                symmodes.add(symmode)
        pos += arc._CHUNK.size + plen
    assert codecs == {arc.CODEC_ZSTD, arc.CODEC_FLOAT}
    assert kinds == {F.BF16, F.F16, F.F32, F.F8_E4M3, F.F8_E5M2}
    assert modes == {F.MODE_NONE, F.MODE_ROWS, F.MODE_COLS}
    assert symmodes == {F.SYM_EXP, F.SYM_WINDOW, F.SYM_TABLE}
