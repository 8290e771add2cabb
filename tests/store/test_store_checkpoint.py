"""CheckpointWriter / CheckpointReader at the API level: contents, sharding, atomicity, names."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from store_helpers import leftovers, special_matrix

import glyd
from glyd.errors import CorruptError, DestinationExistsError, FormatError
from glyd.store import FORMAT, MANIFEST, VERSION, CheckpointReader, CheckpointWriter, key_for, sha256_tensor


def test_constants_and_key_naming():
    assert (FORMAT, VERSION, MANIFEST) == ("glyd-checkpoint", 1, "glyd.json")
    assert key_for("model.layers.0.mlp.up_proj.weight", "lo") == "model.layers.0.mlp.up_proj.weight_glyd_lo"


def test_sha256_tensor_is_of_raw_little_endian_bytes():
    import hashlib

    t = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)
    assert sha256_tensor(t) == hashlib.sha256(bytes([0x80, 0x3F, 0x00, 0xC0])).hexdigest()
    # C order regardless of strides; 0-dim and empty tensors hash too.
    m = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    assert sha256_tensor(m.t()) == sha256_tensor(m.t().contiguous()) != sha256_tensor(m)
    assert sha256_tensor(torch.tensor(1.5)) == hashlib.sha256(bytes([0, 0, 0xC0, 0x3F])).hexdigest()
    assert sha256_tensor(torch.zeros(0, 4)) == hashlib.sha256(b"").hexdigest()


def test_write_read_every_kind(tmp_path):
    mats = {
        "a.weight": (special_matrix(33, 70, 1), "fixed12"),
        "b.weight": (special_matrix(5, 300, 2), "tiered"),
        "empty.weight": (torch.zeros(0, 16, dtype=torch.bfloat16), "fixed12"),
    }
    raws = {
        "a.bias": torch.randn(33).to(torch.bfloat16),
        "f32": torch.randn(3, 4),
        "f16": torch.randn(7).half(),
        "ids": torch.arange(10, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "u8_3d": torch.randint(0, 255, (2, 3, 4), dtype=torch.uint8),
        "view": torch.arange(100, dtype=torch.float32)[10:20:2],  # non-contiguous view of a bigger storage
    }
    dst = tmp_path / "ckpt"
    with CheckpointWriter(dst, layout="fixed12") as w:
        for name, (m, lay) in mats.items():
            w.add_packed(name, glyd.pack(m, layout=lay), sha256_tensor(m))
        for name, t in raws.items():
            w.add_tensor(name, t)
        w.set_config({"model_type": "demo", "hidden_size": 4})
    assert leftovers(tmp_path) == []
    assert sorted(p.name for p in dst.iterdir()) == ["README.md", "config.json", "glyd.json", "model.safetensors"]

    r = CheckpointReader(dst)
    assert r.names() == [*mats, *raws]
    assert r.config == {"model_type": "demo", "hidden_size": 4}
    assert r.layout == "fixed12"
    for name, (m, lay) in mats.items():
        assert r.is_packed(name)
        p = r.get(name)
        assert isinstance(p, glyd.Packed) and p.layout == lay and p.shape == tuple(m.shape)
        assert torch.equal(glyd.unpack(p).view(torch.int16), m.view(torch.int16))
        e = r.entry(name)
        assert e["sha256"] == sha256_tensor(m) and e["file"] == "model.safetensors"
        assert set(e["arrays"]) == set(glyd.LAYOUTS[lay].arrays)
    for name, t in raws.items():
        assert not r.is_packed(name)
        got = r.get(name)
        assert got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(got.reshape(-1).view(torch.uint8), t.contiguous().reshape(-1).view(torch.uint8))
        assert r.entry(name)["dtype"] == str(t.dtype).removeprefix("torch.")
    counts = r.verify(progress=False)
    assert counts["tensors"] == len(mats) + len(raws) and counts["packed"] == len(mats) and counts["files"] == 1
    with pytest.raises(KeyError, match="nope"):
        r.get("nope")


def test_sharding_keeps_each_tensor_in_one_shard(tmp_path):
    dst = tmp_path / "c"
    ms = {f"l{i}.weight": special_matrix(16, 64, i) for i in range(5)}
    with CheckpointWriter(dst, layout="tiered", max_shard_bytes=3000) as w:
        for name, m in ms.items():
            w.add_packed(name, glyd.pack(m, "tiered"), sha256_tensor(m))
            w.add_tensor(name.replace("weight", "bias"), torch.zeros(16))
    shards = sorted(p.name for p in dst.glob("model-*.safetensors"))
    assert len(shards) > 1 and not (dst / "model.safetensors").exists()
    n = len(shards)
    assert shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    r = CheckpointReader(dst)
    for name in ms:
        e = r.entry(name)
        with safe_open(str(dst / e["file"]), framework="pt") as f:
            assert {key_for(name, a) for a in e["arrays"]} <= set(f.keys())
            assert f.metadata() == {"format": "pt", "glyd": "1"}
        for a in e["arrays"]:
            assert index["weight_map"][key_for(name, a)] == e["file"]
    total = sum(
        f.get_tensor(k).numel() * f.get_tensor(k).element_size()
        for s in shards
        for f in [safe_open(str(dst / s), framework="pt")]
        for k in f.keys()
    )
    assert index["metadata"]["total_size"] == total
    r.verify(progress=False)


def test_exception_leaves_nothing(tmp_path):
    dst = tmp_path / "c"
    with pytest.raises(RuntimeError, match="boom"):
        with CheckpointWriter(dst, layout="fixed12", max_shard_bytes=100) as w:
            for i in range(3):  # several shards already on disk when it fails
                w.add_tensor(f"t{i}", torch.zeros(64))
            raise RuntimeError("boom")
    assert not dst.exists()
    assert list(tmp_path.iterdir()) == []


def test_destination_rules(tmp_path):
    dst = tmp_path / "c"
    dst.mkdir()
    (dst / "keep.txt").write_text("user data")
    with pytest.raises(DestinationExistsError, match="already exists"):
        CheckpointWriter(dst, layout="fixed12")
    with pytest.raises(DestinationExistsError, match="not a glyd checkpoint"):
        CheckpointWriter(dst, layout="fixed12", overwrite=True)
    assert (dst / "keep.txt").read_text() == "user data"

    ck = tmp_path / "ck"
    with CheckpointWriter(ck, layout="fixed12") as w:
        w.add_tensor("a", torch.ones(2))
    with CheckpointWriter(ck, layout="fixed12", overwrite=True) as w:
        w.add_tensor("b", torch.ones(3))
    assert CheckpointReader(ck).names() == ["b"]
    assert leftovers(tmp_path) == []


def test_writer_rejects_bad_arguments(tmp_path):
    m = special_matrix(4, 8)
    p = glyd.pack(m)
    with pytest.raises(ValueError, match="unknown layout"):
        CheckpointWriter(tmp_path / "x", layout="int4")
    w = CheckpointWriter(tmp_path / "c", layout="fixed12")
    with pytest.raises(ValueError, match="64 lowercase hex"):
        w.add_packed("m", p, "abc")
    w.add_packed("m", p, sha256_tensor(m))
    with pytest.raises(ValueError, match="already added"):
        w.add_tensor("m", torch.zeros(1))
    with pytest.raises(ValueError, match="collides"):
        w.add_tensor("m_glyd_lo", torch.zeros(1))
    with pytest.raises(CorruptError, match="sha256 given"):
        w.add_tensor("z", torch.zeros(1), sha256="0" * 64)
    with pytest.raises(TypeError, match="glyd.Packed"):
        w.add_packed("q", m, sha256_tensor(m))
    src = tmp_path / "f.txt"
    src.write_text("x")
    for bad in ("../f.txt", "/etc/passwd", "a/../../b", "glyd.json", "model.safetensors", "model-00001-of-00002.safetensors"):
        with pytest.raises(ValueError):
            w.add_file(src, bad)
    w.add_file(src, "sub/f.txt")
    with pytest.raises(ValueError, match="already added"):
        w.add_file(src, "sub/f.txt")
    w.close()
    r = CheckpointReader(tmp_path / "c")
    assert (tmp_path / "c" / "sub" / "f.txt").read_text() == "x"
    assert set(r.files) == {"sub/f.txt"}
    with pytest.raises(ValueError, match="closed"):
        w.add_tensor("late", torch.zeros(1))


def test_writer_without_context_manager_cleans_up_on_abort(tmp_path):
    w = CheckpointWriter(tmp_path / "c", layout="fixed12")
    w.add_tensor("a", torch.zeros(4))
    w.flush()
    assert leftovers(tmp_path)  # work in progress lives in a hidden temporary folder
    w.abort()
    assert list(tmp_path.iterdir()) == []


def test_reader_errors_name_the_tensor(tmp_path):
    dst = tmp_path / "c"
    with CheckpointWriter(dst, layout="fixed12") as w:
        w.add_tensor("a", torch.zeros(4))
    with pytest.raises(FormatError, match="no such checkpoint"):
        CheckpointReader(tmp_path / "missing")
    with pytest.raises(FormatError, match="no glyd.json"):
        CheckpointReader(tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_get_on_gpu(tmp_path):
    m = special_matrix(8, 80)
    with CheckpointWriter(tmp_path / "c", layout="fixed12") as w:
        w.add_packed("m", glyd.pack(m, "tiered"), sha256_tensor(m))
        w.add_tensor("b", torch.ones(3))
    r = CheckpointReader(tmp_path / "c")
    p = r.get("m", device="cuda")
    assert p.device.type == "cuda" and r.get("b", device="cuda").device.type == "cuda"
    assert torch.equal(glyd.unpack(p).view(torch.int16), m.view(torch.int16))
