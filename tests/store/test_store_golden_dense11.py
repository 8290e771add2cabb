"""The golden checkpoints whose matrices are dense11 format versions 2 and 3 (tests/data/store_v1/dense11_v2,
dense11_v3, written once by ``make_store_golden.py``, never rewritten; version 1 is
``test_store_golden.py``'s) must keep loading, bit for bit, with their format version and their arrays
in that version's order: version 2's as ``glyd.codec.dense11`` writes them (what ``glyd.pack`` wrote from
2026-12-04 until version 3), version 3's the same bytes in the block-wise order (``glyd.codec.dense11_v3``)."""

from __future__ import annotations

import json

import pytest
import torch
from make_store_golden import GOLDEN, golden_tensors
from store_helpers import assert_bits_equal, load_folder

import glyd
from glyd.codec import dense11
from glyd.store import CheckpointReader, unpack_folder


@pytest.mark.parametrize("version", [2, 3])
def test_golden_dense11_loads_and_verifies(tmp_path, version):
    path = GOLDEN / f"dense11_v{version}"
    reader = CheckpointReader(path)
    counts = reader.verify(progress=False)
    assert counts == {"tensors": 6, "packed": 3, "raw": 3, "weights": 12 * 40 + 16 * 72 + 16 + 40 + 8, "files": 4}
    expected = golden_tensors()
    assert_bits_equal(expected, {n: reader.get_original(n) for n in reader.names()})
    m = json.loads((path / "glyd.json").read_text())
    packed = {n: e for n, e in m["tensors"].items() if e["kind"] == "packed"}
    assert {e["format_version"] for e in packed.values()} == {version} and m["layout"] == "dense11"
    for name in packed:
        p = reader.get(name)
        assert p.version == version
        if p.numel:  # version 2's arrays (in version 3: in the block-wise order), nothing else
            want, other = dense11.pack_v2(expected[name]), dense11.pack_v3(expected[name])
            arrays = p.arrays if version == 2 else dense11.as_v2(p).arrays
            assert tuple(arrays) == tuple(want.arrays)
            assert all(torch.equal(a, b) for a, b in zip(arrays.values(), want.arrays.values()))
            assert not torch.equal(p.arrays["code"], (other if version == 2 else want).arrays["code"])
            assert torch.equal(glyd.unpack(p).view(torch.int16), expected[name].view(torch.int16))
    unpack_folder(path, tmp_path / "out", progress=False)
    assert_bits_equal(expected, load_folder(tmp_path / "out"))
