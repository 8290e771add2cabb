"""``glyd.pack`` (the package's face): every layout name ``from_pretrained`` and ``glyd pack`` take,
``"auto"`` included, packs losslessly."""

from __future__ import annotations

import pytest
import torch

import glyd
import glyd.ops


def _matrix(n: int = 48, k: int = 200) -> torch.Tensor:
    w = (torch.randn(n, k, generator=torch.Generator().manual_seed(7)) * 0.02).to(torch.bfloat16)
    w[0, :6] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, 3e38]).to(torch.bfloat16)
    return w


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_auto_on_the_cpu_is_choose_layouts_choice_and_lossless():
    w = _matrix()
    p = glyd.pack(w, layout="auto")
    assert p.layout == glyd.ops.choose_layout(tuple(w.shape), w.device) == "fixed12"
    assert _same_bits(glyd.unpack(p), w)


def test_auto_follows_choose_layout(monkeypatch):
    # what the measurements pick for this shape and device is what glyd.pack packs
    asked = []

    def choose(shape, device):
        asked.append((shape, torch.device(device).type))
        return "tiered"

    monkeypatch.setattr(glyd.ops, "choose_layout", choose)
    w = _matrix(33, 70)
    p = glyd.pack(w, "auto")
    assert asked == [((33, 70), "cpu")] and p.layout == "tiered"
    assert _same_bits(glyd.unpack(p), w)


def test_unknown_layouts_name_auto_among_the_choices():
    with pytest.raises(ValueError, match="choose one of auto, ") as err:
        glyd.pack(_matrix(), layout="fixed13")
    assert all(name in str(err.value) for name in glyd.LAYOUTS)
    with pytest.raises(TypeError):
        glyd.pack([[1.0]], layout="auto")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_auto_on_a_gpu_tensor():
    w = _matrix(256, 512).cuda()
    p = glyd.pack(w, "auto")
    assert p.layout == glyd.ops.choose_layout(tuple(w.shape), w.device)
    assert _same_bits(glyd.unpack(p), w.cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("layout", list(glyd.LAYOUTS))
def test_pack_keeps_the_gpu_and_equals_the_cpu_pack(layout):
    # one public pack: a CUDA matrix packs on the GPU (bit-identical arrays), a CPU one on the CPU
    w = _matrix(64, 300)
    on_gpu, on_cpu = glyd.pack(w.cuda(), layout), glyd.pack(w, layout)
    assert on_gpu.device.type == "cuda" and on_cpu.device.type == "cpu"
    for name, a in on_cpu.arrays.items():
        assert a.numpy().tobytes() == on_gpu.arrays[name].cpu().numpy().tobytes(), name


def test_the_old_pack_functions_are_deprecated_aliases():
    import glyd.kernels

    w = _matrix(8, 70)
    for old in (glyd.ops.pack, glyd.kernels.pack):
        with pytest.warns(DeprecationWarning, match="glyd.pack"):
            p = old(w, "tiered")
        assert p.layout == "tiered" and _same_bits(glyd.unpack(p), w)
