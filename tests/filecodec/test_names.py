"""Whatever ``compress`` accepts, ``decompress`` restores: file names the reader would refuse are
refused at compress time, naming the file, and the longest names a file system allows restore
(the temporary names outputs are written under do not grow with the file's name)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from pathlib import Path

import pytest

import glyd.filecodec as fc
from glyd.cli import main
from glyd.errors import FormatError
from glyd.filecodec import archive as arc
from glyd.filecodec import names


def name_max(folder: Path) -> int:
    return os.pathconf(folder, "PC_NAME_MAX")


def test_longest_name_restores(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    longest = "x" * name_max(src)
    (src / longest).write_bytes(b"weights")
    archive = tmp_path / ("a" * (name_max(tmp_path) - len(".glyd")) + ".glyd")  # -o of the longest name too
    fc.compress_files([src / longest], archive)
    fc.test(archive)
    out = tmp_path / "out"
    fc.decompress(archive, out)
    assert (out / longest).read_bytes() == b"weights"
    assert sorted(p.name for p in out.iterdir()) == [longest]  # no temporary file left


def test_longest_name_restores_on_the_cli(tmp_path, capsys):
    longest = "y" * name_max(tmp_path)
    (tmp_path / longest).write_bytes(b"1234")
    archive = tmp_path / "a.glyd"
    assert main(["compress", str(tmp_path / longest), "-o", str(archive)]) == 0
    assert main(["test", str(archive)]) == 0
    assert main(["decompress", str(archive), "-o", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert (tmp_path / "out" / longest).read_bytes() == b"1234"


def test_backslash_name_refused_at_compress(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a\\b.txt").write_text("x")
    archive = tmp_path / "a.glyd"
    for inp in (tmp_path / "in" / "a\\b.txt", tmp_path / "in"):  # the file itself, or inside a folder
        with pytest.raises(FormatError, match=r"a\\b\.txt: bad file name '(in/)?a\\\\b\.txt'"):
            fc.compress_files([inp], archive)
        assert not archive.exists() and not list(tmp_path.glob(".glyd-*"))
    assert main(["compress", str(tmp_path / "in"), "-o", str(archive)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "glyd compress: error:" in err and "a\\\\b.txt" in err and "Traceback" not in err


def test_file_and_folder_of_one_name_refused_at_compress(tmp_path):
    # x/a (a file, stored as "a") and y/a/ (a folder, stored as "a/b"): the reader refuses a file
    # under another file's name, so compress must refuse it too
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "a").write_text("1")
    (tmp_path / "y" / "a").mkdir(parents=True)
    (tmp_path / "y" / "a" / "b").write_text("2")
    with pytest.raises(FormatError, match="'a/b' lies under 'a', which is a file"):
        fc.compress_files([tmp_path / "x" / "a", tmp_path / "y" / "a"], tmp_path / "o.glyd")
    assert not (tmp_path / "o.glyd").exists()


def test_non_utf8_name_restores(tmp_path):
    src = os.fsencode(tmp_path) + b"/in"
    os.mkdir(src)
    name = b"w\xff\xfe.bin"
    with open(src + b"/" + name, "wb") as f:
        f.write(b"raw bytes name")
    archive = tmp_path / "a.glyd"
    fc.compress_files([os.fsdecode(src)], archive)
    fc.decompress(archive, tmp_path / "out")
    with open(os.fsencode(tmp_path) + b"/out/in/" + name, "rb") as f:
        assert f.read() == b"raw bytes name"


def crafted(name: str) -> bytes:
    """A one-file archive whose file table holds ``name`` (the bytes 'abc'), written by hand."""
    rec = b"".join(arc._record(0, 0, arc.CODEC_STORE, 3, b"abc"))
    table = json.dumps({"files": [{"path": name, "size": 3}]}).encode()
    head = arc._HEAD.pack(fc.MAGIC, fc.VERSION, 0, len(table)) + table + struct.pack("<I", zlib.crc32(table))
    end = arc._END.pack(b"E", 0, 1, hashlib.sha256(b"abc").digest())
    return head + rec + end + arc._TAIL.pack(b"Z", 1, fc.MAGIC)


@pytest.mark.parametrize(
    "name",
    ["a.txt", "d/e/f.bin", "a\\b", "/abs", "../up", "a/../b", "a//b", "./a", "a/", "", "nul\x00", "\udcff.bin",
     "\ud800", "line\nbreak", "sp ace", "é.txt"],
)
def test_writer_and_reader_accept_the_same_names(tmp_path, name):
    try:
        blob = fc.compress_bytes(b"abc", name)
        written = True
    except FormatError:
        written = False
    try:
        assert fc.decompress_bytes(crafted(name)) == b"abc"
        read = True
    except FormatError:
        read = False
    assert written == read, (name, written, read)
    if written:
        assert fc.decompress_bytes(blob) == b"abc"
    else:  # on disk too: a one-line error, not a traceback, and nothing written
        (tmp_path / "bad.glyd").write_bytes(crafted(name))
        (tmp_path / "out").mkdir()
        for run in (lambda: fc.test(tmp_path / "bad.glyd"), lambda: fc.decompress(tmp_path / "bad.glyd", tmp_path / "out")):
            with pytest.raises(FormatError, match="file name"):
                run()
        assert list((tmp_path / "out").iterdir()) == []


def test_compress_refuses_tables_the_reader_refuses(tmp_path, monkeypatch):
    for i in range(3):
        (tmp_path / f"f{i}.txt").write_text("x")
    inputs = [tmp_path / f"f{i}.txt" for i in range(3)]
    archive = tmp_path / "a.glyd"
    monkeypatch.setattr(arc, "MAX_TABLE_BYTES", 60)
    with pytest.raises(FormatError, match="file table would take"):
        fc.compress_files(inputs, archive)
    monkeypatch.undo()
    monkeypatch.setattr(names, "MAX_FILES", 2)
    with pytest.raises(FormatError, match="3 files; an archive holds at most 2"):
        fc.compress_files(inputs, archive)
    assert sorted(tmp_path.iterdir()) == inputs
