"""Hostile packed folders through every store reader: seeded flips, truncations and appends of
every file, every field of glyd.json edited, crafted shard headers, links and added files.

Each case is a fresh copy of a pristine folder with one mutation (``fuzz_cases.py``); each reader
(CheckpointReader.get, CheckpointReader.verify, info, unpack_folder, ``glyd verify|info|unpack``)
must give one clear glyd error, or what it gives for the pristine folder bit for bit
(``fuzz_readers.py`` has the rules, and the two documented exceptions). The model loaders run the
same cases on a transformers model in ``tests/hf/test_fuzz_loading.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from fuzz_cases import (
    APPENDS, GENERIC, INDEX, MANIFEST, SPECIAL_SAYS, added_file_cases, byte_cases, folder_files, header_cases, index_cases,
    link_cases, manifest_cases, special_file_cases, text_cases,
)
from fuzz_readers import check_campaign, pristine, read_tree, run_cases
from safetensors.torch import save_file
from store_helpers import assert_bits_equal, load_folder, special_matrix

from glyd.store import pack_folder, unpack_folder

#: The file that keeps the source's config.json bytes (docs/format.md): a format name, pinned.
SOURCE_CONFIG = "glyd.source_config.json"

#: name -> (layout, sharded). The tiered folder is one shard; the fixed12 one has two and an index.
BASES = {"fixed12": ("fixed12", True), "tiered": ("tiered", False)}
SEED = 20240607


def make_source(path: Path, sharded: bool) -> None:
    """A small model folder: packed matrices (two of one shape), raw tensors (two of one size),
    int64 and fp32 tensors, config.json, a tokenizer and a sub-folder's file."""
    path.mkdir(parents=True)
    g = torch.Generator().manual_seed(7)
    t = {
        "embed.weight": special_matrix(50, 40, 1), "layer.0.weight": special_matrix(24, 40, 2),
        "layer.2.weight": special_matrix(24, 40, 5), "layer.0.bias": (torch.randn(24, generator=g) / 9).bfloat16(),
        "layer.2.bias": (torch.randn(24, generator=g) / 9).bfloat16(), "layer.1.weight": special_matrix(40, 24, 4),
        "pos_ids": torch.arange(8), "scale": torch.tensor([0.5, 2.0]),
    }
    names = list(t)  # each shard has tensors of one size: swapped byte ranges would still tile
    parts = [[n for n in names if n.endswith("weight")], [n for n in names if not n.endswith("weight")]]
    parts = parts if sharded else [names]
    weight_map = {}
    for i, part in enumerate(parts, 1):
        f = f"model-{i:05d}-of-{len(parts):05d}.safetensors" if sharded else "model.safetensors"
        save_file({k: t[k] for k in part}, str(path / f), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, f))
    if sharded:
        (path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 40}))
    (path / "tokenizer.json").write_text('{"version": "1.0", "added_tokens": []}')
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text('{"word_embedding_dimension": 40}')


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """name -> (pristine packed folder, what every reader gives for it)."""
    out = {}
    for name, (layout, sharded) in BASES.items():
        root = tmp_path_factory.mktemp(f"fuzz-{name}")
        make_source(root / "src", sharded)
        pack_folder(root / "src", root / "packed", layout=layout, progress=False)
        base = pristine(root / "packed", root)
        _unpacks_to_the_source(root, base)
        out[name] = root / "packed", base
    return out


def _unpacks_to_the_source(root: Path, base) -> None:
    """The pristine folder, unpacked, is the source: every tensor bit for bit, every other file
    byte for byte (config.json too: the source's own spelling, not glyd's), so "the pristine
    folder's bits" are the original model's."""
    unpack_folder(root / "packed", root / "unpacked", progress=False)
    assert read_tree(root / "unpacked") == base.unpacked
    assert_bits_equal(load_folder(root / "src"), load_folder(root / "unpacked"))
    for rel in folder_files(root / "src"):
        if rel.endswith(".safetensors") or rel == INDEX:
            continue
        assert (root / "unpacked" / rel).read_bytes() == (root / "src" / rel).read_bytes(), rel
    assert sorted(folder_files(root / "unpacked")) == sorted(folder_files(root / "src"))


def _run(bases, name: str, cases, tmp_path: Path) -> dict[str, int]:
    folder, base = bases[name]
    return check_campaign(cases, run_cases(cases, folder, base, tmp_path))


def _one(bases, name: str) -> Path:
    return bases[name][0]


@pytest.mark.parametrize("name", BASES)
def test_flips_truncations_and_appends_of_every_file(bases, name, tmp_path):
    folder = _one(bases, name)
    files = folder_files(folder)
    cases = byte_cases(folder, SEED, flips=12, truncations=6)
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(cases) == len(shards) * (8 + 12 + 12 + 6 + len(APPENDS)) + (len(files) - len(shards)) * (12 + 6 + len(APPENDS))
    assert {c.touches for c in cases} == set(files) and {MANIFEST, "config.json", "tokenizer.json"} <= set(files)
    outcomes = run_cases(cases, folder, bases[name][1], tmp_path)
    counts = check_campaign(cases, outcomes)
    # A data flip is the one change a reader that does not verify may return; verify never does.
    silent = {o.case for o in outcomes if o.kind == "silent"}
    data = {c.id for c in cases if c.data_only}
    assert silent and silent <= data and counts["error"] and counts["same"]
    assert all(o.kind == "error" for o in outcomes if o.case in data and o.reader == "verify")


def _required_fields(manifest: dict, cases) -> set[tuple]:
    """The fields every campaign must edit: each top-level key, each field of the tensor entries
    and array specs it chose (one packed and one raw tensor, two arrays each: checked), each file."""
    chosen = {c.field[1] for c in cases if c.field[:1] == ("tensors",) and len(c.field) == 3}
    kinds = sorted(manifest["tensors"][n]["kind"] for n in chosen)
    assert kinds == ["packed", "raw"], kinds
    need = {(k,) for k in manifest} | {("files", f) for f in manifest["files"]}
    need |= {("tensors", n, f) for n in chosen for f in manifest["tensors"][n]}
    arrays = {c.field[3] for c in cases if len(c.field) == 5}
    assert len(arrays) == 2, arrays
    packed = next(n for n in chosen if manifest["tensors"][n]["kind"] == "packed")
    need |= {("tensors", packed, "arrays", a, f) for a in arrays for f in ("dtype", "shape", "sha256")}
    return need


@pytest.mark.parametrize("name", BASES)
def test_every_field_of_the_manifest(bases, name, tmp_path):
    folder = _one(bases, name)
    manifest = json.loads((folder / MANIFEST).read_text())
    cases = manifest_cases(manifest, SEED)
    for field in _required_fields(manifest, cases):
        got = [c for c in cases if c.field == field]
        assert len(got) >= len(GENERIC), (field, len(got))
    assert sum(c.family == "structure" for c in cases) >= 2 * len(manifest["tensors"]) + 2 * len(manifest["files"])
    counts = _run(bases, name, cases, tmp_path)
    assert counts["error"] and counts["same"]  # sha256 and glyd_version edits load the same bits


HEADER_FAMILIES = {"shift", "overlap", "dtype-same-size", "dtype-size", "shape-same-numel", "shape-size", "rename",
                   "offsets", "swap", "permute", "extra", "metadata", "padding", "whole"}


@pytest.mark.parametrize("name", BASES)
def test_crafted_shard_headers(bases, name, tmp_path):
    folder = _one(bases, name)
    cases = header_cases(folder, SEED)
    for shard in (f for f in folder_files(folder) if f.endswith(".safetensors")):
        assert {c.family for c in cases if c.touches == shard} == HEADER_FAMILIES, shard
    counts = _run(bases, name, cases, tmp_path)
    assert counts["same"] and counts["silent"] == 0  # more spaces of padding are fine; nothing else is


@pytest.mark.parametrize("name", BASES)
def test_whole_text_of_the_json_files(bases, name, tmp_path):
    folder = _one(bases, name)
    names = [MANIFEST, "config.json", SOURCE_CONFIG, "tokenizer.json", *([INDEX] if (folder / INDEX).exists() else [])]
    cases = [c for n in names for c in text_cases(n)]
    assert len(cases) == 12 * len(names)
    counts = _run(bases, name, cases, tmp_path)
    assert counts["error"] and counts["same"]  # glyd.json re-indented is the same checkpoint


def test_fields_of_the_index(bases, tmp_path):
    folder = _one(bases, "fixed12")
    index = json.loads((folder / INDEX).read_text())
    cases = index_cases(index, SEED)
    fields = {c.field for c in cases}
    assert {("metadata",), ("weight_map",), ("metadata", "total_size"), ("weight_map", "no.such.tensor")} <= fields
    assert len([f for f in fields if f[0] == "weight_map" and len(f) == 2]) == 3 + 1
    counts = _run(bases, "fixed12", cases, tmp_path)
    assert counts["error"] and counts["same"] == 0  # every key, value and the total are checked


@pytest.mark.parametrize("name", BASES)
def test_links_and_added_files(bases, name, tmp_path):
    folder = _one(bases, name)
    files = folder_files(folder)
    subdirs = {f.split("/")[0] for f in files if "/" in f}
    links, added = link_cases(folder), added_file_cases(folder)
    assert len(links) == 5 * len(files) + 1 + 3 * len(subdirs) + 6 and len(added) == 18
    counts = _run(bases, name, links + added, tmp_path)
    assert counts["same"] and counts["error"] and counts["silent"] == 0


@pytest.mark.parametrize("name", BASES)
def test_pipes_devices_and_folders_in_place_of_files(bases, name, tmp_path):
    # A shard that was a FIFO or a link to /dev/zero was "missing", glyd.json "no glyd.json"; a
    # reader that opened a FIFO would hang (the alarm turns a hang into a failure).
    import signal

    folder = _one(bases, name)
    cases = special_file_cases(folder)
    assert len(cases) == 3 * len(folder_files(folder))
    signal.signal(signal.SIGALRM, lambda *a: pytest.fail("a reader blocked on a FIFO or read a device without end"))
    signal.alarm(600)
    try:
        outcomes = run_cases(cases, folder, bases[name][1], tmp_path)
    finally:
        signal.alarm(0)
    counts = check_campaign(cases, outcomes)
    assert counts["silent"] == 0, counts
    # glyd's model card (README.md, or README.glyd.md beside a source's) is documentation outside the
    # checkpoint: no reader opens it, so a FIFO or a device there changes nothing ("same"); every
    # other file, when replaced, is refused by every reader (none silent, none "same").
    from glyd.store._card import CARD, CARD_BESIDE

    def on_card(o) -> bool:
        return next(c for c in cases if c.id == o.case).touches in (CARD, CARD_BESIDE)

    card = [o for o in outcomes if on_card(o)]
    assert all(o.kind == "same" for o in card), card
    assert counts["error"] == len(outcomes) - len(card), counts
    for o in outcomes:
        case = next(c for c in cases if c.id == o.case)
        if not on_card(o):
            assert SPECIAL_SAYS[case.field[0]] in o.detail, o


@pytest.mark.slow
@pytest.mark.parametrize("name", BASES)
def test_sweep(bases, name, tmp_path):
    """Many more offsets, every tensor entry and array spec, every header pair: a few minutes."""
    folder = _one(bases, name)
    manifest = json.loads((folder / MANIFEST).read_text())
    cases = (byte_cases(folder, SEED + 1, flips=64, truncations=24) + manifest_cases(manifest, SEED + 1, full=True)
             + header_cases(folder, SEED + 1, full=True))
    assert len(cases) > 3000
    _run(bases, name, cases, tmp_path)
    shutil.rmtree(tmp_path, ignore_errors=True)
