"""The model card a packed folder gets (``glyd.store._card``): what it says, and that it is
documentation outside the checkpoint (verify ignores it, unpack gives back the original folder);
``glyd pack`` names the tensors it kept as they are once."""

from __future__ import annotations

import logging
import re

import pytest
from store_helpers import make_model_folder

from glyd.cli import main
from glyd.store import CheckpointReader, pack_folder, unpack_folder
from glyd.store.folder import kept_patterns


def test_a_packed_folder_has_a_card_that_says_what_it_is(tmp_path, caplog):
    tensors = make_model_folder(tmp_path / "src")
    summary = pack_folder(tmp_path / "src", tmp_path / "packed", layout="tiered", progress=False)
    card = (tmp_path / "packed" / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\nlibrary_name: transformers\n") and "# src, packed losslessly with Glyd" in card
    assert "every weight is the original's, bit for bit" in card
    weights = sum(t.numel() for t in tensors.values() if t.dim() == 2 and t.dtype.is_floating_point)
    assert f"| packed matrices | {weights:,} weights" in card and f"({summary.bits_per_weight:.3f} bits a weight)" in card
    assert "| layout | `tiered` (3 matrices) |" in card and "| other tensors | 3, kept as they are" in card
    assert 'glyd.from_pretrained("path/to/this/folder", exact=True)' in card and "glyd unpack" in card
    assert ("trust_remote_code=True" in card) == (tmp_path / "packed" / "glyd_loader.py").is_file()
    with caplog.at_level(logging.INFO, logger="glyd"):
        reader = CheckpointReader(tmp_path / "packed")
    assert "README.md" in reader.ignored and not any("README" in r.getMessage() for r in caplog.records)
    assert reader.verify(progress=False)["tensors"] == len(tensors)
    assert "README.md" not in reader.files
    unpack_folder(tmp_path / "packed", tmp_path / "back", progress=False)
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == sorted(p.name for p in (tmp_path / "src").iterdir())


def test_the_sources_own_card_is_kept_and_given_back(tmp_path):
    make_model_folder(tmp_path / "src")
    original = "# The original card\n\nWritten by the model's authors.\n".encode()
    (tmp_path / "src" / "README.md").write_bytes(original)
    pack_folder(tmp_path / "src", tmp_path / "packed", progress=False)
    packed = tmp_path / "packed"
    assert (packed / "README.md").read_bytes() == original  # one of the checkpoint's files, verified
    assert "packed losslessly with Glyd" in (packed / "README.glyd.md").read_text(encoding="utf-8")
    reader = CheckpointReader(packed)
    assert "README.md" in reader.files and "README.glyd.md" in reader.ignored
    reader.verify(progress=False)
    unpack_folder(packed, tmp_path / "back", progress=False)
    assert (tmp_path / "back" / "README.md").read_bytes() == original
    assert not (tmp_path / "back" / "README.glyd.md").exists()


def test_a_hub_snapshot_is_named_after_its_repository(tmp_path):
    snap = tmp_path / "hub" / "models--org--tiny-model" / "snapshots" / "0123abc"
    make_model_folder(snap)
    pack_folder(snap, tmp_path / "packed", progress=False)
    assert "# org/tiny-model, packed losslessly with Glyd" in (tmp_path / "packed" / "README.md").read_text()


def test_kept_tensor_names_fold_their_layer_numbers():
    names = [f"model.layers.{i}.input_layernorm.weight" for i in range(30)] + ["model.norm.weight", "layers.2.b"]
    assert kept_patterns(names) == ["model.layers.*.input_layernorm.weight (30)", "model.norm.weight", "layers.2.b"]


def test_pack_names_the_kept_tensors_once(tmp_path, capsys, caplog):
    make_model_folder(tmp_path / "src")
    with caplog.at_level(logging.INFO, logger="glyd"):
        assert main(["pack", str(tmp_path / "src"), str(tmp_path / "packed")]) == 0
    out = capsys.readouterr().out + "\n".join(r.getMessage() for r in caplog.records)
    assert len(re.findall(r"kept unpacked", out)) == 1
    for name in ("layer.0.bias", "pos_ids", "scale"):
        assert len(re.findall(rf"\b{re.escape(name)}\b", out)) == 1, name


@pytest.mark.parametrize("names, want", [([], []), (["a.1.b", "a.1.b"], ["a.*.b (2)"])])
def test_kept_patterns_edge_cases(names, want):
    assert kept_patterns(names) == want


def test_a_class_name_utf8_cannot_encode_is_escaped_in_the_card(tmp_path):
    # config.json's architectures ["A\udc80"] (JSON may spell a lone surrogate) made the card's
    # write_text raise UnicodeEncodeError out of glyd pack
    make_model_folder(tmp_path / "src")
    (tmp_path / "src" / "config.json").write_text('{"model_type": "toy", "architectures": ["Toy\\udc80Model"]}')
    pack_folder(tmp_path / "src", tmp_path / "packed", progress=False)
    card = (tmp_path / "packed" / "README.md").read_text(encoding="utf-8")
    assert "`Toy\\udc80Model.from_pretrained(...)`" in card
    assert CheckpointReader(tmp_path / "packed").verify(progress=False)["tensors"] == 6
