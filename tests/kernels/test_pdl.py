"""Programmatic dependent launch (every fused-kernel config's ``pdl``): kernels launched while the one
before them ends give the same bits as plain launches, eagerly and in a CUDA graph."""

from __future__ import annotations

import pytest
import torch

import glyd

from .conftest import needs_triton, random_weights

pytestmark = needs_triton


def test_pdl_is_off_by_default_and_off_the_gpu():
    from glyd import _env
    from glyd.kernels import GemvConfig
    from glyd.kernels import _common as C

    assert GemvConfig().pdl == _env.settings().pdl
    for mode in ("all", "reduce", "tiles"):
        assert GemvConfig(pdl=mode).pdl == mode
        assert C.pdl_flags(torch.device("cpu"), mode) == 0  # the interpreter and the CPU never use it
        assert C.pdl_flags(torch.device("cpu"), mode, "reduce") == 0
    with pytest.raises(ValueError, match="pdl"):
        GemvConfig(pdl="sometimes")
    with pytest.raises(ValueError, match="pdl"):
        C.pdl_flags(torch.device("cpu"), "sometimes")


def test_glyd_pdl_sets_the_default(monkeypatch):
    from glyd import _env
    from glyd.kernels import GemvConfig

    try:
        for env, mode in (("1", "all"), ("0", ""), ("reduce", "reduce")):
            monkeypatch.setenv("GLYD_PDL", env)
            _env.settings.cache_clear()
            assert GemvConfig().pdl == mode
        monkeypatch.setenv("GLYD_PDL", "sometimes")
        _env.settings.cache_clear()
        with pytest.raises(ValueError, match="GLYD_PDL"):
            _env.settings()
    finally:
        monkeypatch.undo()
        _env.settings.cache_clear()


def _chain(ps, x, cfgs, pdl):
    # each product feeds the next (so every kernel reads what the one before it wrote), with a
    # bias on every other one; None: the table's choice
    from glyd import kernels

    y = x
    for i, (p, bias) in enumerate(ps):
        cfg = cfgs[i % len(cfgs)]
        cfg = (cfg or kernels.choose(y, p)[1]).replace(pdl=pdl)
        y = kernels.linear(y, p, bias, cfg)
        y = y / (y.float().abs().amax() + 1).to(y.dtype)  # a torch kernel between (keeps y in range)
    return y


@pytest.mark.gpu_sample(every=3)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 2, 5, 16, 33, 64])
@pytest.mark.parametrize("mode", ["all", "reduce", "tiles"])
def test_pdl_gives_the_same_bits_gpu(m, mode):
    from glyd import kernels
    from glyd.kernels import GemvConfig, GluonConfig
    from glyd.kernels import _common as C
    from glyd.kernels.registry import Device

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    k = 1024
    ps = []
    for i, n in enumerate((k, k, 512 if m < 16 else k, k)):
        w = random_weights(n if i < 3 else k, k if i != 3 else ps[-1][0].shape[0], "normal", "cuda")
        ps.append((glyd.pack(w, "fixed12"), torch.randn(w.shape[0], device="cuda").to(torch.bfloat16)
                   if i % 2 else None))
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    # the table's path for this M, and a split-K Gluon tile and GEMV where they apply
    cfgs = [None]
    if "gluon" in Device.of(x.device).features:
        cfgs.append(GluonConfig(bm=16 if m <= 16 else 32, bn=32, bk=128, prefetch=True, split=4, exc_tile=True))
    if m <= 2:
        cfgs.append(GemvConfig(bm=m, bn=32, bk=256, split=4))
    ref = _chain(ps, x, cfgs, "")
    assert C.pdl_flags(x.device, mode) == {"all": 3, "reduce": 2, "tiles": 1}[mode]
    eager = _chain(ps, x, cfgs, mode)
    torch.cuda.synchronize()
    assert torch.equal(eager.view(torch.int16), ref.view(torch.int16))
    # captured: the programmatic edges live in the graph
    static_x = x.clone()
    _chain(ps, static_x, cfgs, mode)  # warm-up (compiles) outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = _chain(ps, static_x, cfgs, mode)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
    x2 = torch.randn(m, k, device="cuda").to(torch.bfloat16)  # fresh inputs through the same graph
    static_x.copy_(x2)
    g.replay()
    ref2 = _chain(ps, x2, cfgs, "")
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), ref2.view(torch.int16))
