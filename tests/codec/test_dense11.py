"""The dense11 layout: every bf16 pattern, odd shapes, adversarial matrices, golden bytes, and hostile
array sets (every one raises FormatError or CorruptError, never reads out of bounds). ``glyd.pack``
writes format version 3; every round trip here checks version 1 (``dense11.pack_v1``) too, and
version 2's own cases are in ``test_dense11_v2.py``."""

import hashlib

import numpy as np
import pytest
import torch

import glyd
from glyd.codec import dense11
from glyd.errors import CorruptError, FormatError


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def roundtrip(w: torch.Tensor) -> glyd.Packed:
    p = glyd.pack(w, "dense11")
    assert p.layout == "dense11" and p.shape == tuple(w.shape) and p.version == 3
    assert torch.equal(bits(glyd.unpack(p)), bits(w))
    p1 = dense11.pack_v1(w)
    assert p1.version == 1 and torch.equal(bits(glyd.unpack(p1)), bits(w))
    return p


def patterns() -> torch.Tensor:
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


@pytest.mark.parametrize("shape", [(256, 256), (1, 65536), (65536, 1), (128, 512), (32, 2048)])
def test_all_65536_patterns(shape):
    roundtrip(patterns().reshape(shape))


def test_all_patterns_shuffled_in_odd_shape():
    g = torch.Generator().manual_seed(1)
    w = patterns()[torch.randperm(65536, generator=g)][: 97 * 675].reshape(97, 675)
    roundtrip(w)


@pytest.mark.parametrize("shape", [(1, 1), (3, 70), (5, 1030), (2, 2049), (17, 63), (1, 64), (40, 1088), (0, 5), (5, 0)])
def test_odd_shapes(shape):
    g = torch.Generator().manual_seed(sum(shape))
    roundtrip((torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16))


def test_every_exponent_different():
    # 256 rows, one exponent each: 7 in the window, 15 in the table, the rest exceptions.
    g = torch.Generator().manual_seed(2)
    e = torch.arange(256, dtype=torch.int32)[:, None].expand(256, 96)
    sm = torch.randint(0, 256, (256, 96), generator=g, dtype=torch.int32)
    w = (((sm & 0x80) << 8) | (e << 7) | (sm & 0x7F)).to(torch.int16).view(torch.bfloat16)
    p = roundtrip(w)
    assert dense11.pack_v1(w).arrays["exc_idx"].numel() == (256 - 7 - 15) * 96
    # version 2: the 15 table rows' escapes of rank 8 and up in each 32-weight run (24 a run, 3 runs)
    assert p.arrays["exc_idx"].numel() == (256 - 7 - 15) * 96 + 15 * 3 * 24


def test_all_escapes_and_all_exceptions():
    # A weight per exponent in each row: almost every weight escapes, most go to the list.
    e = torch.arange(256, dtype=torch.int32).repeat(9, 1)
    w = ((e << 7) | 0x55).to(torch.int16).view(torch.bfloat16)
    p = roundtrip(w)
    assert p.arrays["esc"].numel() == -(-9 * (256 - 7) // 8)
    assert dense11.pack_v1(w).arrays["exc_idx"].numel() == 9 * (256 - 7 - 15)
    assert p.arrays["exc_idx"].numel() > 9 * (256 - 7 - 15)


def test_specials():
    vals = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-40, -1e-39, 3e38, 1.0]
    w = torch.tensor(vals * 50, dtype=torch.float32).to(torch.bfloat16).reshape(9, 50)
    b = bits(w)
    b[0, 0] = 0x7FC1  # a NaN payload
    b[1, 1] = -0x0001  # -NaN with every payload bit set
    b[2, 2] = 0x0001  # the smallest subnormal
    roundtrip(w)
    roundtrip(torch.full((4, 100), float("nan")).to(torch.bfloat16))
    roundtrip(torch.zeros(3, 3, dtype=torch.bfloat16))


def test_one_exponent_only_has_no_escapes():
    w = torch.full((8, 130), 0.75).to(torch.bfloat16)
    p = roundtrip(w)
    assert p.arrays["esc"].numel() == 0 and p.arrays["exc_idx"].numel() == 0


def test_many_blocks_and_superblocks():
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(40, 2200, generator=g) * torch.logspace(-4, 2, 2200)).to(torch.bfloat16)
    p = roundtrip(w)
    assert dense11.num_blocks(40, 2200) == 120 and p.arrays["esc_base"].numel() == 9


def test_rate_on_normal_weights():
    w = (torch.randn(512, 1024, generator=torch.Generator().manual_seed(4)) * 0.02).to(torch.bfloat16)
    p = roundtrip(w)
    assert 11.05 < p.bits_per_weight < 11.2


def test_planes_layout():
    # Word 3w + p of a row holds bit p of the codes of weights 32w .. 32w + 31 (bit j: weight 32w + j).
    codes = np.zeros((1, 64), dtype=np.uint8)
    codes[0, 0], codes[0, 33], codes[0, 63] = 5, 6, 7
    planes = dense11.planes_of(codes).view(np.uint32)
    assert planes.tolist() == [[1, 0, 1, 1 << 31, (1 << 31) | 2, (1 << 31) | 2]]
    assert np.array_equal(dense11.codes_of(planes.view(np.int32), 1, 64), codes)


def tiny() -> torch.Tensor:
    # 3x70: normal-ish values, a far exponent, a NaN, -0, an inf, and 20 distinct small exponents
    # in row 1 (more than the 15-entry escape table holds: some are exceptions).
    v = torch.linspace(-0.08, 0.08, 210).reshape(3, 70).to(torch.bfloat16)
    b = v.view(torch.int16)
    b[0, 5] = 0x7240
    b[1, 7] = 0x7FC1
    b[2, 69] = -0x8000
    b[2, 0] = 0x7F80
    b[1, 20:40] = (torch.arange(1, 21, dtype=torch.int16) << 7) | 0x11
    return v


def digest(p: glyd.Packed) -> dict:
    return {k: hashlib.sha256(v.numpy().tobytes()).hexdigest()[:16] for k, v in p.arrays.items()}


# Pinned from version 1 (docs/format.md, "dense11", version 1); a change here is a format change.
GOLDEN_SHAPES = {
    "sm": ("torch.uint8", (3, 128)), "code": ("torch.int32", (3, 12)), "base": ("torch.uint8", (1,)),
    "etab": ("torch.uint8", (15,)), "esc": ("torch.int32", (3,)),
    "esc_base": ("torch.int32", (2,)), "esc_off": ("torch.uint16", (3,)),
    "exc_idx": ("torch.int32", (8,)), "exc_exp": ("torch.uint8", (8,)),
}
GOLDEN = {"sm": "2f678ca0611d9fbd", "code": "f0de8a357a55d0a4", "base": "0bfe935e70c321c7", "etab": "3f9032efd2b95b11",
          "esc": "d417810236b3348f", "esc_base": "c63761c39f836628", "esc_off": "61d876df9e256abe",
          "exc_idx": "b752d221a027a103", "exc_exp": "ce6667691e008890"}
GOLDEN_VALUES = {
    "base": [117], "etab": [255, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
    "esc": [1985229327, -19088744, 285212671], "esc_base": [0, 24], "esc_off": [0, 1, 22],
    "exc_idx": [5, 103, 104, 105, 106, 107, 108, 109], "exc_exp": [228, 14, 15, 16, 17, 18, 19, 20],
}
GOLDEN_CODE_ROW0 = [-16777184, 16777215, -1, -1, 0, -1, 0, 0, 63, 0, 0, 0]
GOLDEN_SM_ROW0 = [164, 162, 161, 159, 158, 64, 154, 153]


def test_golden_bytes():
    p = dense11.pack_v1(tiny())
    assert p.version == 1
    assert {k: (str(v.dtype), tuple(v.shape)) for k, v in p.arrays.items()} == GOLDEN_SHAPES
    assert {k: p.arrays[k].tolist() for k in GOLDEN_VALUES} == GOLDEN_VALUES
    assert p.arrays["code"][0].tolist() == GOLDEN_CODE_ROW0 and p.arrays["sm"][0, :8].tolist() == GOLDEN_SM_ROW0
    assert digest(p) == GOLDEN
    assert torch.equal(bits(glyd.unpack(p)), bits(tiny()))


@pytest.fixture(params=[1, 2, 3], ids=["v1", "v2", "v3"])
def version(request):
    return request.param


def noisy(version: int = 2) -> glyd.Packed:
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(6, 1100, generator=g) * torch.logspace(-5, 3, 1100)).to(torch.bfloat16)
    p = {1: dense11.pack_v1, 2: dense11.pack_v2, 3: dense11.pack_v3}[version](w)
    assert p.arrays["esc"].numel() > 2 and p.arrays["exc_idx"].numel() > 2
    return p


def replace(p: glyd.Packed, **arrays) -> glyd.Packed:
    new = dict(p.arrays)
    for k, v in arrays.items():
        if v is None:
            del new[k]
        else:
            new[k] = v
    return glyd.Packed(p.layout, p.shape, new, p.version)


@pytest.mark.parametrize("change,match", [
    (dict(sm=None), "'sm' is missing"),
    (dict(code=torch.zeros(6, 3 * 35, dtype=torch.uint8)), "'code' has dtype"),
    (dict(code=torch.zeros(6, 3 * 34, dtype=torch.int32)), "'code' has shape"),
    (dict(etab=torch.zeros(16, dtype=torch.uint8)), "'etab' has shape"),
    (dict(esc=torch.zeros(2, 2, dtype=torch.int32)), "'esc' must be 1-D"),
    (dict(esc_off=torch.zeros(11, dtype=torch.uint16)), "'esc_off' has shape"),
    (dict(exc_exp=torch.zeros(1, dtype=torch.uint8)), "one length"),
    (dict(extra=torch.zeros(1)), "unexpected arrays"),
])
def test_rejects_bad_arrays(change, match, version):
    with pytest.raises(FormatError, match=match):
        replace(noisy(version), **change)


def _clone_with(p, name, edit):
    a = p.arrays[name].clone()
    edit(a)
    return replace(p, **{name: a})


@pytest.mark.parametrize("case", [
    "base", "esc_short", "esc_long", "esc_off", "esc_base_first", "esc_base_last", "code_more_escapes",
    "code_fewer_escapes", "pad_escape", "exc_missing", "exc_moved", "exc_range", "digit_not_raw",
])
def test_corrupt_values(case, version):
    p = noisy(version)
    a = p.arrays
    if case == "base":
        bad = replace(p, base=torch.tensor([250], dtype=torch.uint8))
    elif case == "esc_short":
        bad = replace(p, esc=a["esc"][:-1].clone())
    elif case == "esc_long":
        bad = replace(p, esc=torch.cat([a["esc"], a["esc"][:1]]))
    elif case == "esc_off":
        bad = _clone_with(p, "esc_off", lambda t: t.__setitem__(1, 0))
    elif case == "esc_base_first":
        bad = _clone_with(p, "esc_base", lambda t: t.__setitem__(0, 1))
    elif case == "esc_base_last":
        bad = _clone_with(p, "esc_base", lambda t: t.__setitem__(-1, t[-1] + 8))
    elif case == "code_more_escapes":  # every code of row 5 becomes 7: offsets and stream too short
        bad = _clone_with(p, "code", lambda t: t[5].fill_(-1))
    elif case == "code_fewer_escapes":
        bad = _clone_with(p, "code", lambda t: t[0].fill_(0))
    elif case == "pad_escape":  # K = 1100, Kp = 1152: code words of runs 34, 35 of a row hold padding
        bad = _clone_with(p, "code", lambda t: t[2, 3 * 35:].fill_(-1))
    elif case == "exc_missing":
        bad = replace(p, exc_idx=a["exc_idx"][1:].clone(), exc_exp=a["exc_exp"][1:].clone())
    elif case == "exc_moved":
        bad = _clone_with(p, "exc_idx", lambda t: t.__setitem__(0, t[0] + 1))
    elif case == "exc_range":
        bad = _clone_with(p, "exc_idx", lambda t: t.__setitem__(-1, 10**8))
    else:  # the first digit-15 escape's digit becomes 0: the list no longer matches the stream
        words = a["esc"].numpy().view(np.uint32)
        digits = (words[:, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15
        i = int(np.flatnonzero(digits.reshape(-1) == 15)[0])
        esc = a["esc"].clone()
        esc.view(torch.uint8)[i // 2] &= 0xF0 if i % 2 == 0 else 0x0F
        bad = replace(p, esc=esc)
    with pytest.raises(CorruptError):
        glyd.unpack(bad)


def test_padding_must_be_zero(version):
    # the format's padding is code 0 and sm 0; a nonzero padding code decoded nothing the codec returns,
    # but the kernels multiply the padding by x's masked zeros: at base 249 code 6 is exponent 255, and
    # 0 * inf made every product of the row NaN. sm padding: refused too (what the format says)
    from glyd.codec import dense11_v2
    from glyd.ops.rows import unpack_rows

    p = noisy(version)  # K = 1100, Kp = 1152
    n, kp = p.arrays["sm"].shape
    codes = dense11.codes_of_packed(p)
    codes[2, 1100] = 6
    if version == 1:
        code = torch.from_numpy(dense11.planes_of(codes))
    else:
        code = dense11_v2.words_of(torch.from_numpy(codes).view(n, kp // 32, 32)).view(n, -1)
    for bad in (replace(p, code=code), _clone_with(p, "sm", lambda t: t[2, 1151:].fill_(1))):
        with pytest.raises(CorruptError, match="padding"):
            glyd.unpack(bad)
        with pytest.raises(CorruptError, match="padding"):
            unpack_rows(bad, torch.tensor([0]))


def test_exception_list_is_checked(version):
    p = noisy(version)
    idx = p.arrays["exc_idx"].clone()
    idx[0], idx[1] = idx[1], idx[0]
    with pytest.raises(CorruptError, match="exc_idx"):
        glyd.unpack(replace(p, exc_idx=idx))


@pytest.mark.parametrize("bit", ["first", "last"])
def test_unused_bits_of_the_last_escape_word_must_be_zero(version, bit):
    # the stream's last word holds total % 8 digits; the codec writes 0 after them and no decoder reads them,
    # so a file that sets them decoded as if they were 0: refused as damaged, as the padding columns are
    from glyd.ops.rows import unpack_rows

    p = noisy(version)
    total = int((dense11.codes_of_packed(dense11.as_v2(p)) == dense11.ESCAPE).sum())
    used = total % 8
    assert used and p.arrays["esc"].numel() == (total + 7) // 8  # the matrix has unused bits to set
    word = int(p.arrays["esc"][-1]) & 0xFFFFFFFF
    assert word >> (4 * used) == 0  # what the codec wrote
    flip = 4 * used if bit == "first" else 31
    new = np.int64(word | 1 << flip).astype(np.uint32).view(np.int32)
    bad = _clone_with(p, "esc", lambda t: t.__setitem__(-1, int(new)))
    last = p.arrays["esc"].numel() - 1
    why = rf"dense11 'esc' word {last} \(the stream's last\) has unused bits {4 * used}\.\.31 set"
    with pytest.raises(CorruptError, match=why):
        glyd.unpack(bad)
    with pytest.raises(CorruptError, match=why):
        unpack_rows(bad, torch.tensor([0]))
    assert torch.equal(bits(glyd.unpack(p)), bits(unpack_rows(p, torch.arange(p.shape[0]))))  # the clean one reads
