"""Chunk-level float coding (glyd.filecodec.floats): bit-exact round trips for every dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glyd.errors import CorruptError, FormatError
from glyd.filecodec import floats as F

TORCH = {F.BF16: torch.bfloat16, F.F16: torch.float16, F.F32: torch.float32, F.F8_E4M3: torch.float8_e4m3fn, F.F8_E5M2: torch.float8_e5m2}


def to_bytes(t: torch.Tensor) -> bytes:
    if t.numel() == 0:
        return b""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def roundtrip(kind: int, data: bytes, rows: int, cols: int) -> bytes:
    p = F.encode(kind, data, rows, cols)
    out = F.decode(p, len(data))
    assert out.dtype == np.uint8 and out.size == len(data)
    assert out.tobytes() == data
    return p


def header(p: bytes) -> tuple[int, int, int, int, int, int]:
    return F._HEADER.unpack_from(p, 0)


def normal(kind: int, rows: int, cols: int, seed: int = 0, std: float = 0.02) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=g) * std).to(TORCH[kind])


@pytest.mark.parametrize("kind", list(TORCH))
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (3, 5), (64, 96), (257, 129), (300, 512)])
def test_roundtrip_normal(kind, shape):
    t = normal(kind, *shape)
    roundtrip(kind, to_bytes(t), *shape)


@pytest.mark.parametrize("kind", list(TORCH))
def test_empty_chunk(kind):
    roundtrip(kind, b"", 0, 5)


def test_every_bf16_and_fp16_pattern():
    pats = np.arange(65536, dtype=np.uint16).astype("<u2").tobytes()
    for kind in (F.BF16, F.F16):
        p = roundtrip(kind, pats, 256, 256)
        if kind == F.BF16:  # every exponent occurs: the exponent byte is the symbol
            assert header(p)[3] == F.SYM_EXP
    # shuffled, so that classes see a mixture
    rng = np.random.default_rng(1)
    roundtrip(F.BF16, rng.permutation(np.arange(65536, dtype=np.uint16)).astype("<u2").tobytes(), 512, 128)


def test_every_fp8_pattern():
    pats = np.arange(256, dtype=np.uint8).tobytes() * 300
    for kind in (F.F8_E4M3, F.F8_E5M2):
        roundtrip(kind, pats, 300, 256)


def test_fp32_random_bits_and_bf16_upcast():
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 2**32, 200 * 300, dtype=np.uint64).astype("<u4").tobytes()
    roundtrip(F.F32, bits, 200, 300)
    # fp32 that was upcast from bf16: the low halves are zero and must cost almost nothing
    t = normal(F.BF16, 256, 256).to(torch.float32)
    p = roundtrip(F.F32, to_bytes(t), 256, 256)
    assert len(p) * 8 / t.numel() < 11.0


def test_exponent_window_with_zeros_and_subnormals():
    t = normal(F.BF16, 128, 128)
    t[::7, ::3] = 0
    t[5, 5] = -0.0
    p = roundtrip(F.BF16, to_bytes(t), 128, 128)
    assert header(p)[3] == F.SYM_WINDOW and p[F._HEADER.size + 3] == 1  # has_zero flag
    sub = torch.tensor([0.0, 1e-40, -1e-40, 3e-39, 1e-38], dtype=torch.float32).repeat(64, 20).to(torch.bfloat16)
    p = roundtrip(F.BF16, to_bytes(sub), 64, 100)
    assert header(p)[3] == F.SYM_WINDOW and p[F._HEADER.size + 2] == 1  # base exponent 1
    zeros = torch.zeros(33, 17, dtype=torch.bfloat16)
    roundtrip(F.BF16, to_bytes(zeros), 33, 17)


def test_exponent_table_mode():
    # a few exponents spread wider than the 63-exponent window
    vals = torch.tensor([2.0**-100, -(2.0**-90), 1.0, -3.0, 2.0**20, 0.0], dtype=torch.float32)
    t = vals[torch.randint(0, 6, (100, 200), generator=torch.Generator().manual_seed(3))].to(torch.bfloat16)
    p = roundtrip(F.BF16, to_bytes(t), 100, 200)
    assert header(p)[3] == F.SYM_TABLE


def test_nan_inf_payloads():
    bits = np.array([0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x7FFF, 0x0001, 0x8001], np.uint16)
    data = np.tile(bits, 1000).astype("<u2").tobytes()
    roundtrip(F.BF16, data, 100, 80)
    roundtrip(F.F16, data, 100, 80)


def test_row_and_column_classes_are_used_and_exact():
    g = torch.Generator().manual_seed(4)
    row_scale = torch.logspace(-4, 0, 1024)[torch.randperm(1024, generator=g)][:, None]
    t = (torch.randn(1024, 256, generator=g) * row_scale).to(torch.bfloat16)
    p = roundtrip(F.BF16, to_bytes(t), 1024, 256)
    assert header(p)[1] == F.MODE_ROWS
    col_scale = torch.logspace(-4, 0, 384)[torch.randperm(384, generator=g)][None, :]
    t = (torch.randn(700, 384, generator=g) * col_scale).to(torch.bfloat16)
    p = roundtrip(F.BF16, to_bytes(t), 700, 384)
    assert header(p)[1] == F.MODE_COLS
    roundtrip(F.F16, to_bytes(t.to(torch.float16)), 700, 384)
    roundtrip(F.F8_E4M3, to_bytes(t.float().to(torch.float8_e4m3fn)), 700, 384)


def test_pack6_roundtrip():
    rng = np.random.default_rng(5)
    for n in (0, 1, 3, 4, 5, F.BLOCK - 1, F.BLOCK, F.BLOCK + 3, 3 * F.BLOCK + 7):
        v = rng.integers(0, 64, n, dtype=np.uint8)
        p = F.pack6(v)
        assert p.size == F.packed6_len(n) == (n // F.BLOCK) * F.BLOCK * 3 // 4 + -(-(n % F.BLOCK) // 4) * 3
        assert np.array_equal(F.unpack6(p, n), v)


def test_sizes_on_gaussian_weights():
    # a check of the coder itself: N(0, 0.02) bf16 has ~10.6 bits of entropy a weight
    t = normal(F.BF16, 1024, 1024, seed=6)
    p = roundtrip(F.BF16, to_bytes(t), 1024, 1024)
    assert 10.0 < len(p) * 8 / t.numel() < 10.9
    t8 = t.float().to(torch.float8_e4m3fn)
    p8 = roundtrip(F.F8_E4M3, to_bytes(t8), 1024, 1024)
    assert len(p8) < 0.85 * t8.numel()


def test_bad_input_and_corrupt_payloads():
    with pytest.raises(FormatError):
        F.encode(F.BF16, b"\0" * 10, 2, 3)
    t = normal(F.BF16, 64, 64)
    data = to_bytes(t)
    p = F.encode(F.BF16, data, 64, 64)
    with pytest.raises(CorruptError):
        F.decode(p, len(data) + 2)
    with pytest.raises(CorruptError):
        F.decode(p[:-1], len(data))
    with pytest.raises(CorruptError):
        F.decode(p + b"\0", len(data))
    with pytest.raises(CorruptError):
        F.decode(p[:5], len(data))
    bad = bytearray(p)
    bad[0] = 99  # unknown dtype
    with pytest.raises(CorruptError):
        F.decode(bytes(bad), len(data))


@st.composite
def float_chunks(draw, max_rows=70, max_cols=90):
    kind = draw(st.sampled_from(list(TORCH)))
    rows = draw(st.integers(0, max_rows))
    cols = draw(st.integers(1, max_cols))
    seed = draw(st.integers(0, 2**31 - 1))
    style = draw(st.sampled_from(["normal", "bits", "scaled_rows", "scaled_cols", "specials"]))
    rng = np.random.default_rng(seed)
    item = F.ITEMSIZE[kind]
    if style == "bits":
        data = rng.integers(0, 256, rows * cols * item, dtype=np.uint8).tobytes()
        return kind, data, rows, cols
    x = rng.normal(0, 10.0 ** rng.uniform(-6, 1), (rows, cols))
    if style == "scaled_rows":
        x *= 10.0 ** rng.uniform(-5, 0, (rows, 1))
    elif style == "scaled_cols":
        x *= 10.0 ** rng.uniform(-5, 0, (1, cols))
    elif style == "specials" and x.size:
        idx = rng.integers(0, x.size, max(1, x.size // 5))
        x.flat[idx] = rng.choice([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-42, 6e4, -1e30], idx.size)
    t = torch.from_numpy(x).to(torch.float32).to(TORCH[kind])
    return kind, to_bytes(t), rows, cols


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(float_chunks())
def test_property_roundtrip(chunk):
    kind, data, rows, cols = chunk
    roundtrip(kind, data, rows, cols)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(float_chunks(max_rows=700, max_cols=400))
def test_property_roundtrip_large(chunk):
    # big enough for the row / column class modes (>= MIN_CLASS_ELEMS elements)
    kind, data, rows, cols = chunk
    roundtrip(kind, data, rows, cols)
