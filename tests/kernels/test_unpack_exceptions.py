"""Unpack kernels patch their exceptions inside their own launch (fixed12, dense11): bit-exact against
the CPU codec (raw bits) with none, few and many exceptions, exceptions in the last partial tile and
on huge N, row ranges that end inside a tile, and one launch with no scatter (``index_put``); the
unpack + cuBLAS families' plans run one unpack launch and one cuBLAS call a repeated product."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import glyd
from glyd.codec.dense11 import pack_v1, pack_v2, pack_v3

from .conftest import DEVICES, needs_triton, on_devices, random_weights

pytestmark = needs_triton


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16).cpu()


def _with_exceptions(n: int, k: int, where) -> torch.Tensor:
    """std 0.02 weights (a window with no misses) and exceptions (1e-30: far below it) at ``where``
    (flat indices), each with a random sign."""
    w = torch.randn(n, k) * 0.02
    w.clamp_(-0.5, 0.5)  # no weight above the window either
    w[w.abs() < 1e-4] = 1e-4
    idx = torch.as_tensor(where, dtype=torch.int64)
    w.view(-1)[idx] = 1e-30 * torch.sign(torch.randn(idx.numel()))
    return w.to(torch.bfloat16)


class _Ops(TorchDispatchMode):
    """The aten ops called (name only) while active."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _cases():
    # (N, K, exception positions (flat), UnpackConfig fields): K = 128 and 1024 take the flat kernel
    # (K == Kp), K = 100 and 1000 the byte tiles; configs whose tiles do not divide the matrix leave a
    # partial last tile, and exceptions sit in it.
    return [
        ("none", 40, 128, [], {}),
        ("few", 40, 128, [0, 77, 40 * 128 - 1], {}),
        ("few-bytes", 37, 100, [0, 5, 36 * 100 + 99], {}),
        ("last-partial-flat", 33, 1024, list(range(32 * 1024 + 1000, 33 * 1024)), {"flat_groups": 64}),  # 8.25 programs
        ("last-partial-bytes", 35, 1000, list(range(34 * 1000 + 900, 35 * 1000)) + [33 * 1000 + 1], {"rows": 32}),
        ("one-tile-many", 16, 128, list(range(0, 16 * 128, 3)), {"flat_groups": 64}),
        ("many", 8, 100, list(range(0, 8 * 100, 2)) + [799], {}),  # 401 of 800 tiny: the other 399 are exceptions
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", _cases(), ids=[c[0] for c in _cases()])
@pytest.mark.parametrize("kernel", ["flat", "bytes"])
def test_fixed12_unpack_patches_exceptions_in_one_launch(device, case, kernel):
    from glyd import kernels
    from glyd.kernels import UnpackConfig, _plan

    _name, n, k, where, fields = case
    if kernel == "bytes":
        fields = {**fields, "flat_groups": 0}
    w = _with_exceptions(n, k, where)
    p = glyd.pack(w, "fixed12")
    nexc = len(where) if 2 * len(where) < n * k else n * k - len(where)  # the window holds the most weights
    assert int(p.arrays["exc_idx"].numel()) == nexc
    p = p.to(device)
    kernels.prepare(p)  # the per-matrix index (host work, once)
    kernels.unpack(p, None, UnpackConfig(**fields))  # and the per-tiling one
    before = _plan.LAUNCHES[1]
    with _Ops() as ops:
        got = kernels.unpack(p, None, UnpackConfig(**fields))
    assert _plan.LAUNCHES[1] - before == 1
    assert not [o for o in ops.names if o.startswith(("index_put", "searchsorted", "sort", "bincount", "nonzero"))]
    assert torch.equal(_bits(got), w.view(torch.int16))


@pytest.mark.parametrize("kind,device", on_devices([("normal",), ("wide",)], ["normal", "wide"], cpu_slow={0, 1}))
def test_fixed12_unpack_huge_n(device, kind):
    # 70,000 rows (more tiles than a 16-bit grid dimension holds) with exceptions spread over them,
    # the last row's included: the flat kernel (K = 64) and the byte tiles (K = 40). Triton's
    # interpreter takes 3-4 minutes a case (slow on the CPU).
    from glyd import kernels

    for k in (64, 40):
        w = random_weights(70_000, k, kind)
        w[-1, -1] = 1e-30
        p = glyd.pack(w, "fixed12")
        assert int(p.arrays["exc_idx"][-1]) == 70_000 * k - 1
        assert torch.equal(_bits(kernels.unpack(p.to(device))), w.view(torch.int16)), k


@pytest.mark.parametrize("device", DEVICES)
def test_fixed12_unpack_rows_ending_inside_a_tile_write_only_their_rows(device):
    # A row range's last tile of the matrix's tiling reaches past it: the exceptions of the rows after
    # it are not written (out is followed by other memory), and unaligned starts still patch theirs.
    from glyd.kernels.fixed12.exceptions import prepare
    from glyd.kernels.fixed12.unpack import unpack_rows

    n, k = 96, 130
    w = random_weights(n, k, "wide")
    w[:, 3] = 1e-30  # far below any window: an exception in every row, whatever the random draw
    p = glyd.pack(w, "fixed12").to(device)
    rows = (p.arrays["exc_idx"].cpu() // k).unique()
    assert rows.numel() == n  # every row has exceptions
    prep = prepare(p)
    for r0, r1 in ((0, 40), (32, 45), (37, 41), (64, 96), (5, 5)):
        buf = torch.full(((r1 - r0) * k + 5 * k,), 7, dtype=torch.int16, device=device)
        out = buf[:(r1 - r0) * k].view(torch.bfloat16).view(r1 - r0, k)
        unpack_rows(p, prep, r0, r1, out)
        assert torch.equal(_bits(out), w[r0:r1].view(torch.int16)), (r0, r1)
        assert bool((buf[(r1 - r0) * k:] == 7).all()), (r0, r1)
    with pytest.raises(ValueError, match="rows"):
        from glyd.kernels.fixed12.unpack import unpack_launch

        unpack_launch(p, 10, 200)


@pytest.mark.parametrize("device", DEVICES)
def test_fixed12_unpack_row_ranges_on_flat_tiles_take_the_flat_kernel(device):
    # K == Kp: a row range that starts and ends on the flat tiling's tiles (1,024 weights) is one stream of groups,
    # unpacked by the flat kernel from the matrix's tile T0 (its exceptions from the matrix's flat exception tiles);
    # other ranges take the byte tiles. Every range gives its rows bit for bit and writes nothing past them.
    from glyd.kernels.fixed12.exceptions import prepare
    from glyd.kernels.fixed12.unpack import _unpack_flat_kernel, _unpack_kernel, unpack_launch, unpack_rows

    n, k = 200, 128
    w = random_weights(n, k, "wide")
    w[:, 5] = 1e-30  # an exception in every row, whatever the random draw
    p = glyd.pack(w, "fixed12").to(device)
    prep = prepare(p)
    for (r0, r1), kernel in (((0, 64), _unpack_flat_kernel), ((64, 128), _unpack_flat_kernel),
                             ((128, 200), _unpack_flat_kernel), ((0, 200), _unpack_flat_kernel),
                             ((8, 16), _unpack_flat_kernel), ((8, 13), _unpack_kernel), ((4, 16), _unpack_kernel)):
        assert unpack_launch(p, r0, r1).kernel is kernel, (r0, r1)
        buf = torch.full(((r1 - r0) * k + 3 * k,), 7, dtype=torch.int16, device=device)
        out = buf[:(r1 - r0) * k].view(torch.bfloat16).view(r1 - r0, k)
        unpack_rows(p, prep, r0, r1, out)
        assert torch.equal(_bits(out), w[r0:r1].view(torch.int16)), (r0, r1)
        assert bool((buf[(r1 - r0) * k:] == 7).all()), (r0, r1)


_WHERE = {"where0": [], "where1": [0, 3, 1099], "wide": "wide"}  # (the ids the stacked parametrize gave)
_DENSE11_CASES = [(version, where) for version in (3, 2, 1) for where in _WHERE.values()]


# Versions 2 and 3 take Triton's interpreter 11-14 s a case (76 s of a 2-core run for the nine, 2026-12-07): on the CPU
# three of their six run by default, version 3 without exceptions and with a few (one in the last partial block),
# version 2 with many (wide); the other three with -m slow. Version 1 (under 1 s a case) runs all three.
@pytest.mark.parametrize("version,where,device", on_devices(
    _DENSE11_CASES, [f"{version}-{name}" for version in (3, 2, 1) for name in _WHERE],
    cpu_slow={_DENSE11_CASES.index(c) for c in ((2, []), (2, [0, 3, 1099]), (3, "wide"))}))
def test_dense11_unpack_patches_exceptions_in_one_launch(device, where, version):
    from glyd import kernels
    from glyd.kernels import _plan

    n, k = 12, 1100  # two 1024-column blocks, the last partial
    if where == "wide":
        w = random_weights(n, k, "wide")
    else:  # 22 common exponents (window and table) and rare ones at ``where``: the exceptions
        e = 1 + torch.arange(n * k) % 22
        w = torch.exp2(-e.double()) * (1 + torch.rand(n * k, dtype=torch.float64) * 0.99)
        w[torch.as_tensor(where, dtype=torch.int64)] = torch.tensor([2.0**-40, 2.0**-50, 2.0**-60][:len(where)],
                                                                     dtype=torch.float64)
        w = w.view(n, k).to(torch.bfloat16)
    nexc = int(pack_v1(w).arrays["exc_idx"].numel())  # version 2 adds a run's escapes of rank 8 and up
    assert nexc > 20 if where == "wide" else nexc == len(where)
    p = {1: pack_v1, 2: pack_v2, 3: pack_v3}[version](w).to(device)
    assert p.version == version and int(p.arrays["exc_idx"].numel()) >= nexc
    kernels.unpack(p)
    before = _plan.LAUNCHES[1]
    with _Ops() as ops:
        got = kernels.unpack(p)
    assert _plan.LAUNCHES[1] - before == 1 and not [o for o in ops.names if o.startswith("index_put")]
    assert torch.equal(_bits(got), w.view(torch.int16))


def _long_cases():
    from glyd.kernels import Dense11LongConfig, LongConfig, TieredLongConfig

    return [("fixed12_unpack_cublas", LongConfig(), "fixed12", 40, 128, 1),
            ("fixed12_unpack_cublas", LongConfig(chunk=64), "fixed12", 150, 100, 3),
            ("tiered_unpack_cublas", TieredLongConfig(), "tiered", 12, 100, 1),
            ("dense11_unpack_cublas", Dense11LongConfig(), "dense11", 12, 100, 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("with_bias", [False, True])
def test_unpack_cublas_plan_is_one_unpack_and_cublas_a_chunk(monkeypatch, device, case, with_bias):
    # A kept plan: per call one unpack launch a chunk and one cuBLAS call (mm, addmm with a bias)
    # into the output the plan allocated; no scatter, no per-matrix index work; the uncached bits.
    from glyd import kernels
    from glyd.kernels import _plan, registry

    name, cfg, layout, n, k, chunks = _long_cases()[case]
    kc = registry.kernel_class(name)
    monkeypatch.setattr(registry, "choose", lambda problem, dev: (kc, cfg))
    w = random_weights(n, k, "wide")
    p = glyd.pack(w, layout).to(device)
    x = torch.randn(5, k).to(torch.bfloat16).to(device)
    bias = torch.randn(n).to(torch.bfloat16).to(device) if with_bias else None
    _plan.set_enabled(False)
    try:
        want = _bits(kernels.linear(x, p, bias))
        _plan.set_enabled(True)
        assert torch.equal(_bits(kernels.linear(x, p, bias)), want)  # the plan made
        assert _plan.count() == 1
        before = _plan.LAUNCHES[1]
        with _Ops() as ops:
            y = kernels.linear(x, p, bias)
        assert _plan.LAUNCHES[1] - before == chunks
        products = [o for o in ops.names if o in ("mm", "addmm", "matmul", "linear")]
        assert products == [("addmm" if with_bias else "mm")] * chunks
        assert not [o for o in ops.names if o.startswith(("index_put", "searchsorted", "sort", "bincount", "nonzero",
                                                          "_local_scalar_dense"))]
        assert torch.equal(_bits(y), want)
    finally:
        _plan.set_enabled(None)


@pytest.mark.parametrize("device", DEVICES)
def test_unpack_cublas_plan_survives_a_grown_scratch_buffer(monkeypatch, device):
    # The device's one scratch buffer grows when a larger matrix is unpacked: a plan made before
    # looks it up each call, so it neither keeps the old buffer alive nor writes a freed one.
    from glyd import kernels
    from glyd.kernels import LongConfig, _common, _plan, registry

    kc = registry.kernel_class("fixed12_unpack_cublas")
    monkeypatch.setattr(registry, "choose", lambda problem, dev: (kc, LongConfig()))
    _plan.set_enabled(True)
    try:
        small, large = random_weights(8, 64, "wide"), random_weights(64, 256, "wide")
        ps, pl = glyd.pack(small).to(device), glyd.pack(large).to(device)
        xs, xl = (torch.randn(3, kk).to(torch.bfloat16).to(device) for kk in (64, 256))
        dev = xs.device  # "cuda:0" on CUDA: the key the product's own tensors give
        monkeypatch.setitem(_common._SCRATCH, (dev.type, dev.index),
                            torch.empty(1, dtype=torch.bfloat16, device=device))
        first = _bits(kernels.linear(xs, ps))
        kernels.linear(xl, pl)
        assert _common.scratch(torch.device(device), 1).untyped_storage().nbytes() >= 64 * 256 * 2
        assert torch.equal(_bits(kernels.linear(xs, ps)), first)
        assert torch.equal(first, _bits(torch.nn.functional.linear(xs.float(), small.to(device).float()).to(
            torch.bfloat16))) or device == "cuda"
    finally:
        _plan.set_enabled(None)
