"""Progress bars (shown from PROGRESS_MIN_BYTES on; lowered here so that small archives show one):
each says what runs, and an error is printed on its own line, not glued to the bar."""

from __future__ import annotations

import pytest

import glyd.filecodec as fc
from glyd.cli import main
from glyd.errors import GlydError
from glyd.filecodec import archive as arc


@pytest.fixture
def archive(tmp_path, monkeypatch):
    monkeypatch.setattr(arc, "PROGRESS_MIN_BYTES", 0)
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(name * 5000)
    out = tmp_path / "ab.glyd"
    fc.compress_files([tmp_path / "a.txt", tmp_path / "b.txt"], out)
    return out


def damaged(archive):
    blob = bytearray(archive.read_bytes())
    blob[-60] ^= 0xFF  # in the last file's chunk: the bar has moved by then
    bad = archive.with_name("bad.glyd")
    bad.write_bytes(bytes(blob))
    return bad


def error_line(err: str, command: str) -> str:
    """The error line, which must start a line of its own (a bar redraws with '\\r', no '\\n')."""
    lines = [line for line in err.split("\n") if "error:" in line]
    assert len(lines) == 1 and lines[0].startswith(f"glyd {command}: error: "), repr(err)
    return lines[0]


def test_test_bar_says_test_and_error_on_its_own_line(archive, capsys):
    assert main(["test", str(archive)]) == 0
    err = capsys.readouterr().err
    assert "test: 100%" in err and "decompress" not in err, repr(err)
    assert main(["test", str(damaged(archive))]) == 1
    err = capsys.readouterr().err
    assert "b.txt" in error_line(err, "test") and "test:" in err and "decompress" not in err


def test_decompress_error_on_its_own_line(archive, tmp_path, capsys):
    assert main(["decompress", str(damaged(archive)), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "b.txt" in error_line(err, "decompress") and "decompress:" in err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_compress_error_on_its_own_line(archive, tmp_path, capsys, monkeypatch):
    encode = arc._encode_piece
    calls = []

    def fail_on_second(piece, data):
        calls.append(piece)
        if len(calls) == 2:
            raise GlydError("b.txt: changed while being compressed")
        return encode(piece, data)

    monkeypatch.setattr(arc, "_encode_piece", fail_on_second)
    out = tmp_path / "new.glyd"
    assert main(["compress", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), "-o", str(out), "-j", "1"]) == 1
    err = capsys.readouterr().err
    assert "changed" in error_line(err, "compress") and "compress:" in err
    assert not out.exists()
