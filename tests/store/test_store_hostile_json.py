"""Hostile JSON and headers (glyd.json, shard headers): one clear error each, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from store_helpers import leftovers, make_packed, rewrite_header

from glyd.cli import main
from glyd.errors import FormatError
from glyd.store import CheckpointReader, CheckpointWriter, pack_folder, unpack_folder
from glyd.store._safetensors import read_header

DEEP = 100_000  # far past Python's recursion limit


def _cli(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["-q", *argv])
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.fixture
def packed(tmp_path) -> Path:
    return make_packed(tmp_path, sharded=True)


def _shard(packed: Path) -> Path:
    return packed / "model-00001-of-00002.safetensors"


def _set_manifest_text(packed: Path, edit) -> None:
    """Rewrite glyd.json as text: ``edit(text) -> text``."""
    p = packed / "glyd.json"
    p.write_text(edit(p.read_text()))


# -- glyd.json --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "edit, match",
    [
        # RecursionError inside json.loads
        (lambda t: t.replace('"glyd_version": ', '"glyd_version": ' + "[" * DEEP + "]" * DEEP + ", \"x\": "), "nested too deeply"),
        # ValueError: Python's int-string conversion limit
        (lambda t: t.replace('"version": 1', '"version": 1' + "0" * 5000), "digits"),
        # parses, but deep enough that copying an entry would recurse past the limit
        (lambda t: t.replace('"kind": "raw"', '"extra": ' + "[" * 600 + "]" * 600 + ', "kind": "raw"', 1), "nested more than 64"),
        (lambda t: t.replace('"version": 1', '"version": 1, "version": 1'), "duplicate key 'version'"),
    ],
    ids=["deep", "long-int", "deep-but-parsable", "duplicate"],
)
def test_hostile_manifest_json_is_one_line(packed, tmp_path, edit, match, capsys):
    _set_manifest_text(packed, edit)
    with pytest.raises(FormatError, match=match):
        CheckpointReader(packed)
    for argv in (["verify", str(packed)], ["info", str(packed)], ["unpack", str(packed), str(tmp_path / "out")]):
        rc, err = _cli(capsys, *argv)
        assert rc == 1 and "glyd.json" in err and match.split()[0] in err and len(err.splitlines()) == 1, (argv, err)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda m: m.update(layout="bogus"), r"layout: unknown layout 'bogus'"),
        (lambda m: m.update(layout=7), r"layout: missing or not a string"),
        (lambda m: m.update(tensors={}), r"tensors: is empty"),
        (lambda m: m["tensors"]["scale"].update(shape=[0, 2**62, 2**62]), r"tensors\['scale'\]\.shape"),
        (lambda m: m["tensors"]["embed.weight"].update(layout={}), r"tensors\['embed\.weight'\]\.layout: unknown layout \{\}"),
    ],
)
def test_manifest_fields_are_checked(packed, edit, match, capsys):
    m = json.loads((packed / "glyd.json").read_text())
    edit(m)
    (packed / "glyd.json").write_text(json.dumps(m))
    with pytest.raises(FormatError, match=match):
        CheckpointReader(packed).verify(progress=False)
    rc, err = _cli(capsys, "verify", str(packed))
    assert rc == 1 and "glyd.json" in err and len(err.splitlines()) == 1


def test_a_checkpoint_without_tensors_is_never_written(tmp_path):
    w = CheckpointWriter(tmp_path / "c", layout="fixed12")
    w.add_file(Path(__file__), "notes.py")
    with pytest.raises(ValueError, match="no tensors"):
        w.close()
    assert list(tmp_path.iterdir()) == []


# -- shard headers ---------------------------------------------------------------------------------


def test_shard_metadata_must_be_glyds(packed, capsys):
    rewrite_header(_shard(packed), lambda h: h.update(__metadata__={"format": "pt", "glyd": "7"}))
    with pytest.raises(FormatError, match=r"model-00001-of-00002\.safetensors: safetensors __metadata__ .*'glyd': '7'"):
        CheckpointReader(packed)
    rc, err = _cli(capsys, "verify", str(packed))
    assert rc == 1 and "__metadata__" in err and len(err.splitlines()) == 1
    rewrite_header(_shard(packed), lambda h: h.pop("__metadata__"))
    with pytest.raises(FormatError, match=r"__metadata__ is \{\}"):
        CheckpointReader(packed)


@pytest.mark.parametrize(
    "raw, match",
    [
        (b'{"a": ' + b"[" * DEEP + b"]" * DEEP + b"}", "nested too deeply"),
        (b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1' + b"0" * 5000 + b"]}}", "digits"),
        (b'{"a": {"dtype": "U8", "shape": [0, 4611686018427387904, 4611686018427387904], "data_offsets": [0, 0]}}',
         "invalid shape"),
        (b'{"a": {"dtype": ["U8"], "shape": [1], "data_offsets": [0, 1]}}', r"invalid dtype \['U8'\]"),
    ],
    ids=["deep", "long-int", "huge-shape", "unhashable-dtype"],
)
def test_hostile_shard_header_is_one_line(packed, raw, match, capsys):
    rewrite_header(_shard(packed), lambda h: raw)
    with pytest.raises(FormatError, match=match):
        read_header(_shard(packed))
    rc, err = _cli(capsys, "verify", str(packed))
    assert rc == 1 and "model-00001-of-00002.safetensors" in err and len(err.splitlines()) == 1, err


def _two_tensors(path: Path, second_offsets) -> Path:
    """A safetensors file of bf16 matrices 'a' and 'b' (4 x 4) where 'b' has ``second_offsets``."""
    save_file({"a": torch.ones(4, 4, dtype=torch.bfloat16), "b": torch.zeros(4, 4, dtype=torch.bfloat16)},
              str(path), metadata={"format": "pt"})
    rewrite_header(path, lambda h: h["b"].update(data_offsets=second_offsets(h)))
    return path


def test_overlapping_and_gapped_byte_ranges(tmp_path):
    f = _two_tensors(tmp_path / "overlap.safetensors", lambda h: h["a"]["data_offsets"])
    with pytest.raises(FormatError, match=r"overlap.safetensors: tensor '[ab]': .*overlap tensor '[ab]'"):
        read_header(f)
    # b moved 2 bytes into a: overlap, and not the same range
    f = _two_tensors(tmp_path / "shifted.safetensors", lambda h: [h["a"]["data_offsets"][1] - 2, h["a"]["data_offsets"][1] + 30])
    with pytest.raises(FormatError, match="overlap"):
        read_header(f)
    # a gap between two tensors: safetensors itself refuses such a file
    save_file({"a": torch.ones(4, dtype=torch.uint8), "b": torch.ones(4, dtype=torch.uint8)}, str(tmp_path / "gap.safetensors"))
    rewrite_header(tmp_path / "gap.safetensors", lambda h: h["b"].update(shape=[2], data_offsets=[6, 8]))
    with pytest.raises(FormatError, match=r"tensor 'b': 2 unused bytes after tensor 'a'"):
        read_header(tmp_path / "gap.safetensors")


def test_pack_refuses_tensors_that_share_bytes(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    _two_tensors(src / "model.safetensors", lambda h: h["a"]["data_offsets"])
    rc, err = _cli(capsys, "pack", str(src), str(tmp_path / "out"))
    assert rc == 1 and "overlap" in err and "model.safetensors" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_readers_refuse_tensors_that_share_bytes(tmp_path, capsys):
    two = tmp_path / "two"
    with CheckpointWriter(two, layout="fixed12") as w:
        w.add_tensor("pos_ids", torch.arange(8))
        w.add_tensor("more_ids", torch.arange(8, 16))
    rewrite_header(two / "model.safetensors", lambda h: h["more_ids"].update(data_offsets=h["pos_ids"]["data_offsets"]))
    with pytest.raises(FormatError, match=r"model\.safetensors: tensor '\w+': .* overlap tensor"):
        CheckpointReader(two)
    for argv in (["verify", str(two)], ["info", str(two)], ["unpack", str(two), str(tmp_path / "out")]):
        rc, err = _cli(capsys, *argv)
        assert rc == 1 and "overlap" in err and len(err.splitlines()) == 1, (argv, err)
    with pytest.raises(FormatError, match="overlap"):
        unpack_folder(two, tmp_path / "out2", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two"]


def test_readers_refuse_byte_ranges_moved_between_tensors(tmp_path, capsys):
    # Swapped (or reordered) ranges of tensors of one size tile the data like the real ones, so only
    # glyd's own order tells them apart; before, CheckpointReader.get returned each tensor the
    # other's bytes, and verify=False loading a model with two weights swapped, without an error.
    two = tmp_path / "two"
    with CheckpointWriter(two, layout="fixed12") as w:
        w.add_tensor("a_ids", torch.arange(8))
        w.add_tensor("b_ids", torch.arange(8, 16))
    shard = two / "model.safetensors"
    rewrite_header(shard, lambda h: h.update(a_ids={**h["a_ids"], "data_offsets": h["b_ids"]["data_offsets"]},
                                             b_ids={**h["b_ids"], "data_offsets": h["a_ids"]["data_offsets"]}))
    assert read_header(shard).tensors["a_ids"].begin == 64  # a valid safetensors file all the same
    with pytest.raises(FormatError, match=r"model\.safetensors: tensor 'a_ids': data_offsets \[64, 128\] are not "
                                          r"where a glyd shard holds it \(\[0, 64\]"):
        CheckpointReader(two)
    for argv in (["verify", str(two)], ["info", str(two)], ["unpack", str(two), str(tmp_path / "out")]):
        rc, err = _cli(capsys, *argv)
        assert rc == 1 and "not where a glyd shard holds it" in err and len(err.splitlines()) == 1, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two"]


@pytest.mark.parametrize("edit", [
    lambda h: h.update({"w\udc80": h.pop("w")}),  # json.dumps spells it "w\udc80"
    lambda h: h["__metadata__"].update(note="\ud800"),
], ids=["tensor-name", "metadata"])
def test_a_lone_surrogate_in_a_source_header_is_one_line(tmp_path, capsys, edit):
    # Python's json reads "\udc80"; safetensors refuses the file, and its SafetensorError escaped glyd pack
    src = tmp_path / "src"
    src.mkdir()
    save_file({"w": torch.ones(4, 8, dtype=torch.bfloat16)}, str(src / "model.safetensors"), metadata={"format": "pt"})
    (src / "config.json").write_text('{"model_type": "toy"}')
    rewrite_header(src / "model.safetensors", edit)
    with pytest.raises(FormatError, match=r"model\.safetensors: not a safetensors file: the header holds '.*', which "
                                          r"is not valid Unicode \(a lone surrogate\)"):
        read_header(src / "model.safetensors")
    rc, err = _cli(capsys, "pack", str(src), str(tmp_path / "out"))
    assert rc == 1 and "lone surrogate" in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_listed_file_name_no_file_can_have_is_one_line(packed, capsys):
    # glyd.json "files": {"a\ud800.txt": ...} (a lone surrogate, which maps to no bytes) passed the
    # manifest's checks, then every reader raised UnicodeEncodeError opening it
    text = (packed / "glyd.json").read_text()
    some = next(iter(json.loads(text)["files"].values()))
    (packed / "glyd.json").write_text(text.replace('"files": {', f'"files": {{"a\\ud800.txt": "{some}", ', 1))
    with pytest.raises(FormatError, match=r"glyd\.json: files\['a\\ud800\.txt'\]: must be a relative path inside"):
        CheckpointReader(packed)
    for argv in (["verify", str(packed)], ["info", str(packed)], ["unpack", str(packed), str(packed.parent / "out")]):
        rc, err = _cli(capsys, *argv)
        assert rc == 1 and "files['a\\ud800.txt']" in err and len(err.splitlines()) == 1, (argv, err)
    assert not (packed.parent / "out").exists()


@pytest.mark.parametrize("meta", [[], "", 0, False], ids=["list", "empty-string", "zero", "false"])
def test_a_falsy_metadata_that_is_no_object_is_one_line(tmp_path, capsys, meta):
    # read_header took any falsy __metadata__ for none ("or {}"); safetensors refuses it, and its
    # SafetensorError escaped glyd pack (and the diffusers bf16 loader)
    src = tmp_path / "src"
    src.mkdir()
    save_file({"w": torch.ones(4, 8, dtype=torch.bfloat16)}, str(src / "model.safetensors"), metadata={"format": "pt"})
    (src / "config.json").write_text('{"model_type": "toy"}')
    rewrite_header(src / "model.safetensors", lambda h: h.update(__metadata__=meta))
    with pytest.raises(FormatError, match=r"model\.safetensors: safetensors __metadata__ must map strings to strings"):
        read_header(src / "model.safetensors")
    rc, err = _cli(capsys, "pack", str(src), str(tmp_path / "out"))
    assert rc == 1 and "__metadata__" in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_huge_safetensors_index_is_not_read_whole(packed, capsys):
    # opening a sharded checkpoint read its model.safetensors.index.json whole however large (a sparse
    # 64 MiB + 1 file: read into memory, then refused as not JSON)
    index = packed / "model.safetensors.index.json"
    with open(index, "r+b") as f:
        f.truncate((64 << 20) + 1)  # the store's MAX_JSON_FILE_BYTES, and one byte
    with pytest.raises(FormatError, match=r"model\.safetensors\.index\.json: 67,108,865 bytes, too large for a "
                                          r"safetensors index \(at most 67,108,864\)$"):
        CheckpointReader(packed)
    rc, err = _cli(capsys, "unpack", str(packed), str(packed.parent / "back"))
    assert rc == 1 and len(err.splitlines()) == 1 and "too large for a safetensors index" in err, err


def _huge(path: Path) -> None:
    """``path`` as a JSON file of 64 MiB + 1 bytes, sparse (no disk): read whole it would take that memory."""
    with open(path, "wb") as f:
        f.write(b"{}")
        f.truncate((64 << 20) + 1)  # the store's MAX_JSON_FILE_BYTES, and one byte


def test_a_huge_config_is_not_read_whole(packed):
    # CheckpointReader.config read config.json whole however large (a sparse 64 MiB + 1 file: read into
    # memory, then "not valid JSON (Extra data ...)")
    _huge(packed / "config.json")
    reader = CheckpointReader(packed)  # opening reads no config
    with pytest.raises(FormatError, match=r"packed/config\.json: 67,108,865 bytes, too large for a config\.json "
                                          r"\(at most 67,108,864\)$"):
        reader.config


@pytest.mark.parametrize("name", ["config.json", "glyd.source_config.json"])
def test_unpack_refuses_a_huge_config_unread(packed, capsys, name):
    # unpack read either file whole up to glyd.json's 256 MiB bound (a sparse 64 MiB + 1 file: read into
    # memory, then a sha256 mismatch); a config has the one bound, 64 MiB, everywhere
    _huge(packed / name)
    rc, err = _cli(capsys, "unpack", str(packed), str(packed.parent / "back"))
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert f"packed/{name}: 67,108,865 bytes, too large for a config.json (at most 67,108,864)" in err, err
    assert not (packed.parent / "back").exists()


def test_the_writer_refuses_a_config_the_readers_would_refuse(tmp_path):
    # a source config.json within the bound could grow past it when written with indent 2: the folder
    # written would then be refused by every reader of it
    config = {"model_type": "toy", "pad": "x" * (64 << 20)}
    with pytest.raises(FormatError, match=r"out/config\.json: would be 67,108,9\d\d bytes, too large for a "
                                          r"config\.json \(at most 67,108,864\)$"):
        with CheckpointWriter(tmp_path / "out", layout="fixed12") as w:
            w.add_tensor("w", torch.ones(4, 8, dtype=torch.bfloat16))
            w.set_config(config)
    assert list(tmp_path.iterdir()) == []


def test_the_manifest_is_bounded_as_it_is_read(packed, monkeypatch):
    # glyd.json was checked by its size and then read whole (a file growing in between passed): now one bounded
    # read, for the checkpoint reader and for the loaders' shape check (glyd.hf.checks.stored_shapes)
    from glyd.hf import checks
    from glyd.store import checkpoint

    size = (packed / "glyd.json").stat().st_size
    for module in (checkpoint, checks):
        monkeypatch.setattr(module, "MAX_MANIFEST_BYTES", size - 1)
    too_large = rf"packed/glyd\.json: {size:,} bytes, too large for a glyd manifest \(at most {size - 1:,}\)$"
    with pytest.raises(FormatError, match=too_large):
        CheckpointReader(packed)
    with pytest.raises(FormatError, match=too_large):
        checks.stored_shapes(packed)
    monkeypatch.setattr(checkpoint, "MAX_MANIFEST_BYTES", size)
    assert CheckpointReader(packed).config is not None  # the bound itself is accepted
