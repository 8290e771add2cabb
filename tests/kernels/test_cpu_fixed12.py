"""glyd's fixed12 CPU kernels (C): unpack and row lookups bit for bit, the product against float64,
hostile arrays refused, both instruction paths (AVX2 and the portable loops)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import glyd
from glyd.codec import Packed
from glyd.errors import CorruptError

from .conftest import random_weights

SIMD = ["native", "portable"]


@pytest.fixture(params=SIMD)
def kernels(request, cpu_kernels):
    """The kernels on the CPU's own instruction set, then again on the portable loops."""
    ext = cpu_kernels._ext()
    ext.set_portable(request.param == "portable")
    yield cpu_kernels
    ext.set_portable(False)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def _all_patterns(n: int, k: int) -> torch.Tensor:
    """All 65,536 bf16 patterns (+-0, subnormals, +-inf, every NaN payload) in random order, repeated to n x k."""
    bits = torch.arange(65536, dtype=torch.int32)[torch.randperm(65536, generator=torch.Generator().manual_seed(3))]
    return bits.repeat((n * k) // 65536 + 1)[: n * k].to(torch.int16).view(torch.bfloat16).reshape(n, k)


@pytest.mark.parametrize("shape", [(256, 256), (1000, 70), (3, 1), (1, 129), (0, 64), (5, 0)])
def test_unpack_gives_back_every_bit_pattern(kernels, shape):
    w = _all_patterns(*shape)
    p = glyd.pack(w, "fixed12")
    assert _same_bits(kernels.unpack(p), w)
    n = shape[0]
    if n >= 3:  # a row range, into a buffer larger than needed
        buf = torch.empty(n * shape[1] + 5, dtype=torch.bfloat16)
        got = kernels.unpack(p, 1, n - 1, buf)
        assert _same_bits(got.reshape(-1)[: (n - 2) * shape[1]].reshape(n - 2, shape[1]), w[1 : n - 1])


def test_unpack_checks_its_arguments(kernels):
    p = glyd.pack(random_weights(8, 64, "normal"), "fixed12")
    with pytest.raises(ValueError, match="rows 3..9"):
        kernels.unpack(p, 3, 9)
    with pytest.raises(ValueError, match="out must be"):
        kernels.unpack(p, out=torch.empty(8, 63, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out must be"):
        kernels.unpack(p, out=torch.empty(8, 64, dtype=torch.float32))


def test_rows_are_the_matrix_rows(kernels):
    w = random_weights(300, 70, "wide")
    w[7, 3] = float("nan")
    p = glyd.pack(w, "fixed12")
    assert p.arrays["exc_idx"].numel() > 100
    idx = torch.tensor([[0, 299, -1], [7, 7, -300]])
    assert _same_bits(kernels.rows(p, idx), w[idx])
    for bad in (300, -301):
        with pytest.raises(IndexError, match=f"row index {bad} is out of range for a matrix of 300 rows"):
            kernels.rows(p, torch.tensor([1, bad]))
    with pytest.raises(IndexError, match="integers"):
        kernels.rows(p, torch.tensor([1.0]))


def _check_linear(kernels, w: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> None:
    y = kernels.linear(x, glyd.pack(w, "fixed12"), bias)
    ref = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    assert y.dtype == x.dtype and y.shape == ref.shape
    err = ((y.double() - ref).norm() / ref.norm()).item()
    assert err < (8e-3 if x.dtype == torch.bfloat16 else 1e-5), err


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 3, "most", "blocks"])
@pytest.mark.parametrize("shape", [(40, 64), (33, 100), (300, 1000), (7, 5)])
def test_linear_matches_float64(kernels, dtype, rows, shape):
    n, k = shape
    m = {"most": kernels.MAX_FUSED_ROWS, "blocks": kernels.MAX_FUSED_ROWS + 2}.get(rows, rows)
    torch.manual_seed(n * k + m)
    for kind in ("normal", "wide"):  # "wide": many exceptions, corrected after the sums
        w = random_weights(n, k, kind)
        x = torch.randn(2, m, k).to(dtype)
        _check_linear(kernels, w, x, torch.randn(n).to(dtype) if kind == "wide" else None)


def test_linear_blocks_of_rows(kernels, monkeypatch):
    # a prompt's product: row blocks unpacked into one buffer, each through F.linear
    monkeypatch.setattr(kernels, "CHUNK_WEIGHTS", 3 * 100)
    w = random_weights(31, 100, "wide")
    x = torch.randn(kernels.MAX_FUSED_ROWS + 1, 100).to(torch.bfloat16)
    b = torch.randn(31).to(torch.bfloat16)
    got = kernels.linear(x, glyd.pack(w, "fixed12"), b)
    assert _same_bits(got[:, :3], F.linear(x, w[:3], b[:3]))  # one block is bf16's F.linear on those rows
    _check_linear(kernels, w, x, b)


def test_linear_with_infinite_and_nan_weights(kernels):
    w = random_weights(6, 128, "normal")
    w[1, 5], w[2, 7], w[3, 9] = float("inf"), float("nan"), -float("inf")
    x = torch.rand(1, 128).add(0.5).to(torch.bfloat16)  # positive: row 1 is +inf, row 3 -inf
    y = kernels.linear(x, glyd.pack(w, "fixed12"))[0].float()
    assert y[1] == float("inf") and torch.isnan(y[2]) and y[3] == -float("inf")
    assert torch.isfinite(y[[0, 4, 5]]).all()


def test_linear_checks_its_arguments(kernels):
    p = glyd.pack(random_weights(8, 64, "normal"), "fixed12")
    with pytest.raises(ValueError, match="last dimension must be 64"):
        kernels.linear(torch.randn(2, 63), p)
    with pytest.raises(TypeError, match="bf16 or fp32"):
        kernels.linear(torch.randn(2, 64, dtype=torch.float64), p)
    with pytest.raises(ValueError, match="bias must be"):
        kernels.linear(torch.randn(2, 64), p, torch.randn(7))


def _hostile(p: Packed, **arrays: torch.Tensor) -> Packed:
    return Packed.trusted("fixed12", p.shape, {**p.arrays, **arrays}, p.version)


def test_hostile_arrays_are_refused_not_read(kernels):
    w = random_weights(16, 64, "wide")
    p = glyd.pack(w, "fixed12")
    idx = p.arrays["exc_idx"]
    assert idx.numel() > 4
    x = torch.randn(1, 64)
    cases = {
        "base is out of range": _hostile(p, base=torch.tensor([121], dtype=torch.uint8)),
        "not strictly increasing": _hostile(p, exc_idx=idx.flip(0).contiguous()),
        "outside the matrix": _hostile(p, exc_idx=torch.cat([idx[:-1], idx.new_tensor([16 * 64])])),
    }
    for message, bad in cases.items():
        for call in (lambda: kernels.unpack(bad), lambda: kernels.linear(x, bad), lambda: kernels.rows(bad, torch.tensor([0]))):
            with pytest.raises(CorruptError, match=message):
                call()
    with pytest.raises(ValueError, match="contiguous"):
        kernels.unpack(_hostile(p, lo=torch.cat([p.arrays["lo"], p.arrays["lo"]], 1)[:, ::2]))
    with pytest.raises(ValueError, match="do not match"):
        kernels.unpack(_hostile(p, code=p.arrays["code"][:, :-1].contiguous()))
    with pytest.raises(ValueError, match="do not match"):
        kernels.unpack(_hostile(p, exc_hi=p.arrays["exc_hi"][:-1].contiguous()))


def test_padding_that_decodes_to_inf_is_refused(kernels):
    # linear multiplies the padding by x's zeros: code 7 with lo 0x80 at base 120 is +inf there, and
    # 0 * inf made every product NaN while the codec's matrix was finite
    from .test_unpack import _inf_padding

    _, bad = _inf_padding("fixed12")
    for call in (lambda: kernels.unpack(bad), lambda: kernels.linear(torch.full((1, 1000), 1e-30), bad)):
        with pytest.raises(CorruptError, match="padding"):
            call()


def test_an_array_changed_in_place_is_checked_again(kernels):
    p = glyd.pack(random_weights(16, 64, "wide"), "fixed12")
    kernels.unpack(p)  # checked and remembered
    p.arrays["exc_idx"][0] = 16 * 64 + 5
    with pytest.raises(CorruptError, match="outside the matrix"):
        kernels.unpack(p)


def test_both_instruction_paths_agree(cpu_kernels):
    w = random_weights(70, 300, "wide")
    p = glyd.pack(w, "fixed12")
    x = torch.randn(3, 300)
    ext = cpu_kernels._ext()
    try:
        ext.set_portable(True)
        assert cpu_kernels.simd() == "portable"
        portable = cpu_kernels.linear(x, p)
        assert _same_bits(cpu_kernels.unpack(p), w)
    finally:
        ext.set_portable(False)
    native = cpu_kernels.linear(x, p)
    assert cpu_kernels.simd() in ("avx2", "portable")
    assert ((portable - native).norm() / native.norm()).item() < 1e-6


def test_an_array_replaced_at_a_freed_arrays_id_is_read_where_it_is_now(cpu_kernels, monkeypatch):
    # The checked matrix (its arrays' addresses for C) was remembered by the arrays' ids and versions: a
    # 'code' array whose tensor object was freed (its storage kept alive by a view) and replaced by another
    # that took its id (CPython's next object, version 0) was read at the old address: the old bits, no error
    w = random_weights(16, 64, "wide")
    p = glyd.pack(w, "fixed12")
    arrays = dict(p.arrays)
    assert _same_bits(cpu_kernels.unpack(Packed(p.layout, p.shape, arrays, p.version)), w)  # checked, remembered
    keep = torch.empty(0, dtype=torch.uint8).set_(arrays["code"].untyped_storage())  # the old bytes stay put
    new_code = arrays["code"].clone()
    new_code.view(-1)[0] ^= 0x11  # the first two weights' codes: another matrix
    want = glyd.unpack(Packed(p.layout, p.shape, {**arrays, "code": new_code}, p.version))
    assert not _same_bits(want, w)
    old = id(arrays["code"])
    del p, arrays["code"]
    code = new_code.clone()
    for _ in range(100):  # (usually the first try)
        if id(code) == old:
            break
        code = new_code.clone()
    else:  # CPython gave the slot to another object (a long run's allocator state): the module sees the old id
        real = id
        monkeypatch.setattr(cpu_kernels, "id", lambda o: old if o is code else real(o), raising=False)
    assert getattr(cpu_kernels, "id", id)(code) == old and code.data_ptr() != keep.data_ptr()
    arrays["code"] = code
    assert _same_bits(cpu_kernels.unpack(Packed.trusted("fixed12", (16, 64), arrays, 1)), want)
