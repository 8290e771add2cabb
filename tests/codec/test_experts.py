"""Experts packed one by one (glyd.codec.experts): bit for bit, each expert its own packed matrix,
and every malformed set of arrays refused with an error that names it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import glyd
from glyd.codec import LAYOUTS, PackedExperts, pack_experts, unpack_experts
from glyd.codec.experts import LENS, array_names, stack
from glyd.errors import CorruptError, FormatError


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def experts(e: int, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Normal weights (std 0.02) with exceptions, each expert its own scale (its own window)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(e, n, k, generator=g) * 0.02 * torch.exp2(torch.arange(e, dtype=torch.float32) * 3)[:, None, None]
    flat = w.view(-1)
    flat[torch.randint(0, flat.numel(), (max(1, flat.numel() // 300),), generator=g)] = 1e-30
    return w.to(torch.bfloat16)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("shape", [(1, 5, 7), (3, 10, 70), (4, 33, 130)])
def test_pack_unpack_bit_for_bit_each_expert_its_own_matrix(layout, shape):
    w = experts(*shape)
    p = pack_experts(w, layout)
    assert p.shape == shape and p.layout == layout and set(p.arrays) == set(array_names(layout))
    assert torch.equal(bits(unpack_experts(p)), bits(w))
    for e in range(shape[0]):
        alone = glyd.pack(w[e], layout)  # the expert packed on its own: the same arrays
        got = p.expert(e)
        for a in LAYOUTS[layout].ARRAYS:
            assert torch.equal(got.arrays[a], alone.arrays[a]), (e, a)
    assert torch.equal(bits(unpack_experts(p, [2 % shape[0], 0])), bits(w[[2 % shape[0], 0]]))


def test_each_expert_gets_its_own_window():
    w = experts(3, 16, 64)  # scales 1, 8, 64: three windows
    p = pack_experts(w, "fixed12")
    assert len(set(p.arrays["base"].tolist())) == 3
    assert p.arrays["lo"].shape == (3 * 16, 64) and p.arrays["base"].shape == (3,)


def test_every_bit_pattern_comes_back():
    w = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(4, 128, 128)
    for layout in sorted(LAYOUTS):
        assert torch.equal(bits(unpack_experts(pack_experts(w, layout))), bits(w)), layout


def test_lens_say_where_each_expert_is():
    w = experts(3, 8, 64)
    p = pack_experts(w, "fixed12")
    names = LAYOUTS["fixed12"].ARRAYS
    lens = p.arrays[LENS]
    assert lens.dtype == torch.int64 and lens.shape == (3, len(names))
    assert lens[:, names.index("lo")].tolist() == [8, 8, 8]
    exc = [glyd.pack(w[e]).arrays["exc_idx"].numel() for e in range(3)]
    assert lens[:, names.index("exc_idx")].tolist() == exc and sum(exc) > 0


def _arrays(p: PackedExperts) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in p.arrays.items()}


def test_malformed_arrays_are_refused_naming_what():
    p = pack_experts(experts(3, 8, 64), "fixed12")
    a = _arrays(p)
    a[LENS][0, 0] += 1  # lo: one row more than it has
    with pytest.raises(FormatError, match=r"lens gives 25 entries of array 'lo'"):
        PackedExperts("fixed12", p.shape, a)
    a = _arrays(p)
    a[LENS][0, 3] = -1
    with pytest.raises(CorruptError, match="negative"):
        PackedExperts("fixed12", p.shape, a)
    a = _arrays(p)
    a[LENS][0, 0], a[LENS][1, 0] = 7, 9  # the sum fits, expert 0's 'lo' does not
    with pytest.raises(FormatError, match=r"expert 0: packed array 'lo' has shape \(7, 64\)"):
        PackedExperts("fixed12", p.shape, a)
    a = _arrays(p)
    del a[LENS]
    with pytest.raises(FormatError, match="'lens' is missing"):
        PackedExperts("fixed12", p.shape, a)
    a = _arrays(p)
    a[LENS] = a[LENS].to(torch.int32)
    with pytest.raises(FormatError, match="'lens' has dtype torch.int32"):
        PackedExperts("fixed12", p.shape, a)
    with pytest.raises(FormatError, match="unexpected arrays.*'fixed12': sm"):
        PackedExperts("fixed12", p.shape, {**_arrays(p), "sm": torch.zeros(1, dtype=torch.uint8)})
    with pytest.raises(FormatError, match="three non-negative ints"):
        PackedExperts("fixed12", (3, 8), _arrays(p))
    with pytest.raises(FormatError, match=r"'lens' has shape \(3, 5\), expected \(2, 5\)"):
        PackedExperts("fixed12", (2, 8, 64), _arrays(p))
    with pytest.raises(FormatError, match="unknown layout"):
        PackedExperts("fixed13", p.shape, _arrays(p))


def test_meta_arrays_are_checked_for_names_lens_and_the_padded_plane():
    p = pack_experts(experts(2, 8, 64), "tiered")
    meta = {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in p.arrays.items()}
    PackedExperts("tiered", p.shape, meta)  # no values to check
    PackedExperts("tiered", (2, 8, 40), meta)  # a width within the same 64-column padding: only values tell
    # the plane (a row a matrix row, K padded) gives the rows and the padded width without any value
    for shape in [(2, 7, 64), (2, 8, 65), (2, 16, 64), (1, 16, 64)]:
        with pytest.raises(FormatError, match=r"packed array '(sm|lens)' has shape \(\d+, \d+\), expected"):
            PackedExperts("tiered", shape, meta)
    del meta["area"]
    with pytest.raises(FormatError, match="'area' is missing"):
        PackedExperts("tiered", p.shape, meta)


def test_stack_and_pack_refuse_what_they_cannot_join():
    a, b = glyd.pack(experts(1, 8, 64)[0]), glyd.pack(experts(1, 8, 32)[0])
    with pytest.raises(ValueError, match="one layout and shape for every expert"):
        stack([a, b])
    with pytest.raises(ValueError, match="at least one"):
        stack([])
    with pytest.raises(TypeError, match="bfloat16"):
        pack_experts(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="3-D"):
        pack_experts(torch.zeros(3, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="unknown layout"):
        pack_experts(torch.zeros(1, 3, 4, dtype=torch.bfloat16), "fixed13")
    with pytest.raises(IndexError, match="expert 3 is out of range"):
        pack_experts(torch.zeros(3, 4, 4, dtype=torch.bfloat16)).expert(3)


def test_empty_matrices():
    w = torch.zeros(2, 0, 5, dtype=torch.bfloat16)
    p = pack_experts(w, "fixed12")
    assert unpack_experts(p).shape == (2, 0, 5)


def test_an_expert_number_that_is_not_an_int_is_refused():
    # unpack_experts(p, [1.7]) returned expert 1 (int() truncated it): a wrong expert, silently
    p = pack_experts(experts(3, 8, 64), "fixed12")
    for bad in (1.7, 1.0, True, "1"):
        with pytest.raises(TypeError, match=f"expert {bad!r} is not an int"):
            unpack_experts(p, [bad])
        with pytest.raises(TypeError, match=f"expert {bad!r} is not an int"):
            p.expert(bad)
    assert torch.equal(unpack_experts(p, [np.int64(2), torch.tensor(1)]).view(torch.int16),
                       unpack_experts(p, [2, 1]).view(torch.int16))


def test_lens_that_overflow_int64_are_refused():
    # lengths of 2^62 each summed (int64) to the array's true length: every expert's exceptions were
    # given to expert 0 (Python slices of the wrapped offsets) and unpack returned other bits silently
    w = experts(4, 8, 64)
    for e in range(4):
        w[e, e, 3] = 3.0 * (e + 1)  # an exception in every expert
    p = pack_experts(w, "fixed12")
    names = array_names("fixed12")
    arrays = _arrays(p)
    n = arrays["exc_idx"].shape[0]
    for a in ("exc_idx", "exc_hi"):
        arrays[LENS][:, names.index(a)] = torch.tensor([2**62, 2**62, 2**62, 2**62 + n])
    with pytest.raises(CorruptError, match=rf"lens gives expert 0 {2**62} entries of array 'exc_idx', which has {n}"):
        PackedExperts("fixed12", p.shape, arrays)
