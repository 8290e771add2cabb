"""Nothing is ever overwritten: a destination that exists in any form, a dangling symbolic link
included, is refused before and after the work (and left as it was)."""

from __future__ import annotations

import os

import pytest

import glyd.filecodec as fc
from glyd.cli import main
from glyd.errors import DestinationExistsError
from glyd.filecodec import archive as arc


@pytest.fixture
def inp(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("data " * 100)
    return p


def test_compress_onto_dangling_symlink_refused(tmp_path, inp, capsys):
    link = tmp_path / "out.glyd"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(DestinationExistsError, match="out.glyd: already exists"):
        fc.compress_files([inp], link)
    assert main(["compress", str(inp), "-o", str(link)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert link.is_symlink() and os.readlink(link) == str(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "out.glyd"]


def test_dangling_symlink_appearing_while_compressing_refused(tmp_path, inp, monkeypatch):
    link = tmp_path / "out.glyd"
    write = arc._write

    def write_then_link(*a, **kw):
        n = write(*a, **kw)
        link.symlink_to(tmp_path / "nowhere")
        return n

    monkeypatch.setattr(arc, "_write", write_then_link)
    with pytest.raises(DestinationExistsError, match="appeared while compressing"):
        fc.compress_files([inp], link)
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "out.glyd"]


def test_dangling_symlink_appearing_while_decompressing_refused(tmp_path, inp, monkeypatch):
    archive = tmp_path / "a.glyd"
    fc.compress_files([inp], archive)
    out = tmp_path / "out"
    out.mkdir()
    read = arc._iter_archive

    def read_then_link(*a, **kw):
        rep = read(*a, **kw)
        (out / "a.txt").symlink_to(tmp_path / "nowhere")
        return rep

    monkeypatch.setattr(arc, "_iter_archive", read_then_link)
    with pytest.raises(DestinationExistsError, match="appeared while decompressing"):
        fc.decompress(archive, out)
    assert (out / "a.txt").is_symlink() and [p.name for p in out.iterdir()] == ["a.txt"]


def test_decompress_onto_dangling_symlink_refused(tmp_path, inp):
    archive = tmp_path / "a.glyd"
    fc.compress_files([inp], archive)
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").symlink_to(tmp_path / "nowhere")
    with pytest.raises(DestinationExistsError, match="already exists"):
        fc.decompress(archive, out)
    assert (out / "a.txt").is_symlink() and [p.name for p in out.iterdir()] == ["a.txt"]
