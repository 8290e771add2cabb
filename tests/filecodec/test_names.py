"""Whatever ``compress`` accepts, ``decompress`` restores: file names the reader would refuse are
refused at compress time, naming the file, and the longest names a file system allows restore
(the temporary names outputs are written under do not grow with the file's name)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import glyd.filecodec as fc
from glyd.cli import main


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
