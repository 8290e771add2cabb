"""Hostile folders through glyd.from_pretrained and native transformers loading (the bf16 loader,
the packed folder's loaders): each is refused with one clear line naming the file, before a weight
is loaded."""

from __future__ import annotations

import shutil

import pytest

import glyd
from glyd.errors import FormatError

transformers = pytest.importorskip("transformers")


def test_a_huge_safetensors_index_is_not_read_whole(tiny_model_folder, tmp_path):
    # the bf16 loader read model.safetensors.index.json whole however large (a sparse 64 MiB + 1 file:
    # read into memory as text, then "not a safetensors index (JSON with a weight_map): Expecting value")
    src = tmp_path / "m"
    shutil.copytree(tiny_model_folder("llama"), src)
    with open(src / "model.safetensors.index.json", "wb") as f:
        f.truncate((64 << 20) + 1)  # the store's MAX_JSON_FILE_BYTES, and one byte
    with pytest.raises(FormatError, match=r"m/model\.safetensors\.index\.json: 67,108,865 bytes, too large for a "
                                          r"safetensors index \(at most 67,108,864\)$"):
        glyd.from_pretrained(src, device="cpu", progress=False)
