"""Packed experts (3-D) in a checkpoint: written, read, verified and unpacked bit for bit; a damaged
or inconsistent entry named."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

import glyd
from glyd.codec import LAYOUTS, PackedExperts, pack_experts
from glyd.codec.experts import LENS
from glyd.errors import CorruptError, FormatError
from glyd.store import CheckpointReader, CheckpointWriter, info, key_for, sha256_tensor, unpack_folder
from glyd.store._safetensors import read_header

NAME = "model.layers.0.mlp.experts.gate_up_proj"


def _experts() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(3, 10, 70, generator=g) * 0.02
    w.view(-1)[::97] = 1e-30  # exceptions
    return w.to(torch.bfloat16)


def _write(path, layout: str = "fixed12"):
    w = _experts()
    with CheckpointWriter(path, layout=layout) as out:
        out.add_packed(NAME, pack_experts(w, layout), sha256_tensor(w))
        out.add_tensor("model.norm.weight", torch.ones(4, dtype=torch.bfloat16))
    return w


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_experts_round_trip_through_a_checkpoint(tmp_path, layout):
    w = _write(tmp_path / "c", layout)
    r = CheckpointReader(tmp_path / "c")
    e = r.entry(NAME)
    assert e["shape"] == [3, 10, 70] and e["kind"] == "packed" and LENS in e["arrays"]
    got = r.get(NAME)
    assert isinstance(got, PackedExperts) and got.layout == layout
    assert torch.equal(r.get_original(NAME).view(torch.int16), w.view(torch.int16))
    assert r.verify(progress=False)["weights"] == w.numel() + 4
    unpack_folder(tmp_path / "c", tmp_path / "u", progress=False)
    with safe_open(str(tmp_path / "u" / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor(NAME).view(torch.int16), w.view(torch.int16))
    rows, totals = info(tmp_path / "c")
    assert rows[0]["shape"] == (3, 10, 70) and totals["packed_weights"] == w.numel()


def _overwrite(path, key: str, offset: int, data: bytes | None = None) -> None:
    """Write ``data`` at ``offset`` of ``key``'s bytes in the shard (None: flip the byte's bits)."""
    shard = path / "model.safetensors"
    h = read_header(shard)
    with open(shard, "r+b") as f:
        f.seek(h.data_start + h.tensors[key].begin + offset)
        if data is None:
            data = bytes([f.read(1)[0] ^ 0xFF])
            f.seek(-1, 1)
        f.write(data)


def test_a_flipped_bit_in_an_expert_is_named(tmp_path):
    _write(tmp_path / "c")
    _overwrite(tmp_path / "c", key_for(NAME, "lo"), 10 * 64 + 5)  # expert 1, a used byte
    with pytest.raises(CorruptError, match=rf"{NAME}.*stored array 'lo'"):
        CheckpointReader(tmp_path / "c").verify(progress=False)


def test_lengths_that_do_not_add_up_are_named(tmp_path):
    _write(tmp_path / "c")
    _overwrite(tmp_path / "c", key_for(NAME, LENS), 0, (11).to_bytes(8, "little"))  # expert 0 'lo': 11 rows
    r = CheckpointReader(tmp_path / "c")  # opening reads headers only
    with pytest.raises(CorruptError, match=rf"{NAME}.*lens gives 31 entries of array 'lo'"):
        r.get(NAME)
    with pytest.raises(CorruptError, match=NAME):
        r.verify(progress=False)


def _edit_manifest(path, edit) -> None:
    m = json.loads((path / "glyd.json").read_text())
    edit(m["tensors"][NAME])
    (path / "glyd.json").write_text(json.dumps(m))


def test_a_3d_entry_without_lens_or_a_2d_one_with_lens_is_refused(tmp_path):
    _write(tmp_path / "c")
    _edit_manifest(tmp_path / "c", lambda e: e.update(shape=[30, 70]))
    with pytest.raises(FormatError, match=r"3-D bfloat16 experts tensor.*got bfloat16\[30, 70\]"):
        CheckpointReader(tmp_path / "c")
    _write(tmp_path / "d")
    _edit_manifest(tmp_path / "d", lambda e: e["arrays"].pop(LENS))
    with pytest.raises(FormatError, match=r"2-D bfloat16 matrix, got bfloat16\[3, 10, 70\]"):
        CheckpointReader(tmp_path / "d")


def test_the_reader_checks_the_arrays_against_the_layout(tmp_path):
    _write(tmp_path / "c")
    _edit_manifest(tmp_path / "c", lambda e: e.update(layout="tiered"))
    with pytest.raises(FormatError, match=rf"{NAME}.*unexpected arrays for experts packed as 'tiered'"):
        CheckpointReader(tmp_path / "c")



@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("shape", [[3, 9, 70], [3, 11, 70], [3, 10, 140], [3, 70, 10], [2, 15, 70]])
def test_an_experts_shape_its_arrays_contradict_is_refused_on_open(tmp_path, layout, shape):
    # glyd info (which reads no data) listed an experts tensor of 3 x 10 x 70 as [3, 9, 70] or
    # [3, 10, 140] when glyd.json said so; every reader of the values refused it, info did not
    _write(tmp_path / "c", layout)
    _edit_manifest(tmp_path / "c", lambda e: e.update(shape=shape))
    plane = LAYOUTS[layout].padded_array
    with pytest.raises(FormatError, match=rf"{NAME}.*packed array '({plane}|{LENS})' has shape"):
        info(tmp_path / "c")

def test_add_packed_takes_experts_and_refuses_other_things(tmp_path):
    with CheckpointWriter(tmp_path / "c", layout="fixed12") as out:
        with pytest.raises(TypeError, match="add_packed expects a glyd.Packed"):
            out.add_packed("x", _experts(), "0" * 64)
        out.add_packed("y", glyd.pack(torch.ones(2, 2, dtype=torch.bfloat16)), "0" * 64)
