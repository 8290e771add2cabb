"""Every shard, index entry and file of a checkpoint folder is accounted for by glyd.json, and back."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest
import torch
from store_helpers import leftovers, make_packed, special_matrix

import glyd
from glyd.cli import main
from glyd.errors import CorruptError, FormatError
from glyd.store import CheckpointReader, CheckpointWriter, sha256_tensor, unpack_folder

SHARD3 = "model-00003-of-00008.safetensors"


def _cli(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["-q", *argv])
    return rc, capsys.readouterr().err.strip()


@pytest.fixture
def eight(tmp_path) -> Path:
    """A checkpoint of 8 shards (one packed matrix and one raw tensor each), with config and tokenizer."""
    path = tmp_path / "eight"
    with CheckpointWriter(path, layout="fixed12") as w:
        for i in range(8):
            m = special_matrix(8, 24, i)
            w.add_packed(f"l{i}.weight", glyd.pack(m), sha256_tensor(m))
            w.add_tensor(f"l{i}.bias", torch.full((8,), float(i)))
            w.flush()
        w.set_config({"model_type": "toy"})
        tok = tmp_path / "tokenizer.json"
        tok.write_text("{}")
        w.add_file(tok)
    assert len(list(path.glob("model-*-of-00008.safetensors"))) == 8
    return path


def _edit(path: Path, edit, name: str = "glyd.json") -> None:
    m = json.loads((path / name).read_text())
    edit(m)
    (path / name).write_text(json.dumps(m))


def _drop_shard3(m):
    m["tensors"] = {n: e for n, e in m["tensors"].items() if e["file"] != SHARD3}


def _refused_everywhere(path: Path, tmp_path: Path, capsys, match: str, exc=FormatError) -> None:
    with pytest.raises(exc, match=match):
        CheckpointReader(path)
    for argv in (["verify", str(path)], ["info", str(path)], ["unpack", str(path), str(tmp_path / "out")]):
        rc, err = _cli(capsys, *argv)
        assert rc == 1 and len(err.splitlines()) == 1, (argv, err)
        assert re.search(match, err), (argv, err)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_a_shard_dropped_from_the_manifest(eight, tmp_path, capsys):
    _edit(eight, _drop_shard3)
    _refused_everywhere(eight, tmp_path, capsys, r"model-00003-of-00008\.safetensors")


def test_a_shard_dropped_from_manifest_and_folder(eight, tmp_path, capsys):
    _edit(eight, _drop_shard3)
    (eight / SHARD3).unlink()
    _refused_everywhere(eight, tmp_path, capsys, r"no tensor is listed in shard\(s\) model-00003-of-00008")


def test_an_empty_tensor_table(eight, tmp_path, capsys):
    _edit(eight, lambda m: m.update(tensors={}))
    _refused_everywhere(eight, tmp_path, capsys, r"glyd\.json: tensors: is empty")


def test_an_empty_file_table(eight, tmp_path, capsys):
    _edit(eight, lambda m: m.update(files={}))
    _refused_everywhere(eight, tmp_path, capsys, r"config\.json: config\.json that glyd\.json does not list")


@pytest.mark.parametrize(
    "edit, match, exc",
    [
        (lambda wm: wm.update({"ghost.weight": SHARD3}), r"index\.json: lists key 'ghost\.weight'", FormatError),
        (lambda wm: wm.update({"l0.bias": "../../etc/passwd"}),
         r"maps 'l0\.bias' to '\.\./\.\./etc/passwd', which is not a shard", FormatError),
        (lambda wm: wm.update({"l0.bias": "model-00009-of-00008.safetensors"}),
         r"to 'model-00009-of-00008\.safetensors', which is not a shard", FormatError),
        (lambda wm: wm.update({"l0.bias": SHARD3}),
         r"maps 'l0\.bias' to model-00003-of-00008\.safetensors but it is in model-00001", FormatError),
        (lambda wm: wm.pop("l5.bias"), r"has no entry for 'l5\.bias'", FormatError),
    ],
    ids=["unknown-key", "escaping-path", "missing-file", "wrong-shard", "missing-key"],
)
def test_index_entries_are_accounted_for(eight, tmp_path, capsys, edit, match, exc):
    _edit(eight, lambda d: edit(d["weight_map"]), "model.safetensors.index.json")
    _refused_everywhere(eight, tmp_path, capsys, match, exc)


def test_index_total_size_and_presence(eight, tmp_path, capsys):
    index = eight / "model.safetensors.index.json"
    text = index.read_text()
    _edit(eight, lambda d: d["metadata"].update(total_size=1), index.name)
    _refused_everywhere(eight, tmp_path, capsys, r"metadata\.total_size is 1")
    index.unlink()
    _refused_everywhere(eight, tmp_path, capsys, r"index\.json: missing", CorruptError)
    single = make_packed(tmp_path / "one", sharded=False)
    (single / index.name).write_text(text)
    with pytest.raises(FormatError, match="single-shard checkpoint has no index"):
        CheckpointReader(single)


@pytest.mark.parametrize(
    "rel",
    ["extra.safetensors", ".hidden.safetensors", "sub/model.safetensors", "pytorch_model.bin",
     "sub/config.json", "tf_model.h5.index.json", "modeling_custom.py"],
)
def test_unlisted_files_are_refused(eight, tmp_path, capsys, rel):
    (eight / rel).parent.mkdir(parents=True, exist_ok=True)
    (eight / rel).write_bytes(b"something the manifest does not know")
    _refused_everywhere(eight, tmp_path, capsys, rf"{rel.replace('.', '[.]')}: .*that glyd\.json does not list")


def test_files_added_after_packing_are_ignored_with_a_warning(eight, tmp_path, caplog):
    # tokenizer.save_pretrained(folder) after model.save_pretrained(folder): a common workflow
    for rel in ("special_tokens_map.json", "tokenizer_config.json", "chat_template.jinja", "notes.txt"):
        (eight / rel).write_text("{}")
    with caplog.at_level(logging.WARNING, logger="glyd"):
        r = CheckpointReader(eight)
    # README.md: the model card the writer adds, documentation the manifest does not list either
    assert sorted(r.ignored) == ["README.md", "chat_template.jinja", "notes.txt", "special_tokens_map.json",
                                 "tokenizer_config.json"]
    assert any("added after packing" in rec.getMessage() for rec in caplog.records)
    assert r.verify(progress=False)["tensors"] == 16
    unpack_folder(eight, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "notes.txt").exists()  # not part of the checkpoint: not copied


def test_unlisted_documentation_and_hidden_entries_are_ignored(eight, tmp_path):
    for rel in ("README.md", "LICENSE", "docs/USAGE.md", ".gitattributes", ".git/objects/ab/cdef", ".cache/huggingface/x.lock"):
        (eight / rel).parent.mkdir(parents=True, exist_ok=True)
        (eight / rel).write_text("x")
    r = CheckpointReader(eight)
    assert sorted(r.ignored) == [".gitattributes", "LICENSE", "README.md", "docs/USAGE.md"]
    assert r.verify(progress=False)["tensors"] == 16
    unpack_folder(eight, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "README.md").exists()  # not part of the checkpoint: not copied


def test_a_linked_folder_must_be_accounted_for(eight, tmp_path, capsys):
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", eight / "extra")
    _refused_everywhere(eight, tmp_path, capsys, r"extra: a link to a folder that glyd\.json does not account for")


def test_a_top_level_safetensors_cannot_be_a_copied_file(tmp_path):
    src = tmp_path / "f.safetensors"
    src.write_bytes(b"x")
    with CheckpointWriter(tmp_path / "c", layout="fixed12") as w:
        w.add_tensor("a", torch.zeros(2))
        with pytest.raises(ValueError, match="reserved"):
            w.add_file(src, "consolidated.safetensors")
        w.add_file(src, "sub/f.safetensors")  # inside a sub-folder: a file like any other
    _edit(tmp_path / "c", lambda m: m["files"].update({"consolidated.safetensors": "0" * 64}))
    with pytest.raises(FormatError, match=r"files\['consolidated\.safetensors'\]"):
        CheckpointReader(tmp_path / "c")


def test_a_linked_folder_that_holds_listed_files_is_checked_too(tmp_path):
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "config.json").write_text("{}")
    with CheckpointWriter(tmp_path / "c", layout="fixed12") as w:
        w.add_tensor("a", torch.zeros(2))
        w.add_file(pool / "config.json", "1_Pooling/config.json")
    ckpt = tmp_path / "c"
    for f in (ckpt / "1_Pooling").iterdir():
        f.unlink()
    (ckpt / "1_Pooling").rmdir()
    os.symlink(pool, ckpt / "1_Pooling")
    assert CheckpointReader(ckpt).verify(progress=False)["files"] == 1  # the listed file, through the link
    (pool / "extra.bin").write_bytes(b"weights nobody listed")
    with pytest.raises(FormatError, match=r"1_Pooling/extra\.bin: weights or an index that glyd\.json does not list"):
        CheckpointReader(ckpt)
    (pool / "extra.bin").unlink()
    (pool / "sub").mkdir()
    (pool / "sub" / "config.json").write_text("{}")  # a config.json, not "weights or an index" as it was called
    with pytest.raises(FormatError, match=r"1_Pooling/sub/config\.json: config\.json that glyd\.json does not list"):
        CheckpointReader(ckpt)
    (pool / "sub" / "config.json").unlink()
    os.symlink(pool, pool / "loop")
    with pytest.raises(FormatError, match=r"1_Pooling/loop: a link to a folder"):
        CheckpointReader(ckpt)
