"""Hostile inputs to the .glyd archive writer and reader: what a corrupted archive, an odd input
folder or a failing disk must never do (crash with a bare exception, skip files silently, name the
wrong problem, overwrite a file, leave partial output)."""

from __future__ import annotations

import os
import random

import pytest

import glyd.filecodec as fc
from glyd.errors import DestinationExistsError, GlydError
from glyd.filecodec import archive as arc


@pytest.fixture
def small(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.txt").write_bytes(b"hello world " * 200)
    (d / "empty").write_bytes(b"")
    (d / "rnd").write_bytes(random.Random(1).randbytes(3000))
    archive = tmp_path / "small.glyd"
    fc.compress_files([d], archive, jobs=1)
    return archive


def test_every_truncation_and_sampled_flip_is_a_glyd_error(small, tmp_path):
    blob = small.read_bytes()
    rng = random.Random(7)
    bad = tmp_path / "bad.glyd"
    mutants = [blob[:n] for n in range(len(blob))]
    for _ in range(300):
        b = bytearray(blob)
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        mutants.append(bytes(b))
    for m in mutants:
        bad.write_bytes(m)
        with pytest.raises(GlydError) as info:
            fc.test(bad, jobs=1)
        assert "\n" not in str(info.value)
    out = tmp_path / "out"
    out.mkdir()
    bad.write_bytes(blob[:-10])
    with pytest.raises(GlydError):
        fc.decompress(bad, out, jobs=1)
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("kind", ["fifo", "dangling", "dirlink", "device"])
def test_folder_with_unarchivable_entry_is_refused_not_skipped(tmp_path, kind):
    # docs/filecodec.md: "symlinks are followed"; a FIFO, a device, a broken link or a link to a
    # folder inside a folder was dropped from the archive without a word
    d = tmp_path / "m"
    d.mkdir()
    (d / "a").write_bytes(b"x" * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "s").write_bytes(b"s")
    odd = d / "odd"
    {"fifo": lambda: os.mkfifo(odd), "dangling": lambda: odd.symlink_to(tmp_path / "nowhere"),
     "dirlink": lambda: odd.symlink_to(tmp_path / "sub"), "device": lambda: odd.symlink_to("/dev/null")}[kind]()
    with pytest.raises(GlydError, match=r"odd: .*(FIFO|broken|folder|device)") as info:
        fc.compress_files([d], tmp_path / "m.glyd")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "m.glyd").exists()


def test_top_level_fifo_is_named_as_a_fifo_not_missing(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(GlydError, match="pipe: a FIFO"):
        fc.compress_files([tmp_path / "pipe"], tmp_path / "p.glyd")
    with pytest.raises(GlydError, match="null: a character device"):
        fc.compress_files(["/dev/null"], tmp_path / "n.glyd")


def test_file_appearing_during_the_renames_is_not_overwritten(tmp_path, monkeypatch):
    # on a case-insensitive file system "A" and "a" of one archive are one file: the second rename
    # replaced the first file restored, silently; the same when a file appears mid-way
    d = tmp_path / "in"
    d.mkdir()
    (d / "a").write_bytes(b"first")
    (d / "b").write_bytes(b"second")
    archive = tmp_path / "x.glyd"
    fc.compress_files([d], archive, jobs=1)
    out = tmp_path / "out"
    out.mkdir()
    replace = os.replace
    calls = []

    def replace_then_appear(src, dst, **kw):
        replace(src, dst, **kw)
        calls.append(dst)
        if len(calls) == 1:
            (out / "in" / "b").write_bytes(b"user's file")

    monkeypatch.setattr(arc.os, "replace", replace_then_appear)
    with pytest.raises(DestinationExistsError, match="appeared while decompressing"):
        fc.decompress(archive, out, jobs=1)
    monkeypatch.undo()
    assert (out / "in" / "b").read_bytes() == b"user's file"
    assert sorted(p.name for p in (out / "in").iterdir()) == ["b"]  # the first file is rolled back


def test_disk_full_while_decompressing_leaves_nothing(tmp_path, monkeypatch, small):
    out = tmp_path / "out"
    out.mkdir()
    real_open = open
    n = [0]

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, b):
            n[0] += 1
            if n[0] >= 2:
                raise OSError(28, "No space left on device")
            return self.f.write(b)

        def close(self):
            self.f.close()

    monkeypatch.setattr(arc, "open", lambda p, mode="r", *a, **k: Full(real_open(p, mode, *a, **k)) if "x" in mode else real_open(p, mode, *a, **k), raising=False)
    with pytest.raises(OSError):
        fc.decompress(small, out, jobs=1)
    assert list(out.iterdir()) == []
