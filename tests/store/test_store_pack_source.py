"""glyd pack reads only what is inside the source folder: links, odd names and temporaries."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from store_helpers import make_model_folder

from glyd.cli import main
from glyd.errors import FormatError
from glyd.store import CheckpointReader, pack_folder, unpack_folder

#: The file that keeps the source's config.json bytes (docs/format.md): a format name, pinned.
SOURCE_CONFIG = "glyd.source_config.json"

SECRET = b"-----BEGIN OPENSSH PRIVATE KEY-----\nnot for sharing\n"


def _cli(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["-q", *argv])
    return rc, capsys.readouterr().err.strip()


@pytest.fixture
def src(tmp_path) -> Path:
    make_model_folder(tmp_path / "src", sharded=True)
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "id_ed25519").write_bytes(SECRET)
    return tmp_path / "src"


def _refused(src: Path, capsys, match: str) -> None:
    out = src.parent / "out"
    rc, err = _cli(capsys, "pack", str(src), str(out))
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert match in err, err
    assert not out.exists() and not [p for p in src.parent.iterdir() if ".glyd-" in p.name]


@pytest.mark.parametrize("name", ["tokenizer.json", "config.json", "sub/notes.txt", "model.safetensors.index.json",
                                  "model-00002-of-00002.safetensors"])
def test_a_link_out_of_the_folder_is_refused(src, capsys, name):
    link = src / name
    link.parent.mkdir(exist_ok=True)
    if link.exists():
        link.unlink()
    os.symlink(src.parent / "private" / "id_ed25519", link)
    _refused(src, capsys, f"{link}: a symbolic link to {src.parent / 'private' / 'id_ed25519'}, outside {src}")


def test_a_relative_link_that_climbs_out_is_refused(src, capsys):
    (src / "tokenizer.json").unlink()
    os.symlink("../private/id_ed25519", src / "tokenizer.json")
    _refused(src, capsys, "tokenizer.json: a symbolic link to")


def test_a_link_inside_the_folder_is_copied_as_bytes(src, tmp_path):
    (src / "sub").mkdir()
    (src / "sub" / "vocab.txt").write_text("a\nb\n")
    os.symlink("sub/vocab.txt", src / "vocab.txt")
    os.symlink("sub", src / "again")  # a link to a folder inside: its files are copied too
    pack_folder(src, tmp_path / "out", progress=False)
    out = tmp_path / "out"
    for rel in ("vocab.txt", "sub/vocab.txt", "again/vocab.txt"):
        assert not (out / rel).is_symlink() and (out / rel).read_text() == "a\nb\n"
    assert not (out / "again").is_symlink()
    assert {"vocab.txt", "sub/vocab.txt", "again/vocab.txt"} <= set(CheckpointReader(out).files)


def test_links_to_folders_out_of_the_folder_or_in_a_loop(src, capsys):
    os.symlink(src.parent / "private", src / "keys")
    _refused(src, capsys, f"{src / 'keys'}: a symbolic link to {src.parent / 'private'}, outside")
    (src / "keys").unlink()
    (src / "a").mkdir()
    os.symlink("..", src / "a" / "up")
    _refused(src, capsys, "up: a symbolic link to a folder that holds it (a loop)")


def test_broken_links_and_special_files(src, capsys):
    os.symlink("nowhere.json", src / "generation_config.json")
    _refused(src, capsys, "generation_config.json: a broken symbolic link ('nowhere.json')")
    (src / "generation_config.json").unlink()
    os.mkfifo(src / "pipe")
    _refused(src, capsys, f"{src / 'pipe'}: not a regular file or folder")


def test_a_hugging_face_cache_snapshot_packs(tmp_path):
    """Every file of a hub snapshot is a link to ../../blobs/<hash>: that one layout is followed."""
    plain = tmp_path / "plain"
    make_model_folder(plain)
    repo = tmp_path / "hub" / "models--org--toy"
    snap = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in plain.iterdir():
        blob = repo / "blobs" / f"blob-{f.name}"
        blob.write_bytes(f.read_bytes())
        os.symlink(f"../../blobs/{blob.name}", snap / f.name)
    s = pack_folder(snap, tmp_path / "out", progress=False)
    # config, tokenizer, glyd_loader.py and the source's config.json
    assert s.packed == 3 and CheckpointReader(tmp_path / "out").verify(progress=False)["files"] == 4
    # Outside the snapshot's own blobs folder, the same links are refused.
    other = tmp_path / "other" / "model"
    other.mkdir(parents=True)
    os.symlink(repo / "blobs" / "blob-tokenizer.json", other / "tokenizer.json")
    for f in ("model.safetensors", "config.json"):
        (other / f).write_bytes((plain / f).read_bytes())
    with pytest.raises(FormatError, match="outside"):
        pack_folder(other, tmp_path / "out2", progress=False)


def test_an_index_that_points_out_of_the_folder(src, capsys):
    idx = src / "model.safetensors.index.json"
    m = json.loads(idx.read_text())
    m["weight_map"]["scale"] = "../../etc/passwd"
    idx.write_text(json.dumps(m))
    _refused(src, capsys, "shard name '../../etc/passwd' is not a file of the folder")


def test_a_backslash_in_a_file_name_is_refused(src, capsys):
    (src / "we\\ird.txt").write_text("x")
    _refused(src, capsys, "we\\ird.txt: the file name has a backslash")


def test_a_name_that_is_not_utf8_is_refused(src, capsys):
    (src / os.fsdecode(b"caf\xe9.txt")).write_text("x")
    _refused(src, capsys, "the file name is not valid UTF-8")


def test_glyd_temporaries_in_the_source_are_never_copied(src, tmp_path):
    (src / ".tokenizer.json.4242.0badf00d.tmp").write_bytes(b"half a decompressed file")
    (src / ".sub.k3j4h5g6.glyd-tmp").mkdir()
    (src / ".sub.k3j4h5g6.glyd-tmp" / "model.safetensors").write_bytes(b"half a shard")
    (src / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    pack_folder(src, tmp_path / "out", progress=False)
    files = set(CheckpointReader(tmp_path / "out").files)
    assert files == {"config.json", "glyd_loader.py", SOURCE_CONFIG, "tokenizer.json", ".gitattributes"}


def test_a_relative_source_path_with_sub_folders(src, tmp_path, monkeypatch):
    (src / "1_Pooling").mkdir()
    (src / "1_Pooling" / "config.json").write_text("{}")
    os.symlink("1_Pooling", src / "pooling")
    monkeypatch.chdir(src)
    pack_folder(".", tmp_path / "out", progress=False)
    assert {"1_Pooling/config.json", "pooling/config.json"} <= set(CheckpointReader(tmp_path / "out").files)


@pytest.mark.parametrize("name", ["w_glyd_lo", "norm_glyd_x", ""])
def test_source_tensor_names_that_a_checkpoint_reserves(tmp_path, capsys, name):
    import torch
    from safetensors.torch import save_file

    src = tmp_path / "src"
    src.mkdir()
    save_file({"w": torch.ones(4, 4, dtype=torch.bfloat16), name: torch.ones(3)}, str(src / "model.safetensors"))
    _refused(src, capsys, f"tensor {name!r}: an empty name or one with '_glyd_' in it cannot be stored")


@pytest.mark.parametrize("config, match", [
    ({"model_type": "glyd", "hidden_size": 40}, "model_type 'glyd' is the type of a packed folder's config"),
    ({"model_type": "glyd"}, "model_type 'glyd' is the type of a packed folder's config"),
    ({"model_type": None, "hidden_size": 40}, "glyd could not give this config back as it is (field(s) model_type"),
])
def test_a_config_glyd_could_not_give_back_is_refused(src, capsys, config, match):
    # It used to pack, and unpack gave config.json back as {} (exit 0).
    (src / "config.json").write_text(json.dumps(config))
    _refused(src, capsys, f"{src / 'config.json'}: {match}")


CONFIGS = {
    "compact": b'{"model_type":"toy","hidden_size":40,"b":[1,2],"a":{"z":1,"y":2}}',
    "indent 4, no newline": json.dumps({"model_type": "toy", "rms_norm_eps": 1e-06, "b": 1}, indent=4).encode(),
    "spelled numbers": b'{\n "model_type": "toy", "eps": 0.000001, "big": 1E+3, "x": -0.0, "n": NaN\n}\r\n',
    "unicode": '{"model_type": "toy", "name": "caf\u00e9 \\u00e9\\ud83d\\ude00"}\n'.encode(),
    "null quantization_config": b'{"model_type": "toy", "quantization_config": null}',
    "no model_type": b'{"hidden_size": 40}',
}


@pytest.mark.parametrize("name", CONFIGS)
def test_unpack_gives_back_the_source_config_byte_for_byte(src, tmp_path, name):
    # It used to come back as json.dumps(indent=2, sort_keys=True) of the parsed config.
    (src / "config.json").write_bytes(CONFIGS[name])
    pack_folder(src, tmp_path / "packed", progress=False)
    cfg = CheckpointReader(tmp_path / "packed").config
    assert cfg["quantization_config"]["quant_method"] == "glyd"  # the packed folder's own config
    unpack_folder(tmp_path / "packed", tmp_path / "back", progress=False)
    for f in sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file() and ".safetensors" not in p.name):
        assert (tmp_path / "back" / f).read_bytes() == (src / f).read_bytes(), f  # shards and index: rewritten
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == sorted(p.name for p in src.iterdir())


def test_the_name_of_the_kept_source_config_is_glyds(src, capsys):
    (src / SOURCE_CONFIG).write_text("{}")
    _refused(src, capsys, f"{src / SOURCE_CONFIG}: the name is glyd's own")


@pytest.mark.parametrize("inside", ["packed", "sub/packed", "link/packed"])
def test_packing_into_the_source_is_refused(src, capsys, inside):
    # It used to succeed, and the source folder then held a packed checkpoint among its own files.
    (src / "sub").mkdir()
    (src.parent / "link").symlink_to(src)
    dst = src / inside if not inside.startswith("link") else src.parent / inside
    rc, err = _cli(capsys, "pack", str(src), str(dst))
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert f"{dst} is inside {src}: glyd does not write into the folder it reads" in err, err
    assert not dst.exists() and not [p for p in src.rglob("*") if ".glyd-" in p.name]


def test_a_config_larger_than_the_readers_take_is_refused_unread(src, capsys):
    # was: read whole up to glyd.json's 256 MiB bound (a sparse 64 MiB + 1 file: read into memory, then
    # "not valid JSON"), though the loaders and unpack take a config of 64 MiB at most
    with open(src / "config.json", "wb") as f:
        f.write(b"{}")
        f.truncate((64 << 20) + 1)  # the store's MAX_JSON_FILE_BYTES, and one byte
    _refused(src, capsys, "src/config.json: 67,108,865 bytes, too large for a config.json (at most 67,108,864): "
                          "refusing to pack it")


@pytest.mark.parametrize("which", ["source", "destination"])
def test_a_folder_whose_path_is_not_utf8_is_refused_in_one_line(src, capsys, which):
    # safetensors opens no file at such a path: a source crashed pack with SafetensorError's traceback
    # ("Path ... is not valid UTF-8"), and a destination was written that neither unpack nor the loader opens
    odd = src.parent / os.fsdecode(b"odd\xff")
    if which == "source":
        src = src.rename(odd)
        out = src.parent / "out"
    else:
        out = odd
    rc, err = _cli(capsys, "pack", str(src), str(out))
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert f"the {which} folder's path is not valid UTF-8" in err and "\\udcff" in err, err
    assert not out.exists() and not [p for p in src.parent.iterdir() if ".glyd-" in p.name]


def test_a_huge_safetensors_index_is_not_read_whole(src, capsys):
    # pack read model.safetensors.index.json whole however large (a sparse 64 MiB + 1 file: read into
    # memory, then "not a valid safetensors index")
    with open(src / "model.safetensors.index.json", "r+b") as f:
        f.truncate((64 << 20) + 1)  # the store's MAX_JSON_FILE_BYTES, and one byte
    _refused(src, capsys, "src/model.safetensors.index.json: 67,108,865 bytes, too large for a safetensors index "
                          "(at most 67,108,864)")
