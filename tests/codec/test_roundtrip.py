"""Bit-exact round trips of the CPU reference codec: exhaustive, adversarial and real-shaped."""

import pytest
import torch

import glyd
from glyd.codec import fixed12, tiered

LAYOUTS = ["fixed12", "tiered"]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def assert_roundtrip(w: torch.Tensor, layout: str) -> glyd.Packed:
    p = glyd.pack(w, layout=layout)
    out = glyd.unpack(p)
    assert out.dtype == torch.bfloat16
    assert out.shape == w.shape
    assert torch.equal(bits(out), bits(w))
    assert p.shape == tuple(w.shape) and p.layout == layout
    return p


def all_patterns() -> torch.Tensor:
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(256, 256), (1, 65536), (65536, 1), (4, 16384), (5, 13107)])
def test_every_bit_pattern(layout, shape):
    """All 65,536 patterns (+-0, subnormals, +-inf, every NaN payload) in several shapes and orders."""
    w = all_patterns()
    n = shape[0] * shape[1]
    order = torch.randperm(65536, generator=torch.Generator().manual_seed(n))[:n]
    assert_roundtrip(w[order].reshape(shape), layout)
    if n == 65536:
        assert_roundtrip(w.reshape(shape), layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_special_values_survive(layout):
    specials = torch.tensor(
        [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x7FFF, 0xFFFF, 0x0080],
        dtype=torch.int32,
    ).to(torch.int16).view(torch.bfloat16)
    p = assert_roundtrip(specials.reshape(1, -1), layout)
    out = glyd.unpack(p)
    assert torch.isnan(out).sum() == torch.isnan(specials).sum()


def normal(n, k, std=0.02, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) * std).to(torch.bfloat16)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "name,make",
    [
        ("one_exponent", lambda: torch.full((33, 70), 1.5).to(torch.bfloat16) * torch.randint(0, 2, (33, 70)).mul(2).sub(1)),
        ("all_zero", lambda: torch.zeros(17, 129, dtype=torch.bfloat16)),
        ("negative_zero", lambda: torch.full((3, 5), -0.0, dtype=torch.bfloat16)),
        ("nan_only", lambda: torch.full((9, 65), float("nan"), dtype=torch.bfloat16)),
        ("inf_only", lambda: torch.full((2, 3), float("-inf"), dtype=torch.bfloat16)),
        ("subnormals", lambda: torch.arange(1, 128, dtype=torch.int16).view(torch.bfloat16).reshape(1, 127)),
        ("huge_spread", lambda: (torch.randn(31, 97) * torch.logspace(-38, 38, 97)).to(torch.bfloat16)),
        ("one_by_one", lambda: torch.tensor([[3.0]], dtype=torch.bfloat16)),
        ("one_row", lambda: normal(1, 1000)),
        ("one_col", lambda: normal(1000, 1)),
        ("odd_shape", lambda: normal(77, 513)),
        ("k_511", lambda: normal(3, 511)),
        ("k_513", lambda: normal(3, 1025)),
        ("wide", lambda: normal(2, 9000, std=1.0)),
    ],
)
def test_adversarial(layout, name, make):
    assert_roundtrip(make(), layout)


def test_every_weight_an_exception_fixed12():
    # Exponent>>1 spread over all 128 values: at most 8/128 of the weights can sit in the window.
    hi = torch.arange(128, dtype=torch.int32).repeat_interleave(40)
    w = ((hi << 8) | 0x55).to(torch.int16).view(torch.bfloat16).reshape(64, 80)
    p = assert_roundtrip(w, "fixed12")
    assert p.arrays["exc_idx"].numel() == w.numel() - 8 * 40


def test_every_weight_escapes_to_raw_tiered():
    # 64 exponents in equal numbers: 41 of them are past the 23 table entries and go raw.
    e = torch.arange(64, dtype=torch.int32).repeat_interleave(50) * 3
    w = ((e << 7) | 0x2A).to(torch.int16).view(torch.bfloat16).reshape(50, 64)
    assert_roundtrip(w, "tiered")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_zero_sized(layout):
    for shape in [(0, 5), (5, 0), (0, 0)]:
        assert_roundtrip(torch.empty(shape, dtype=torch.bfloat16), layout)


def test_fixed12_rate():
    p = glyd.pack(normal(512, 1024), "fixed12")
    # 12 bits a weight plus exceptions (random normal weights have a few in 10^4).
    assert 12.0 <= p.bits_per_weight < 12.05


def test_tiered_rate_on_normal_weights():
    p = glyd.pack(normal(512, 1024), "tiered")
    assert p.bits_per_weight < 10.85


def test_padding_never_escapes():
    # K = 65: 63 padding weights a row must add no exception or escape.
    w = torch.full((4, 65), 1024.0, dtype=torch.bfloat16)
    assert glyd.pack(w, "fixed12").arrays["exc_idx"].numel() == 0
    assert glyd.pack(w, "tiered").arrays["area"].numel() == 0


def test_fixed12_window_choice():
    # Three weights at exponent>>1 = 60..62, one far away: the window must cover the three.
    hi = torch.tensor([60, 61, 62, 10], dtype=torch.int32)
    w = (hi << 8).to(torch.int16).view(torch.bfloat16).reshape(1, 4)
    assert fixed12.choose_base(torch.tensor([60, 61, 62, 10], dtype=torch.uint8)) == 55
    p = glyd.pack(w, "fixed12")
    assert p.arrays["exc_idx"].tolist() == [3]


def test_tiered_table_is_frequency_order():
    e = torch.tensor([120] * 5 + [121] * 9 + [119] * 2 + [118] * 7, dtype=torch.int32)
    w = (e << 7).to(torch.int16).view(torch.bfloat16).reshape(1, -1)
    p = glyd.pack(w, "tiered")
    assert p.arrays["table"][:4].tolist() == [121, 118, 120, 119]
    assert tiered.TIERS == ((2, 3), (1, 1), (1, 1), (2, 3), (4, 15))


def test_pack_rejects_bad_input():
    with pytest.raises(TypeError, match="bfloat16"):
        glyd.pack(torch.zeros(2, 2), "fixed12")
    with pytest.raises(ValueError, match="2-D"):
        glyd.pack(torch.zeros(2, 2, 2, dtype=torch.bfloat16), "fixed12")
    with pytest.raises(ValueError, match="unknown layout"):
        glyd.pack(torch.zeros(2, 2, dtype=torch.bfloat16), "int4")
    with pytest.raises(TypeError, match="torch.Tensor"):
        glyd.pack([[1.0]], "tiered")
    with pytest.raises(TypeError, match="Packed"):
        glyd.unpack(torch.zeros(2, 2))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_non_contiguous_input(layout):
    w = normal(64, 96)
    assert_roundtrip(w.t(), layout)
    assert_roundtrip(w[:, ::3], layout)
