"""The golden checkpoint whose matrices are dense11 format version 2 (tests/data/store_v1/dense11_v2,
written once by ``make_store_golden.py`` on 2026-12-05, never rewritten) must keep loading, bit for
bit, with its format version and its arrays in version 2's order (``glyd.codec.dense11_v2``): what
``glyd.pack`` wrote from 2026-12-04 until format version 3."""

from __future__ import annotations

import json

import torch
from make_store_golden import GOLDEN, golden_tensors
from store_helpers import assert_bits_equal, load_folder

import glyd
from glyd.codec import dense11
from glyd.store import CheckpointReader, unpack_folder

PATH = GOLDEN / "dense11_v2"


def test_golden_dense11_v2_loads_and_verifies(tmp_path):
    reader = CheckpointReader(PATH)
    counts = reader.verify(progress=False)
    assert counts == {"tensors": 6, "packed": 3, "raw": 3, "weights": 12 * 40 + 16 * 72 + 16 + 40 + 8, "files": 4}
    expected = golden_tensors()
    assert_bits_equal(expected, {n: reader.get_original(n) for n in reader.names()})
    m = json.loads((PATH / "glyd.json").read_text())
    packed = {n: e for n, e in m["tensors"].items() if e["kind"] == "packed"}
    assert {e["format_version"] for e in packed.values()} == {2} and m["layout"] == "dense11"
    for name in packed:
        p = reader.get(name)
        assert p.version == 2
        if p.numel:  # version 2's arrays as the codec writes them, nothing else (not version 3's order)
            want = dense11.pack_v2(expected[name])
            assert tuple(p.arrays) == tuple(want.arrays)
            assert all(torch.equal(a, b) for a, b in zip(p.arrays.values(), want.arrays.values()))
            assert not torch.equal(p.arrays["code"], dense11.pack_v3(expected[name]).arrays["code"])
            assert torch.equal(glyd.unpack(p).view(torch.int16), expected[name].view(torch.int16))
    unpack_folder(PATH, tmp_path / "out", progress=False)
    assert_bits_equal(expected, load_folder(tmp_path / "out"))
