"""GPU pack (torch ops on the tensor's device) against the CPU codec: arrays equal byte for byte."""

from __future__ import annotations

import pytest
import torch

import glyd
from glyd.kernels.gpu_pack import pack

from .conftest import DEVICES, random_weights

LAYOUTS = ["fixed12", "tiered"]


def _same(a: glyd.Packed, b: glyd.Packed) -> None:
    assert a.layout == b.layout and a.shape == b.shape
    assert sorted(a.arrays) == sorted(b.arrays)
    for name in a.arrays:
        x, y = a.arrays[name], b.arrays[name].cpu()
        assert x.dtype == y.dtype, name
        assert x.shape == y.shape, name
        assert torch.equal(x.view(torch.int16) if x.dtype == torch.uint16 else x,
                           y.view(torch.int16) if y.dtype == torch.uint16 else y), name


def _all_patterns() -> torch.Tensor:
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(256, 256)


@pytest.mark.gpu_sample(every=2)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (17, 300), (64, 1024), (5, 2111), (0, 7), (4, 0)])
@pytest.mark.parametrize("kind", ["normal", "wide"])
def test_pack_matches_codec(device, layout, shape, kind):
    w = random_weights(*shape, kind)
    _same(glyd.pack(w, layout), pack(w.to(device), layout))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pack_all_bit_patterns(device, layout):
    w = _all_patterns()
    _same(glyd.pack(w, layout), pack(w.to(device), layout))
    one = torch.full((3, 70), -0.0, dtype=torch.bfloat16)  # one exponent only
    _same(glyd.pack(one, layout), pack(one.to(device), layout))


@pytest.mark.parametrize("device", DEVICES)
def test_pack_keeps_device_and_rejects_bad_input(device):
    w = random_weights(4, 8, "normal", device)
    assert pack(w, "fixed12").device.type == device
    with pytest.raises(TypeError, match="bfloat16"):
        pack(w.float(), "fixed12")
    with pytest.raises(ValueError, match="2-D"):
        pack(w.reshape(-1), "tiered")
    with pytest.raises(ValueError, match="unknown layout"):
        pack(w, "nope")
