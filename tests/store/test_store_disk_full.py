"""A full disk (ENOSPC) while writing: one line naming the destination, nothing left behind; and the
shards glyd writes itself keep the layout safetensors' own writer gives."""

from __future__ import annotations

import errno
import os

import pytest
import torch
from safetensors.torch import save_file
from store_helpers import make_model_folder, special_matrix

import glyd
from glyd.cli import main
from glyd.store import CheckpointReader, CheckpointWriter, _atomic, _safetensors, pack_folder, sha256_tensor
from glyd.store.checkpoint import SHARD_METADATA


class _FullDisk:
    """A file opened for writing on a disk with ``room`` bytes left."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        if n > self.room:
            self.f.write(memoryview(data).cast("B")[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= n
        return self.f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def _fill_disk(monkeypatch, module, room: int) -> list[str]:
    """Writes through ``open`` in ``module`` see a disk with ``room`` bytes free; returns the paths."""
    opened = []

    def fake_open(path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        if "w" not in mode:
            return f
        opened.append(str(path))
        return _FullDisk(f, room)

    monkeypatch.setattr(module, "open", fake_open, raising=False)
    return opened


def _disk_full_error(capsys, tmp_path, *argv: str) -> str:
    rc = main(["-q", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert "No space left on device" in err and "nothing was written" in err, err
    return err


def test_disk_full_writing_a_shard(tmp_path, capsys, monkeypatch):
    make_model_folder(tmp_path / "src", sharded=True)
    opened = _fill_disk(monkeypatch, _safetensors, room=3000)
    err = _disk_full_error(capsys, tmp_path, "pack", str(tmp_path / "src"), str(tmp_path / "out"))
    assert err.startswith(f"glyd pack: error: {tmp_path / 'out'}: No space left")
    assert opened and ".glyd-tmp" in opened[0]  # it did fail inside a shard
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_disk_full_copying_a_file(tmp_path, capsys, monkeypatch):
    make_model_folder(tmp_path / "src")
    (tmp_path / "src" / "tokenizer.json").write_bytes(b"x" * 10_000)
    opened = _fill_disk(monkeypatch, _atomic, room=100)
    _disk_full_error(capsys, tmp_path, "pack", str(tmp_path / "src"), str(tmp_path / "out"))
    assert any(p.endswith("tokenizer.json") for p in opened)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_disk_full_while_unpacking(tmp_path, capsys, monkeypatch):
    make_model_folder(tmp_path / "src", sharded=True)
    pack_folder(tmp_path / "src", tmp_path / "packed", progress=False)
    _fill_disk(monkeypatch, _safetensors, room=500)
    err = _disk_full_error(capsys, tmp_path, "unpack", str(tmp_path / "packed"), str(tmp_path / "out"))
    assert f"{tmp_path / 'out'}: No space left" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packed", "src"]


@pytest.mark.parametrize("names", [["a", "b"], ["模型.权重", "naïve", "tab\there", "quote\"s", "new\nline", "\x01"]])
def test_shards_have_the_bytes_of_safetensors_save_file(tmp_path, names):
    g = torch.Generator().manual_seed(0)
    dtypes = [torch.bfloat16, torch.float32, torch.int64, torch.uint8, torch.bool, torch.float16]
    tensors = {}
    for i, name in enumerate(names):
        for j, dt in enumerate(dtypes):
            tensors[f"{name}.{j}"] = torch.randint(0, 2, (3, i + j + 1), generator=g).to(dt)
    m = special_matrix(8, 24)
    with CheckpointWriter(tmp_path / "c", layout="fixed12") as w:
        w.add_packed(f"{names[0]}.w", glyd.pack(m), sha256_tensor(m))
        for k, t in tensors.items():
            w.add_tensor(k, t)
    r = CheckpointReader(tmp_path / "c")
    p = r.get(f"{names[0]}.w")
    expected = {**{f"{names[0]}.w_glyd_{a}": t for a, t in p.arrays.items()}, **tensors}
    save_file(expected, str(tmp_path / "ref.safetensors"), metadata=SHARD_METADATA)
    ours, ref = _parts(tmp_path / "c" / "model.safetensors"), _parts(tmp_path / "ref.safetensors")
    assert ours == ref
    # safetensors writes __metadata__ from a Rust HashMap, in a random order; glyd in a fixed one.
    assert ours[1][0] == ("__metadata__", {"format": "pt", "glyd": "1"})


def _parts(path):
    """(header length, header items in file order with __metadata__ as a dict, data bytes)."""
    import json
    import struct

    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    items = json.loads(raw[8 : 8 + n], object_pairs_hook=lambda pairs: pairs)
    items = [(k, dict(v) if k == "__metadata__" else v) for k, v in items]
    return n, items, raw[8 + n :]


def test_a_closed_stdout_is_not_blamed_on_the_destination(tmp_path, capsys, monkeypatch):
    make_model_folder(tmp_path / "src")

    def closed(*args, **kwargs):
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    import glyd.apps.cli_store

    monkeypatch.setattr(glyd.apps.cli_store, "print", closed, raising=False)  # the summary, to a closed pipe
    rc = main(["-q", "pack", str(tmp_path / "src"), str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and str(tmp_path / "out") not in err and "Broken pipe" in err
    CheckpointReader(tmp_path / "out").verify(progress=False)  # the checkpoint itself was written
