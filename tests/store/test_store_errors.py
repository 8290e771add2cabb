"""Every bad input gets a clear error naming the file, tensor or field, and leaves nothing behind."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from store_helpers import leftovers, make_model_folder

import glyd
from glyd.cli import main
from glyd.errors import CorruptError, DestinationExistsError, FormatError
from glyd.store import CheckpointReader, key_for, pack_folder, unpack_folder
from glyd.store._safetensors import read_header


def _cli(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["-q", *argv])
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.fixture(params=["fixed12", "tiered"])
def packed(request, tmp_path) -> Path:
    make_model_folder(tmp_path / "src", sharded=True)
    dst = tmp_path / "packed"
    pack_folder(tmp_path / "src", dst, layout=request.param, progress=False)
    return dst


def _edit_manifest(path: Path, edit) -> None:
    m = json.loads((path / "glyd.json").read_text())
    edit(m)
    (path / "glyd.json").write_text(json.dumps(m))


def _flip(path: Path, name: str, array: str | None = None, pos: int = 0) -> None:
    """XOR one byte of tensor ``name`` (or of one array of it) inside its shard."""
    e = CheckpointReader(path).entry(name)
    shard = path / e["file"]
    h = read_header(shard)
    info = h.tensors[key_for(name, array) if array else name]
    data = bytearray(shard.read_bytes())
    data[h.data_start + info.begin + pos] ^= 0x5A
    shard.write_bytes(bytes(data))


# -- pack: bad sources -----------------------------------------------------------------------------


def test_pack_missing_source(tmp_path, capsys):
    rc, err = _cli(capsys, "pack", str(tmp_path / "nope"), str(tmp_path / "out"))
    assert rc == 1 and "no such folder" in err and str(tmp_path / "nope") in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_pack_pytorch_bin_only(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "pytorch_model.bin").write_bytes(b"\x80\x02not a pickle we would ever load")
    (src / "config.json").write_text("{}")
    rc, err = _cli(capsys, "pack", str(src), str(tmp_path / "out"))
    assert rc == 1 and "pytorch_model.bin" in err and "safetensors only" in err
    assert list(tmp_path.iterdir()) == [src]


def test_pack_empty_folder(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(FormatError, match="no model.safetensors"):
        pack_folder(tmp_path / "src", tmp_path / "out", progress=False)


def test_pack_not_safetensors(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(struct.pack("<Q", 10) + b"not json!!")
    with pytest.raises(FormatError, match="not a safetensors file"):
        pack_folder(src, tmp_path / "out", progress=False)
    (src / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(CorruptError, match="truncated"):
        pack_folder(src, tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_pack_truncated_source_shard(tmp_path, capsys):
    make_model_folder(tmp_path / "src", sharded=True)
    shard = tmp_path / "src" / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    rc, err = _cli(capsys, "pack", str(tmp_path / "src"), str(tmp_path / "out"))
    assert rc == 1 and "truncated" in err and "model-00002-of-00002.safetensors" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_pack_missing_source_shard(tmp_path):
    make_model_folder(tmp_path / "src", sharded=True)
    (tmp_path / "src" / "model-00001-of-00002.safetensors").unlink()
    with pytest.raises(FormatError, match="model-00001-of-00002.safetensors.*missing"):
        pack_folder(tmp_path / "src", tmp_path / "out", progress=False)


def test_pack_index_lists_absent_tensor(tmp_path):
    make_model_folder(tmp_path / "src", sharded=True)
    idx = tmp_path / "src" / "model.safetensors.index.json"
    m = json.loads(idx.read_text())
    m["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    idx.write_text(json.dumps(m))
    with pytest.raises(CorruptError, match="ghost.weight"):
        pack_folder(tmp_path / "src", tmp_path / "out", progress=False)


def test_pack_rejects_quantized_or_packed_sources(tmp_path, packed):
    src = tmp_path / "q"
    make_model_folder(src)
    (src / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq"}}))
    with pytest.raises(FormatError, match="already quantized.*gptq"):
        pack_folder(src, tmp_path / "out", progress=False)
    with pytest.raises(FormatError, match="already a glyd packed checkpoint"):
        pack_folder(packed, tmp_path / "out", progress=False)


def test_pack_destination_exists(tmp_path, capsys):
    make_model_folder(tmp_path / "src")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me")
    rc, err = _cli(capsys, "pack", str(tmp_path / "src"), str(tmp_path / "out"))
    assert rc == 1 and "already exists" in err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]
    with pytest.raises(DestinationExistsError):
        pack_folder(tmp_path / "src", tmp_path / "out", progress=False)


def test_pack_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    make_model_folder(tmp_path / "src", sharded=True)
    calls = []
    from glyd.store import folder

    real = folder.codec_pack

    def flaky(w, layout="fixed12"):
        calls.append(1)
        if len(calls) == 3:  # after a shard was already written
            raise RuntimeError("disk on fire")
        return real(w, layout)

    monkeypatch.setattr(folder, "codec_pack", flaky)
    with pytest.raises(RuntimeError, match="disk on fire"):
        pack_folder(tmp_path / "src", tmp_path / "out", progress=False)
    assert len(calls) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    assert leftovers(tmp_path) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback of layout auto")
def test_pack_auto_without_gpu_falls_back_to_fixed12(tmp_path, caplog):
    make_model_folder(tmp_path / "src")
    with caplog.at_level("INFO", logger="glyd"):
        s = pack_folder(tmp_path / "src", tmp_path / "out", layout="auto", progress=False)
    assert s.layouts == {"fixed12": 3}
    assert "no measured choice" in caplog.text
    r = CheckpointReader(tmp_path / "out")
    assert r.layout == "auto" and r.config["quantization_config"]["layout"] == "auto"
    assert {r.entry(n)["layout"] for n in r.names() if r.is_packed(n)} == {"fixed12"}


def test_pack_reports_what_it_kept(tmp_path):
    make_model_folder(tmp_path / "src")
    s = pack_folder(tmp_path / "src", tmp_path / "out", progress=False)
    assert s.packed == 3 and s.kept == {"bfloat16": 1, "int64": 1, "float32": 1}
    assert sorted(s.kept_names) == ["layer.0.bias", "pos_ids", "scale"]
    text = str(s)
    assert "1 bfloat16" in text and "1 float32" in text and "1 int64" in text
    assert CheckpointReader(tmp_path / "out").get("scale").dtype == torch.float32  # never converted


# -- verify / unpack: damaged checkpoints -----------------------------------------------------------


@pytest.mark.parametrize("array", [None, "first"])
def test_flipped_byte_names_the_tensor(packed, array, capsys):
    layout = CheckpointReader(packed).entry("layer.1.weight")["layout"]
    arr = glyd.LAYOUTS[layout].arrays[0] if array else None
    name = "layer.1.weight" if array else "scale"
    _flip(packed, name, arr)
    rc, err = _cli(capsys, "verify", str(packed))
    assert rc == 1 and repr(name) in err and len(err.splitlines()) == 1
    with pytest.raises(CorruptError, match=name.replace(".", r"\.")):
        CheckpointReader(packed).verify(progress=False)


def test_flipped_byte_stops_unpack_and_leaves_nothing(packed, tmp_path):
    _flip(packed, "layer.1.weight", "exc_hi" if "exc_hi" in CheckpointReader(packed).entry("layer.1.weight")["arrays"] else "sm")
    with pytest.raises(CorruptError, match=r"layer\.1\.weight"):
        unpack_folder(packed, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_truncated_packed_shard(packed, capsys):
    shard = packed / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-3])
    rc, err = _cli(capsys, "verify", str(packed))
    assert rc == 1 and "truncated" in err and "model-00002-of-00002.safetensors" in err


def test_header_length_beyond_file(packed):
    shard = packed / "model-00001-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(struct.pack("<Q", 2**63) + data[8:])
    with pytest.raises(CorruptError, match="header length"):
        CheckpointReader(packed)


def test_trailing_bytes(packed):
    shard = packed / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes() + b"\0" * 5)
    with pytest.raises(CorruptError, match="5 bytes after the last tensor"):
        CheckpointReader(packed)


def test_missing_shard(packed):
    (packed / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CorruptError, match="model-00002-of-00002.safetensors.*missing"):
        CheckpointReader(packed)


def test_copied_file_changed(packed, capsys):
    (packed / "tokenizer.json").write_text('{"version": "2.0"}')
    rc, err = _cli(capsys, "verify", str(packed))
    assert rc == 1 and "tokenizer.json" in err and "sha256" in err
    (packed / "tokenizer.json").unlink()
    with pytest.raises(CorruptError, match="tokenizer.json.*missing"):
        CheckpointReader(packed)


def test_hash_mismatch_names_the_tensor(packed, tmp_path, capsys):
    _edit_manifest(packed, lambda m: m["tensors"]["embed.weight"].update(sha256="ab" * 32))
    rc, err = _cli(capsys, "verify", str(packed))
    assert rc == 1 and "'embed.weight'" in err and "sha256 mismatch" in err
    rc, err = _cli(capsys, "unpack", str(packed), str(tmp_path / "out"))
    assert rc == 1 and "'embed.weight'" in err
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def _set_array_shape(m):
    spec = next(iter(m["tensors"]["layer.0.weight"]["arrays"].values()))
    spec["shape"] = [spec["shape"][0] + 1, *spec["shape"][1:]]


def _drop_array(m):
    arrays = m["tensors"]["layer.0.weight"]["arrays"]
    arrays.pop(next(iter(arrays)))


@pytest.mark.parametrize(
    "edit, match",
    [
        (_set_array_shape, r"tensor 'layer\.0\.weight'.*the shard holds"),
        (lambda m: m["tensors"]["scale"].update(dtype="float16"), r"tensor 'scale'.*float32.*float16"),
        (lambda m: m["tensors"]["layer.0.weight"].update(shape=[25, 40]), r"layer\.0\.weight"),
        (_drop_array, r"layer\.0\.weight"),
        (lambda m: m["tensors"]["scale"].update(file="model-00001-of-00002.safetensors"), r"'scale'.*absent"),
        (lambda m: m["tensors"].pop("scale"), r"does not list: scale"),
        (lambda m: m.update(version=2), "format version 2 is not supported"),
        (lambda m: m.update(format="other"), "not a glyd checkpoint manifest"),
        (lambda m: m.pop("tensors"), "tensors: missing"),
        (lambda m: m["tensors"]["scale"].pop("sha256"), r"tensors\['scale'\]\.sha256"),
        (lambda m: m["tensors"]["scale"].update(kind="zip"), r"tensors\['scale'\]\.kind"),
        (lambda m: m["tensors"]["embed.weight"].update(layout="int4"), "unknown layout 'int4'"),
        (lambda m: m["tensors"]["embed.weight"].update(format_version=9), "layout format version 9"),
        (lambda m: m["tensors"]["scale"].update(shape=[-1]), r"tensors\['scale'\]\.shape"),
        (lambda m: m["tensors"]["scale"].update(file="../../etc/passwd"), r"\.file"),
        (lambda m: m["files"].update({"../x": "0" * 64}), "relative path"),
    ],
)
def test_manifest_that_disagrees(packed, edit, match, capsys):
    _edit_manifest(packed, edit)
    with pytest.raises(FormatError, match=match):
        CheckpointReader(packed)
    rc, err = _cli(capsys, "info", str(packed))
    assert rc == 1 and ("glyd.json" in err or "safetensors" in err)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\xff\xfe"])
def test_manifest_not_json(packed, text, capsys):
    (packed / "glyd.json").write_bytes(text.encode("latin-1"))
    rc, err = _cli(capsys, "verify", str(packed))
    assert rc == 1 and "glyd.json" in err


def test_unpack_destination_exists(packed, tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(DestinationExistsError):
        unpack_folder(packed, tmp_path / "out", progress=False)


@pytest.mark.parametrize("inside", ["out", "sub/out", "link/out"])
def test_unpack_into_the_checkpoint_is_refused(packed, tmp_path, capsys, inside):
    # It used to succeed, and the checkpoint then failed glyd verify (an unlisted config.json and shards).
    (packed.parent / "link").symlink_to(packed)
    dst = packed / inside if not inside.startswith("link") else packed.parent / inside
    rc, err = _cli(capsys, "unpack", str(packed), str(dst))
    assert rc == 1 and f"{dst} is inside {packed}: glyd does not write into the folder it reads" in err, err
    assert len(err.splitlines()) == 1 and not dst.exists() and not (packed / "sub").exists()
    assert not leftovers(packed) and not leftovers(packed.parent)
    assert CheckpointReader(packed).verify(progress=False)["tensors"] == 6


def _rewrite(path: Path, rel: str, data: bytes) -> None:
    """Replace the listed file ``rel`` and its sha256 in glyd.json (a crafted, self-consistent edit)."""
    import hashlib

    (path / rel).write_bytes(data)
    _edit_manifest(path, lambda m: m["files"].__setitem__(rel, hashlib.sha256(data).hexdigest()))


def test_unpack_checks_the_kept_source_config(packed, tmp_path):
    source = "glyd.source_config.json"
    assert json.loads((packed / source).read_bytes()) == {"model_type": "toy", "hidden_size": 40}
    _rewrite(packed, source, b'{"model_type": "toy", "hidden_size": 41}')  # no longer what config.json says
    with pytest.raises(CorruptError, match=f"{source}: is not the config .*config.json describes"):
        unpack_folder(packed, tmp_path / "a", progress=False)
    _rewrite(packed, source, b'{"model_type": "toy",\n "hidden_size": 40}')  # the same config, spelled otherwise
    unpack_folder(packed, tmp_path / "b", progress=False)
    assert (tmp_path / "b" / "config.json").read_bytes() == b'{"model_type": "toy",\n "hidden_size": 40}'
    _edit_manifest(packed, lambda m: m["files"].pop(source))  # unlisted: glyd's own file, never ignored
    with pytest.raises(FormatError, match=f"{source}: {source} that glyd.json does not list"):
        CheckpointReader(packed)
    (packed / source).unlink()  # a folder written before glyd kept the source's config: as before
    unpack_folder(packed, tmp_path / "c", progress=False)
    assert json.loads((tmp_path / "c" / "config.json").read_bytes()) == {"model_type": "toy", "hidden_size": 40}
    assert not leftovers(tmp_path)


def test_verify_not_a_checkpoint(tmp_path, capsys):
    rc, err = _cli(capsys, "verify", str(tmp_path))
    assert rc == 1 and "no glyd.json" in err
    f = tmp_path / "file"
    f.write_text("x")
    rc, err = _cli(capsys, "info", str(f))
    assert rc == 1 and "not a folder" in err


def test_true_shape_inside_the_padding_is_caught_by_verify(packed):
    # 40 -> 41 columns fits the same padded arrays: only the hash of the unpacked matrix can tell.
    _edit_manifest(packed, lambda m: m["tensors"]["layer.0.weight"].update(shape=[24, 41]))
    reader = CheckpointReader(packed)
    with pytest.raises(CorruptError, match=r"tensor 'layer\.0\.weight'"):
        reader.verify(progress=False)


def test_os_error_is_one_line(tmp_path, capsys):
    make_model_folder(tmp_path / "src")
    (tmp_path / "afile").write_text("x")
    rc, err = _cli(capsys, "pack", str(tmp_path / "src"), str(tmp_path / "afile" / "out"))
    assert rc == 1 and "afile" in err and len(err.splitlines()) == 1


def test_unused_weight_files_are_not_copied(tmp_path):
    src = tmp_path / "src"
    make_model_folder(src, sharded=True)
    (src / "consolidated.safetensors").write_bytes(b"duplicate weights")
    (src / "pytorch_model.bin").write_bytes(b"pickle")
    (src / "sub").mkdir()
    (src / "sub" / "model.safetensors").write_bytes(b"a sub-module's own weights")
    s = pack_folder(src, tmp_path / "out", progress=False)
    assert sorted(s.skipped_files) == ["consolidated.safetensors", "pytorch_model.bin"]
    assert "consolidated.safetensors" in str(s)
    out = tmp_path / "out"
    assert not (out / "consolidated.safetensors").exists() and not (out / "pytorch_model.bin").exists()
    assert (out / "sub" / "model.safetensors").read_bytes() == b"a sub-module's own weights"
    assert set(CheckpointReader(out).files) == {"config.json", "glyd_loader.py", "glyd.source_config.json",
                                                "tokenizer.json", "sub/model.safetensors"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pack_auto_on_gpu_uses_measured_choice(tmp_path):
    from glyd.ops import choose_layout

    make_model_folder(tmp_path / "src")
    asked = []
    choose = lambda shape: asked.append(shape) or choose_layout(shape, torch.device("cuda"))  # noqa: E731
    s = pack_folder(tmp_path / "src", tmp_path / "out", layout="auto", progress=False, choose=choose)
    assert sum(s.layouts.values()) == 3 and set(s.layouts) <= set(glyd.LAYOUTS) and len(asked) == 3
    r = CheckpointReader(tmp_path / "out")
    assert r.layout == "auto"
    assert r.verify(progress=False)["packed"] == 3


def test_pack_warns_about_matrices_that_are_not_bf16(tmp_path, caplog):
    from safetensors.torch import save_file

    src = tmp_path / "src"
    src.mkdir()
    tensors = {"w16": torch.ones(4, 4, dtype=torch.float16), "w32": torch.ones(4, 4), "n32": torch.ones(4),
               "w": torch.ones(4, 4, dtype=torch.bfloat16)}
    save_file(tensors, str(src / "model.safetensors"))
    with caplog.at_level("WARNING", logger="glyd"):
        s = pack_folder(src, tmp_path / "out", progress=False)
    assert s.packed == 1 and s.kept == {"float16": 1, "float32": 2}
    assert "2 2-D float tensors are not bfloat16 (1 float16, 1 float32)" in caplog.text
    assert "1 other float tensors are not bfloat16 (1 float32)" in caplog.text
    assert "no config.json" in caplog.text
    r = CheckpointReader(tmp_path / "out")
    assert r.get("w16").dtype == torch.float16 and r.get("n32").dtype == torch.float32 and r.config is None
