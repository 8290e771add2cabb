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


# ----------------------------------------------------------------------------- links below the output folder
# A link already in the output folder (out/m -> /elsewhere) was followed: the archive's files under
# m/ were written outside the output folder.


@pytest.fixture
def tree(tmp_path):
    """An archive of m/a and m/sub/b (renamed in that order), and an empty folder beside it."""
    m = tmp_path / "m"
    (m / "sub").mkdir(parents=True)
    (m / "a").write_bytes(b"first " * 50)
    (m / "sub" / "b").write_bytes(b"second " * 50)
    archive = tmp_path / "m.glyd"
    fc.compress_files([m], archive, jobs=1)
    (tmp_path / "elsewhere").mkdir()
    return archive


def listing(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


@pytest.mark.parametrize("at", ["m", "m/sub"])
def test_symlinked_folder_in_the_output_is_refused(tmp_path, tree, capsys, at):
    out = tmp_path / "out"
    (out / at).parent.mkdir(parents=True, exist_ok=True)
    (out / at).symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    before = listing(out)
    refusal = rf"out/{at}: a symbolic link \(to .*elsewhere\); decompress never writes through"
    with pytest.raises(DestinationExistsError, match=refusal):
        fc.decompress(tree, out, jobs=1)
    assert main(["decompress", str(tree), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"out/{at}: a symbolic link" in err and len(err.strip().splitlines()) == 1
    assert listing(tmp_path / "elsewhere") == []  # nothing written through the link
    assert listing(out) == before  # and nothing inside: m/a, restored before m/sub/b was refused, is gone


def test_file_where_a_folder_goes_is_refused(tmp_path, tree):
    out = tmp_path / "out"
    out.mkdir()
    (out / "m").write_bytes(b"user's file")
    with pytest.raises(DestinationExistsError, match="out/m: exists and is not a folder"):
        fc.decompress(tree, out, jobs=1)
    assert listing(out) == ["m"] and (out / "m").read_bytes() == b"user's file"


def test_symlinked_file_destination_is_refused(tmp_path, tree):
    target = tmp_path / "elsewhere" / "target"
    target.write_bytes(b"user's file")
    out = tmp_path / "out"
    (out / "m").mkdir(parents=True)
    (out / "m" / "a").symlink_to(target)
    with pytest.raises(DestinationExistsError, match="out/m/a: already exists"):
        fc.decompress(tree, out, jobs=1)
    assert target.read_bytes() == b"user's file" and listing(tmp_path / "elsewhere") == ["target"]
    assert listing(out) == ["m", "m/a"] and (out / "m" / "a").is_symlink()


def test_nested_extract_into_existing_real_folders(tmp_path, tree):
    out = tmp_path / "out"
    (out / "m" / "sub").mkdir(parents=True)
    (out / "m" / "sub" / "other").write_bytes(b"kept")
    fc.decompress(tree, out, jobs=1)
    assert (out / "m" / "a").read_bytes() == (tmp_path / "m" / "a").read_bytes()
    assert (out / "m" / "sub" / "b").read_bytes() == (tmp_path / "m" / "sub" / "b").read_bytes()
    assert listing(out) == ["m", "m/a", "m/sub", "m/sub/b", "m/sub/other"]


def test_output_folder_itself_may_be_a_link(tmp_path, tree):
    # the user named it: docs/filecodec.md says a link as the output folder is followed
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    fc.decompress(tree, link, jobs=1)
    assert listing(tmp_path / "elsewhere") == ["m", "m/a", "m/sub", "m/sub/b"]
    assert (tmp_path / "elsewhere" / "m" / "sub" / "b").read_bytes() == (tmp_path / "m" / "sub" / "b").read_bytes()


def swap_for_link(folder, target):
    """Move ``folder`` aside and put a link to ``target`` in its place."""
    folder.rename(folder.with_name("moved"))
    folder.symlink_to(target, target_is_directory=True)


def test_link_swapped_in_after_reading_is_refused(tmp_path, tree, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    read = arc._iter_archive

    def read_then_swap(*a, **kw):
        rep = read(*a, **kw)
        swap_for_link(out / "m" / "sub", tmp_path / "elsewhere")
        return rep

    monkeypatch.setattr(arc, "_iter_archive", read_then_swap)
    with pytest.raises(DestinationExistsError, match="out/m/sub: a symbolic link"):
        fc.decompress(tree, out, jobs=1)
    assert listing(tmp_path / "elsewhere") == []
    assert not (out / "m" / "a").exists() and (out / "m" / "sub").is_symlink()


def test_link_swapped_in_between_renames_is_refused(tmp_path, tree, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    replace = os.replace
    calls = []

    def replace_then_swap(src, dst, **kw):
        replace(src, dst, **kw)
        calls.append(dst)
        if len(calls) == 1:  # m/a is in place; m/sub/b comes next
            swap_for_link(out / "m" / "sub", tmp_path / "elsewhere")

    monkeypatch.setattr(arc.os, "replace", replace_then_swap)
    with pytest.raises(DestinationExistsError, match="out/m/sub: a symbolic link"):
        fc.decompress(tree, out, jobs=1)
    monkeypatch.undo()
    assert calls == ["a"] and listing(tmp_path / "elsewhere") == []
    assert not (out / "m" / "a").exists()  # the file already renamed is rolled back
