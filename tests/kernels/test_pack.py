"""GPU pack (torch ops on the tensor's device) against the CPU codec: arrays equal byte for byte."""

from __future__ import annotations

import pytest
import torch

import glyd
from glyd.codec.layout import resolve

from .conftest import DEVICES, random_weights

#: Every layout with a torch-op pack of its own (glyd.pack uses it for CUDA matrices).
LAYOUTS = [name for name, lay in glyd.LAYOUTS.items() if lay.device_pack is not None]


def pack(w: torch.Tensor, layout: str) -> glyd.Packed:
    """The layout's pack with torch ops on ``w``'s device (here also on the CPU)."""
    return resolve(glyd.LAYOUTS[layout].device_pack)(w)


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
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pack_keeps_device_and_rejects_bad_input(device, layout):
    w = random_weights(4, 8, "normal", device)
    assert pack(w, layout).device.type == device
    with pytest.raises(TypeError, match="bfloat16"):
        pack(w.float(), layout)
    with pytest.raises(ValueError, match="2-D"):
        pack(w.reshape(-1), layout)
    with pytest.raises(ValueError, match="unknown layout"):
        glyd.pack(w, "nope")


def test_every_builtin_layout_has_a_device_pack():
    assert {"fixed12", "tiered", "dense11"} <= set(LAYOUTS)
