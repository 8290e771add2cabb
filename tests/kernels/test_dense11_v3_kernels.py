"""dense11 format version 3 kernels (``glyd.kernels.dense11``: ``Dense11V3GemvKernel``, the unpack of
``unpack_v2`` with ``V3``): the unpack bit for bit against the codec (odd shapes, crowded runs,
exceptions, last blocks of 16 runs), the GEMV's bits equal to version 2's GEMV on the same weights
(M = 1, 2, 16; ragged N and K; K splits; whole tiles; exceptions; prefetch off and on; the H200
table's configs but ``dot="mma"``, which version 2 runs as the tile dot: test_dense11_mma.py checks it against
float64), the registry's choice and refusals by version. CPU: Triton's interpreter; the
gpu-marked twins run the inline PTX (and the compiler's own layouts: the M = 1 sums' fixed order)."""

from __future__ import annotations

import pytest
import torch

from glyd.codec import dense11
from glyd.codec.dense11 import pack_v2, pack_v3

from .conftest import DEVICES, cpu_sampled, needs_triton
from .test_dense11_v2_kernels import _bits, _weights

pytestmark = needs_triton


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k,kind", [(5, 70, "wide"), (9, 1536, "crowded"), (16, 1024, "normal"),
                                      (7, 2101, "wide"), (3, 1, "normal")])
def test_unpack_equals_the_codec(device, n, k, kind):
    from glyd import kernels

    w = _weights(n, k, seed=n + k, kind=kind)
    p = pack_v3(w)
    assert p.version == 3
    assert torch.equal(_bits(kernels.unpack(p.to(device))), _bits(w))
    assert torch.equal(_bits(dense11.unpack(p)), _bits(w))


def _gemv(version, x, p, cfg):
    from glyd.kernels.dense11 import gemv_v2 as G

    kern, conf = (G.Dense11V3GemvKernel, G.Dense11V3GemvConfig) if version == 3 else \
        (G.Dense11V2GemvKernel, G.Dense11V2GemvConfig)
    out = torch.empty(x.shape[0], p.shape[0], dtype=torch.bfloat16, device=x.device)
    return kern.launch(x, p, None, conf(**cfg), out)


CASES = [  # (M, N, K, weights, config): ragged N and K, splits, whole tiles, a last block of 16 runs, prefetch
    (1, 40, 200, "wide", {}),
    (1, 40, 200, "wide", {"prefetch": True}),
    (1, 32, 1536, "crowded", {"split": 2, "prefetch": True}),  # (N 32: whole row tiles, as 48, two not three)
    (1, 32, 1536, "normal", {"bn": 16, "bk": 256, "mb": 16, "prefetch": True}),
    (2, 17, 1100, "wide", {"split": 2}),  # (N 17: a ragged second row tile, as 24's, with fewer exceptions)
    (16, 32, 1024, "crowded", {"bn": 32, "bk": 128, "mb": 16, "prefetch": True}),
    (16, 19, 300, "wide", {"dot": "lanes"}),
]


@pytest.mark.parametrize("device", DEVICES)
# interpreter time (48 s of a 2-core run, 2026-12-07): a third of the cases in the default CPU run, and cfg 1 (M 1's
# prefetch with ragged K), 2 (a K split, whole tiles, a last block of 16 runs) and 6 (the lanes dot); the default run
# leaves out cfg 3 (normal weights, the default bn and bk, prefetch at M 1 and K 1536: cfg 2's, with its K split) and 4
# (M 2, split 2; N 17: two row tiles at bn 16, the last ragged, as cfg 6's N 19 at M 16)
@pytest.mark.parametrize("m,n,k,kind,cfg", cpu_sampled(CASES, 3, keep={1, 2, 6}))
def test_gemv_gives_version_2s_bits(device, m, n, k, kind, cfg):
    w = _weights(n, k, seed=m + n + k, kind=kind)
    g = torch.Generator().manual_seed(k)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
    p2, p3 = pack_v2(w).to(device), pack_v3(w).to(device)
    assert p3.arrays["exc_idx"].numel() > 0
    want = _gemv(2, x, p2, cfg)
    got = _gemv(3, x, p3, cfg)
    assert torch.equal(_bits(got), _bits(want))
    ref = torch.nn.functional.linear(x.double().cpu(), w.double())
    assert float((got.double().cpu() - ref).norm() / ref.norm()) < 5e-3


def test_kernels_refuse_other_versions():
    from glyd.kernels.dense11.gemv_v2 import (Dense11V2GemvConfig, Dense11V2GemvKernel, Dense11V3GemvConfig,
                                              Dense11V3GemvKernel)
    from glyd.kernels.registry import Device, Problem

    cpu = Device("cpu", "cpu", interpreting=True)
    for version in (1, 2):
        ok, why = Dense11V3GemvKernel.can_implement(Problem("dense11", 1, 8, 128, 128, version), cpu,
                                                    Dense11V3GemvConfig())
        assert not ok and f"version {version}" in why and "\n" not in why
    assert Dense11V3GemvKernel.can_implement(Problem("dense11", 1, 8, 128, 128, 3), cpu, Dense11V3GemvConfig())[0]
    assert not Dense11V2GemvKernel.can_implement(Problem("dense11", 1, 8, 128, 128, 3), cpu, Dense11V2GemvConfig())[0]
    w = _weights(8, 128, seed=1)
    x = torch.randn(1, 128).to(torch.bfloat16)
    with pytest.raises(ValueError, match="version 3"):
        _gemv(3, x, pack_v2(w), {})
    with pytest.raises(ValueError):
        Dense11V3GemvConfig(bk=32)


def test_the_h200_table_puts_version_3_first():
    from glyd.codec import LAYOUTS
    from glyd.kernels import registry as R
    from glyd.kernels.dense11.gemv_mma import mma_rows

    from .test_registry import h200
    from .test_tables import SHAPES

    dev = h200(True, True, True)
    for shapes in SHAPES.values():
        for n, k in shapes:
            kp = LAYOUTS["dense11"].padded_cols(k)
            for m in (1, 2, 8, 9, 16, 17, 64):
                kc, cfg = R.choose(R.Problem("dense11", m, n, k, kp, 3), dev)
                assert kc.name == "dense11_v3_gemv", (n, k, m)
                k2, c2 = R.choose(R.Problem("dense11", m, n, k, kp, 2), dev)
                assert k2.name == "dense11_v2_gemv"
                if m == 1:  # the probe's relaid1d + prefetch at version 2's tile
                    assert cfg.prefetch and not c2.prefetch and (cfg.bn, cfg.bk, cfg.mb) == (c2.bn, c2.bk, c2.mb)
                elif m <= 16:  # the decoded tile in the MMA's registers, one x tile holding M (gemv_mma)
                    assert (cfg.dot, cfg.bn, cfg.bk, cfg.warps, cfg.prefetch) == ("mma", 64, 128, 4, True)
                    assert mma_rows(m, cfg.mb) >= m and mma_rows(m, cfg.mb) // 2 < max(m, 8), (m, cfg)
                else:  # the tile dot, one decode for all M rows (the H100's 2026-12-05 step: faster than mma here)
                    assert (cfg.dot, cfg.bn, cfg.bk, cfg.warps, cfg.prefetch) == ("tile", 32, 128, 4, True)
                    assert cfg.mb >= m and cfg.mb // 2 < m, (m, cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n,k", [(4608, 3584), (3584, 3584), (3584, 18944)])
def test_7b_shapes_give_version_2s_bits_on_the_gpu(n, k):
    # qkv, o and down of Qwen2.5-7B (o and down: 4 and 19 K splits at M = 1 on an H200): the shapes where the
    # 2026-12-05 probe's relaid GEMVs differed from version 2 at M = 1 before both summed in row_sum's order
    from glyd import kernels
    from glyd.kernels.gpu_pack import pack_dense11

    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    p2, p3 = pack_dense11(w, version=2), pack_dense11(w, version=3)
    assert torch.equal(kernels.unpack(p3).view(torch.int16), w.view(torch.int16))
    for m in (1, 2, 16):
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        for cfg in ({}, {"prefetch": True}, {"bn": 32, "bk": 128, "prefetch": True}):
            assert torch.equal(_bits(_gemv(3, x, p3, cfg)), _bits(_gemv(2, x, p2, cfg))), (m, cfg)
