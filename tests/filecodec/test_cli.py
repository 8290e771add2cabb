"""glyd compress / decompress / test on the command line."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from glyd.cli import main


def test_cli_roundtrip_and_corruption(tmp_path, capsys):
    src = tmp_path / "m"
    src.mkdir()
    save_file({"w": (torch.randn(300, 256) * 0.02).to(torch.bfloat16)}, str(src / "model.safetensors"))
    (src / "config.json").write_text('{"a": 1}')
    archive = tmp_path / "m.glyd"
    assert main(["compress", str(src), "-o", str(archive), "--jobs", "2"]) == 0
    assert "compressed" in capsys.readouterr().out
    assert main(["test", str(archive)]) == 0
    assert "OK" in capsys.readouterr().out
    out = tmp_path / "out"
    assert main(["decompress", str(archive), "-o", str(out)]) == 0
    for name in ("model.safetensors", "config.json"):
        assert (out / "m" / name).read_bytes() == (src / name).read_bytes()
    # existing archive is not overwritten; existing files are not overwritten
    assert main(["compress", str(src), "-o", str(archive)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["decompress", str(archive), "-o", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err
    # a damaged archive: exit 1 and one line naming the file and chunk
    blob = bytearray(archive.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    bad = tmp_path / "bad.glyd"
    bad.write_bytes(bytes(blob))
    assert main(["test", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "glyd test: error:" in err and "chunk" in err and "model.safetensors" in err
    (tmp_path / "not.glyd").write_bytes(b"hello world, not an archive")
    assert main(["test", str(tmp_path / "not.glyd")]) == 1
    assert "not a glyd archive" in capsys.readouterr().err


def test_cli_missing_inputs(tmp_path, capsys):
    assert main(["compress", str(tmp_path / "nope"), "-o", str(tmp_path / "x.glyd")]) == 1
    assert "no such file" in capsys.readouterr().err
    assert not (tmp_path / "x.glyd").exists()
    assert main(["test", str(tmp_path / "missing.glyd")]) == 1
    assert "missing.glyd" in capsys.readouterr().err
    assert main(["decompress", str(tmp_path / "missing.glyd"), "-o", str(tmp_path)]) == 1


def test_compress_defaults_to_path_dot_glyd_beside_it(tmp_path, monkeypatch, capsys):
    # as gzip, xz and zstd: ``glyd compress FILE`` writes FILE.glyd next to FILE (not into the cwd)
    where, elsewhere = tmp_path / "where", tmp_path / "elsewhere"
    where.mkdir()
    elsewhere.mkdir()
    src = where / "weights.bin"
    src.write_bytes(bytes(range(256)) * 64)
    monkeypatch.chdir(elsewhere)
    assert main(["compress", str(src)]) == 0
    archive = where / "weights.bin.glyd"
    assert str(archive) in capsys.readouterr().out
    assert sorted(p.name for p in where.iterdir()) == ["weights.bin", "weights.bin.glyd"]
    assert list(elsewhere.iterdir()) == []
    # decompress without -o restores beside the archive: weights.bin.glyd -> weights.bin
    original = src.read_bytes()
    src.unlink()
    assert main(["decompress", str(archive)]) == 0
    assert src.read_bytes() == original and list(elsewhere.iterdir()) == []
    capsys.readouterr()
    # and refuses to overwrite what is there
    assert main(["decompress", str(archive)]) == 1
    assert "already exists" in capsys.readouterr().err


def test_compress_default_for_a_folder(tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"a": 1}')
    assert main(["compress", str(folder) + "/"]) == 0
    assert (tmp_path / "model.glyd").is_file()


def test_compress_default_never_overwrites(tmp_path, capsys):
    src = tmp_path / "a.txt"
    src.write_text("hello " * 100)
    existing = tmp_path / "a.txt.glyd"
    existing.write_bytes(b"keep me")
    assert main(["compress", str(src)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("glyd compress: error:") and "already exists" in err[0], err
    assert existing.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "a.txt.glyd"]  # no temporary left


def test_compress_several_paths_needs_o(tmp_path, capsys):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(name * 10)
    assert main(["compress", str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass -o" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_an_archive_path_that_is_not_a_file_says_what_it_is(tmp_path, capsys):
    # `glyd decompress nonexist.glyd` printed a raw "[Errno 2] No such file or directory: ...", a
    # folder "[Errno 21] ...", and a FIFO blocked the command forever.
    import os

    os.mkfifo(tmp_path / "pipe.glyd")
    (tmp_path / "dir.glyd").mkdir()
    os.symlink("/dev/zero", tmp_path / "zero.glyd")
    says = {"nonexist.glyd": "no such file", "pipe.glyd": "a FIFO (named pipe), not a .glyd archive file",
            "dir.glyd": "a folder, not a .glyd archive file",
            "zero.glyd": "a symbolic link to /dev/zero, a character device, not a .glyd archive file"}
    for name, want in says.items():
        for cmd in ("decompress", "test"):
            assert main([cmd, str(tmp_path / name), *(["-o", str(tmp_path / "out")] if cmd == "decompress" else [])]) == 1
            err = capsys.readouterr().err.strip()
            assert err == f"glyd {cmd}: error: {tmp_path / name}: {want}", err
    assert not (tmp_path / "out").exists()
