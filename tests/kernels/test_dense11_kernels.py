"""dense11 kernels: the unpack bit for bit (every pattern, odd shapes, rows of several escape
blocks, exceptions) and the fused GEMV against float64 F.linear with test_linear's tolerance, for
M = 1-16 (and more x rows than a program takes), bias, forced K splits; hostile offsets refused."""

from __future__ import annotations

import pytest
import torch

import glyd
from glyd.codec.dense11 import pack_v1, pack_v2
from glyd.errors import CorruptError

from .conftest import DEVICES, needs_triton
from .test_linear import _check

pytestmark = needs_triton


def _weights(n: int, k: int, seed: int, exceptions: int = 0) -> torch.Tensor:
    """std 0.02 weights (2% escapes) plus 15 + ``exceptions`` weights of distinct tiny exponents,
    each rarer than the natural escapes: at least ``exceptions`` of them miss the table."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    if exceptions:
        pick = torch.randperm(n * k, generator=g)[: 15 + exceptions]
        w.view(-1)[pick] = torch.exp2(-torch.arange(60, 75 + exceptions, dtype=torch.float32))
    return w.to(torch.bfloat16)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.int16)


@pytest.mark.parametrize("device", DEVICES)
def test_unpack_every_pattern(device):
    from glyd import kernels

    w = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(32, 2048)
    assert torch.equal(_bits(kernels.unpack(pack_v1(w).to(device))), _bits(w))


@pytest.mark.cpu_sample(every=2)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,exc", [((5, 70), 3), ((3, 1100), 4), ((2, 2100), 0), ((17, 64), 2)])
def test_unpack_shapes(device, shape, exc):
    from glyd import kernels

    w = _weights(*shape, seed=sum(shape), exceptions=exc)
    p = pack_v1(w)
    assert p.arrays["exc_idx"].numel() >= exc
    assert torch.equal(_bits(kernels.unpack(p.to(device))), _bits(w))


@pytest.mark.parametrize("device", DEVICES)
def test_unpack_configs_and_out(device):
    from glyd.kernels import Dense11UnpackConfig
    from glyd.kernels.dense11 import unpack as kd

    w = _weights(9, 1030, seed=1, exceptions=2)
    p = pack_v1(w).to(device)
    out = torch.empty(9, 1030, dtype=torch.bfloat16, device=device)
    assert kd.unpack(p, out, Dense11UnpackConfig(rows=4, bk=1024, warps=2)) is out
    assert torch.equal(_bits(out), _bits(w))
    with pytest.raises(ValueError, match="out must be"):
        kd.unpack(p, torch.empty(9, 1029, dtype=torch.bfloat16, device=device))


@pytest.mark.cpu_sample(every=2)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,n,k,cfg", [
    (1, 24, 70, {}), (2, 9, 1100, {"split": 2}), (5, 16, 256, {"bn": 8, "bk": 64}), (16, 6, 200, {"mb": 16}),
    (19, 5, 130, {"mb": 8, "bn": 4}), (3, 7, 2100, {"bk": 512}),
])
def test_gemv(device, m, n, k, cfg):
    from glyd import kernels
    from glyd.kernels import Dense11GemvConfig

    w = _weights(n, k, seed=m + n + k, exceptions=3)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    bias = torch.randn(n, generator=g).to(torch.bfloat16) if m % 2 else None
    p = pack_v1(w).to(device)
    y = kernels.linear(x.to(device), p, None if bias is None else bias.to(device), config=Dense11GemvConfig(**cfg))
    _check(y, x, w, bias)


@pytest.mark.parametrize("device", DEVICES)
def test_registry_picks_dense11_kernels(device):
    from glyd import kernels

    p = pack_v1(_weights(8, 128, seed=2)).to(device)
    for m, name in ((1, "dense11_gemv"), (16, "dense11_gemv"), (40, "dense11_unpack_cublas")):
        x = torch.randn(m, 128).to(torch.bfloat16).to(device)
        assert kernels.choose(x, p)[0].name == name
        _check(kernels.linear(x, p), x.cpu(), glyd.unpack(p), None)


@pytest.mark.parametrize("device", DEVICES)
def test_hostile_offsets_refused(device):
    from glyd import kernels

    p = pack_v1(_weights(4, 1100, seed=3))
    for name, edit in (("esc_off", lambda t: t.__setitem__(1, int(t[1]) + 3)),
                       ("esc_base", lambda t: t.__setitem__(-1, t[-1] + 8)),
                       ("esc", None)):
        arrays = dict(p.arrays)
        if edit is None:
            arrays["esc"] = arrays["esc"][:-1].clone()
        else:
            arrays[name] = arrays[name].clone()
            edit(arrays[name])
        bad = glyd.Packed("dense11", p.shape, arrays, p.version).to(device)
        with pytest.raises(CorruptError, match="dense11"):
            kernels.unpack(bad)
        with pytest.raises(CorruptError, match="dense11"):
            kernels.linear(torch.zeros(1, 1100, dtype=torch.bfloat16, device=device), bad)


@pytest.mark.parametrize("device", DEVICES)
def test_gpu_pack_equals_the_codec(device):
    from glyd.kernels.gpu_pack import pack_dense11 as pack
    from glyd.kernels.gpu_pack import pack_dense11_v1

    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(64, 1024)
    for w in (every, _weights(5, 70, seed=4, exceptions=3), _weights(3, 2100, seed=5), torch.zeros(2, 0).bfloat16()):
        want = glyd.pack(w, "dense11")
        got = pack(w.to(device))
        assert got.version == want.version == 3
        v2 = pack(w.to(device), version=2)
        assert v2.version == 2 and all(torch.equal(v2.arrays[a].cpu(), t) for a, t in pack_v2(w).arrays.items())
        old = pack_dense11_v1(w.to(device))
        assert old.version == 1 and all(torch.equal(old.arrays[a].cpu(), t) for a, t in pack_v1(w).arrays.items())
        assert got.device.type == device and set(got.arrays) == set(want.arrays)
        for name, a in want.arrays.items():
            b = got.arrays[name].cpu()
            assert b.dtype == a.dtype and b.shape == a.shape and b.numpy().tobytes() == a.numpy().tobytes(), name


def test_version_1_says_once_to_re_save(caplog, monkeypatch):
    from glyd.kernels.dense11 import unpack as kd

    monkeypatch.setattr(kd, "_SAID", [False])
    with caplog.at_level("WARNING", logger=kd.__name__):
        for seed in (6, 7):  # two matrices of one model: one message
            kd.prepare(pack_v1(_weights(4, 70, seed=seed)))
    said = [r for r in caplog.records if "re-save" in r.getMessage()]
    assert len(said) == 1 and "version 1" in said[0].getMessage()
