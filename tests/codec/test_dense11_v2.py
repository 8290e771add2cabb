"""dense11 format version 2 (``glyd.codec.dense11_v2``): the nibble code words, a run's escapes of
rank 8 and up as exceptions, golden bytes, hostile arrays, per-layout format versions, and a v2
checkpoint through ``glyd.store`` beside the released v1 one."""

import json

import pytest
import torch

import glyd
from glyd.codec import LAYOUTS, dense11
from glyd.codec import dense11_v2 as V
from glyd.errors import CorruptError, FormatError
from glyd.ops.rows import unpack_rows
from glyd.store import CheckpointReader, CheckpointWriter, sha256_tensor


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def test_nibble_words():
    # nibble i of word x: the code of column 8x + i (low 3 bits); its bit 3: bit x of column 24 + i's code
    codes = torch.zeros(1, 1, 32, dtype=torch.int64)
    codes[0, 0, 0], codes[0, 0, 9], codes[0, 0, 23], codes[0, 0, 24], codes[0, 0, 31] = 5, 3, 7, 6, 7
    words = (V.words_of(codes).to(torch.int64) & 0xFFFFFFFF).tolist()
    assert words == [[[0x80000005, 0x80000038, 0xF0000008]]]
    assert torch.equal(V.codes_of(V.words_of(codes)), codes)


def runs_matrix(counts: list[int]) -> torch.Tensor:
    # one row a count: 64 columns of 1.0-ish weights, the first `count` of them an escape (exponent
    # 100, in the table), the rest in the window; 4 rows of window weights after them keep the window
    w = torch.full((len(counts) + 4, 64), 0x3F80, dtype=torch.int32)
    w[:, 1::2] = 0x3F00  # two exponents in the window
    for r, c in enumerate(counts):
        w[r, :c] = (100 << 7) | 0x05
    return w.to(torch.int16).view(torch.bfloat16)


@pytest.mark.parametrize("count,extra", [(0, 0), (8, 0), (9, 1), (32, 24), (40, 24 + 0)])
def test_ranks_8_and_up_are_exceptions(count, extra):
    w = runs_matrix([count])
    p = dense11.pack_v2(w)
    assert torch.equal(bits(glyd.unpack(p)), bits(w))
    # a run's 9th escape and later ones are listed (40 escapes: 32 in run 0, 8 in run 1)
    assert p.arrays["exc_idx"].tolist() == list(range(8, 8 + extra))
    assert dense11.pack_v1(w).arrays["exc_idx"].numel() == 0
    assert torch.equal(bits(unpack_rows(p, torch.tensor([0]))), bits(w[:1]))


def test_exception_digit_already_15_listed_once():
    # escapes of rank >= 8 whose exponent is an exception already (not in the table) stay listed once
    e = torch.arange(40, 72, dtype=torch.int32)  # 32 distinct exponents in one run: 15 in the table at most
    w = ((e << 7) | 0x11).view(1, 32).repeat(2, 2).to(torch.int16).view(torch.bfloat16)
    p = dense11.pack_v2(w)
    idx = p.arrays["exc_idx"]
    assert torch.equal(torch.unique(idx), idx.to(torch.int64).to(idx.dtype))
    assert torch.equal(bits(glyd.unpack(p)), bits(w))


def test_from_v1_equals_pack():
    g = torch.Generator().manual_seed(7)
    pats = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    for w in [(torch.randn(19, 1100, generator=g) * torch.logspace(-5, 3, 1100)).to(torch.bfloat16),
              pats.reshape(64, 1024), pats[torch.randperm(65536, generator=g)][: 33 * 65].reshape(33, 65)]:
        p1, p2 = dense11.pack_v1(w), dense11.pack_v2(w)
        a = V.from_v1(dict(p1.arrays), p1.shape)
        assert all(torch.equal(a[n], p2.arrays[n]) for n in dense11.ARRAYS)
        assert torch.equal(bits(glyd.unpack(p2)), bits(w)) and torch.equal(bits(glyd.unpack(p1)), bits(w))
        assert torch.equal(bits(unpack_rows(p2, torch.arange(w.shape[0]))), bits(w))


# Pinned from version 2 (docs/format.md, "dense11", version 2): the 3 x 70 matrix of test_dense11.tiny().
GOLDEN_V2 = {"sm": "2f678ca0611d9fbd", "code": "b7f93e7ce66f2bad", "base": "0bfe935e70c321c7",
             "etab": "3f9032efd2b95b11", "esc": "d766cbc310b258b8", "esc_base": "c63761c39f836628",
             "esc_off": "61d876df9e256abe", "exc_idx": "33c799a856922fa7", "exc_exp": "99bd415cfc9de4c0"}
GOLDEN_V2_VALUES = {
    "base": [117], "esc": [1985229327, -16777224, 285212671], "esc_base": [0, 24], "esc_off": [0, 1, 22],
    "exc_idx": [5, 97, 98, 99, 100, 101, 103, 104, 105, 106, 107, 108, 109],
    "exc_exp": [228, 8, 9, 10, 11, 12, 14, 15, 16, 17, 18, 19, 20],
}
GOLDEN_V2_CODE_ROW1 = [-53687092, -1127428916, -17477, 2004318071, 858923554, -876889157, 4473924, 0, 0, 0, 0, 0]


def test_golden_bytes_v2():
    from .test_dense11 import digest, tiny

    p = dense11.pack_v2(tiny())
    assert p.version == 2
    assert {k: p.arrays[k].tolist() for k in GOLDEN_V2_VALUES} == GOLDEN_V2_VALUES
    assert p.arrays["code"][1].tolist() == GOLDEN_V2_CODE_ROW1
    assert digest(p) == GOLDEN_V2
    assert torch.equal(bits(glyd.unpack(p)), bits(tiny()))


def crowded() -> glyd.Packed:
    return dense11.pack_v2(runs_matrix([12, 3, 0, 32]))


def _with(p: glyd.Packed, **arrays) -> glyd.Packed:
    return glyd.Packed(p.layout, p.shape, {**p.arrays, **arrays}, p.version)


def _digit_zero(p: glyd.Packed, i: int) -> torch.Tensor:
    esc = p.arrays["esc"].clone()
    esc.view(torch.uint8)[i // 2] &= 0xF0 if i % 2 == 0 else 0x0F
    return esc


def test_rank_8_with_a_table_digit_is_corrupt():
    p = crowded()
    digits = V.stream_digits(p.arrays["esc"], 12 + 3 + 32)
    assert digits[8:12].tolist() == [15] * 4
    # rank 8's digit becomes 0 and its exception is dropped: valid for version 1, not for 2
    idx, exp = p.arrays["exc_idx"], p.arrays["exc_exp"]
    bad = _with(p, esc=_digit_zero(p, 8), exc_idx=idx[1:].clone(), exc_exp=exp[1:].clone())
    with pytest.raises(CorruptError, match="rank 8 or more"):
        glyd.unpack(bad)
    with pytest.raises(CorruptError, match="rank 8 or more"):
        unpack_rows(bad, torch.tensor([0]))
    ok_v1 = glyd.Packed("dense11", p.shape, dict(bad.arrays), 1)  # the same words read as planes: no rank rule
    with pytest.raises(CorruptError):  # (the planes differ: caught by the offsets, not the ranks)
        glyd.unpack(ok_v1)


@pytest.mark.parametrize("case", ["unsorted", "duplicate", "out_of_range", "negative", "missing"])
def test_exception_indices_hostile(case):
    p = crowded()
    idx = p.arrays["exc_idx"].clone()
    exp = p.arrays["exc_exp"]
    if case == "unsorted":
        idx[0], idx[1] = idx[1].item(), idx[0].item()
    elif case == "duplicate":
        idx[1] = idx[0]
    elif case == "out_of_range":
        idx[-1] = 10**6
    elif case == "negative":
        idx[0] = -1
    else:
        idx, exp = idx[:-1].clone(), exp[:-1].clone()
    bad = _with(p, exc_idx=idx, exc_exp=exp)
    with pytest.raises(CorruptError):
        glyd.unpack(bad)
    with pytest.raises(CorruptError):
        unpack_rows(bad, torch.tensor([0]))


def test_versions_per_layout():
    w = torch.randn(3, 70).to(torch.bfloat16)
    assert LAYOUTS["dense11"].reads == (1, 2, 3) and LAYOUTS["dense11"].writes == 3
    assert LAYOUTS["fixed12"].reads == (1,) and glyd.pack(w, "fixed12").version == 1
    p = dense11.pack_v2(w)
    for bad in (4, 0, True, "2", None.__class__):
        with pytest.raises(FormatError, match="format version") as e:
            glyd.Packed("dense11", p.shape, dict(p.arrays), bad)
        assert "\n" not in str(e.value)
    with pytest.raises(FormatError, match="'fixed12' format version 2 is not supported"):
        f = glyd.pack(w, "fixed12")
        glyd.Packed("fixed12", f.shape, dict(f.arrays), 2)
    assert glyd.Packed("dense11", p.shape, dict(p.arrays)).version == 3


def test_v2_checkpoint_round_trip_and_manifest_versions(tmp_path):
    g = torch.Generator().manual_seed(9)
    w = (torch.randn(21, 1100, generator=g) * torch.logspace(-5, 3, 1100)).to(torch.bfloat16)
    w1 = (torch.randn(5, 70, generator=g) * 0.02).to(torch.bfloat16)
    with CheckpointWriter(tmp_path / "out", layout="dense11") as ckpt:
        ckpt.add_packed("a.weight", dense11.pack_v2(w), sha256_tensor(w))
        ckpt.add_packed("old.weight", dense11.pack_v1(w1), sha256_tensor(w1))  # one model may hold both
    r = CheckpointReader(tmp_path / "out")
    assert r.verify(progress=False)["packed"] == 2
    assert r.entry("a.weight")["format_version"] == 2 and r.entry("old.weight")["format_version"] == 1
    assert r.get("a.weight").version == 2 and r.get("old.weight").version == 1
    assert torch.equal(bits(glyd.unpack(r.get("a.weight"))), bits(w))
    assert torch.equal(bits(glyd.unpack(r.get("old.weight"))), bits(w1))
    manifest = tmp_path / "out" / "glyd.json"
    m = json.loads(manifest.read_text())
    m["tensors"]["a.weight"]["format_version"] = 4
    manifest.write_text(json.dumps(m))
    with pytest.raises(FormatError, match="layout format version 4 is not supported for dense11") as e:
        CheckpointReader(tmp_path / "out")
    assert "\n" not in str(e.value)


def test_escape_masks_match_the_codes():
    g = torch.Generator().manual_seed(11)
    codes = torch.randint(0, 8, (5, 7, 32), generator=g)
    codes[0, 0] = 7
    want = ((codes == 7).to(torch.int64) << torch.arange(32)).sum(-1)
    assert torch.equal(V.escape_masks(V.words_of(codes)), want)
