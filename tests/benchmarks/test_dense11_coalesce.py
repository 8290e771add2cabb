"""``benchmarks/probes/dense11_coalesce.py`` (issue 35's coalescing probe): the relayout of dense11
version 2's ``code`` and ``sm`` arrays round-trips bit for bit and moves each value where the kernel
reads it; the GEMV on the relaid arrays (decode_words unchanged, or its digit gathers 1-D) gives
version 2's GEMV's bits at M = 1, 2, 16, ragged N and K, K splits, whole tiles, exceptions, prefetch
off and on (CPU: Triton's interpreter). ``--sass``'s sector model reproduces the 2026-12-05 profile."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from glyd.codec.dense11 import pack_v2

PROBES = Path(__file__).resolve().parents[2] / "benchmarks" / "probes"


def _load(name: str):
    pytest.importorskip("triton")
    sys.path.insert(0, str(PROBES))
    try:
        spec = importlib.util.spec_from_file_location(name, PROBES / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(PROBES))


@pytest.fixture(scope="module")
def dc():
    return _load("dense11_coalesce")


@pytest.mark.parametrize("n,k,kind", [(5, 70, "normal"), (6, 1030, "crowded"), (3, 2100, "wide"), (4, 3584, "crowded"),
                                      (2, 1, "normal"), (7, 2048, "wide")])
def test_relayout_round_trip(dc, n, k, kind):
    p = pack_v2(dc.weights(n, k, seed=n + k, kind=kind))
    code, sm = p.arrays["code"], p.arrays["sm"]
    rc, rs = dc.relayout(code, sm)
    assert rc.dtype == code.dtype and rs.dtype == sm.dtype and rc.shape == code.shape and rs.shape == sm.shape
    bc, bs = dc.restore(rc, rs)
    assert torch.equal(bc, code) and torch.equal(bs, sm)
    kp = sm.shape[1]
    if k > 64:  # several runs of real weights a row: the order changed (k = 1: its padding may look alike)
        assert not torch.equal(rc, code) and not torch.equal(rs, sm)
    # each sm byte where the kernel's exception pass (sm_index) and the step loads look for it
    flat = rs.reshape(-1)
    for r, c in [(0, 0), (n - 1, kp - 1), (n // 2, min(kp - 1, 1000)), (0, min(kp - 1, 1040)), (n - 1, kp // 2 + 17)]:
        assert int(flat[dc.sm_index(r, c, kp)]) == int(sm[r, c]), (r, c)
    runs = kp // 32  # c1 of run j of a row's last block sits its block's run count after c0
    last = (runs - 1) // 32
    rb = runs - 32 * last
    j = runs - 1 - 32 * last
    assert int(rc[n - 1, 96 * last + rb + j]) == int(code[n - 1, 3 * (runs - 1) + 1])


def test_relayout_refuses_other_arrays(dc):
    with pytest.raises(ValueError, match="code must be int32"):
        dc.relayout(torch.zeros(2, 6, dtype=torch.int64), torch.zeros(2, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="not one matrix's runs"):
        dc.relayout(torch.zeros(2, 9, dtype=torch.int32), torch.zeros(2, 64, dtype=torch.uint8))


@pytest.mark.parametrize("m,n,k,kind,cfg", [
    # a row's last block of 2 runs, one split, exceptions of ranks 8+ (K 1076: 2 blocks, as 2100's 3, half the steps)
    (1, 24, 1076, "crowded", {"split": 1}),
    # whole tiles (no masks), a last block of 16 runs (as the 7B's K), K splits: -m slow only (36-40 s of Triton's
    # interpreter in a 2-core run, 2026-12-07, among the default run's three longest tests); the probe's GEMV runs
    # them there, version 2's own GEMV in the default run too (test_dense11_v2_kernels, test_dense11_v3_kernels)
    pytest.param(1, 16, 1536, "wide", {}, marks=pytest.mark.slow),
    # interpreter time: one of these two in the default CPU run (the 16 x rows' tl.dot, ragged; K splits are the M = 1
    # cases'): cpu_sample, tests/conftest.py
    pytest.param(2, 20, 1100, "crowded", {"split": 2}, marks=pytest.mark.cpu_sample(every=2)),  # M = 2, ragged N, K
    pytest.param(16, 33, 200, "crowded", {}, marks=pytest.mark.cpu_sample(every=2)),  # M = 16, ragged
    (1, 24, 70, "normal", {"bk": 64}),
])
def test_gemv_gives_version_2s_bits(dc, m, n, k, kind, cfg):
    from glyd.kernels.dense11.gemv_v2 import Dense11V2GemvConfig, Dense11V2GemvKernel

    w = dc.weights(n, k, seed=m + n + k, kind=kind)
    p = pack_v2(w)
    assert p.arrays["exc_idx"].numel() > 0
    relaid = dc.Relaid(p)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    want = Dense11V2GemvKernel.launch(x, p, None, Dense11V2GemvConfig(**cfg), torch.empty(m, n, dtype=torch.bfloat16))
    ref = x.double() @ w.double().T
    # a sanity check of the reference (the bits below are the test): bf16 output rounding of the wide
    # weights' cancelling sums reaches 5e-3 here, hence 1e-2 (probe_dense_decode.py's bound)
    assert ((want.double() - ref).norm() / ref.norm()).item() < 1e-2
    for pf, win1d in ((False, False), (True, True)) if m > 1 else ((False, False), (True, False), (False, True)):
        got = dc.gemv(x, relaid, None, Dense11V2GemvConfig(prefetch=pf, **cfg), win1d=win1d)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (pf, win1d)


def test_the_sector_model_reproduces_the_profile():
    # 2026-12-05 Nsight Compute (M = 1): version 2's code words ~20 sectors a warp request where 4 would
    # do, its sm halves 50% excessive, on the compiler's lanes (16 rows x 2 runs a warp)
    probe = _load("probe_dense11_coalesce")
    along_rows = ([1, 1], [16, 2], [1, 4], [0, 1])
    along_runs = ([1, 1], [4, 8], [4, 1], [1, 0])
    v2 = [sum(len({probe.address("v2", c, p, 3584) // 32 for pts in probe.lanes_of(along_rows, [16, 8], wp)
                   for p in pts}) for wp in range(4)) / 4 for c in ("c0", "c1", "c2")]
    assert v2 == [20, 24, 20]
    relaid = {probe.address("relaid", "c1", p, 3584) // 32 for pts in probe.lanes_of(along_runs, [16, 8], 0)
              for p in pts}
    assert len(relaid) == 4
    sm = {probe.address("relaid", "s4a", p, 3584) // 32 for pts in probe.lanes_of(([1, 4], [4, 8], [4, 1], [1, 0]),
                                                                                    [16, 32], 0) for p in pts}
    assert len(sm) == 16
