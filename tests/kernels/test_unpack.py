"""GPU unpack kernels: bit-exact against the CPU codec (compare raw bits, never a tolerance)."""

from __future__ import annotations

import pytest
import torch

import glyd

from .conftest import DEVICES, needs_triton, on_devices, random_weights

pytestmark = needs_triton

LAYOUTS = ["fixed12", "tiered"]


def _kunpack(p, device, config=None):
    from glyd import kernels

    return kernels.unpack(p.to(device), None, config)


SHAPES = [(1, 1), (3, 70), (33, 1100), (2, 2048), (7, 64)]
#: tiered at 33 x 1100 takes Triton's interpreter 7-9 s (the others well under 1 s): on the CPU it runs
#: with -m slow; test_tiered_kernels unpacks 5 x 1100 with every tier dense, and 64 x 1024 all bit patterns below
_CASES = [(shape, layout) for shape in SHAPES for layout in LAYOUTS]


@pytest.mark.gpu_sample(every=3)
@pytest.mark.parametrize("shape,layout,device", on_devices(
    _CASES, [f"shape{SHAPES.index(s)}-{lay}" for s, lay in _CASES],
    cpu_slow={_CASES.index(((33, 1100), "tiered"))}))
@pytest.mark.parametrize("kind", ["normal", "wide"])
def test_unpack_bit_exact(device, layout, shape, kind):
    w = random_weights(*shape, kind)
    out = _kunpack(glyd.pack(w, layout), device)
    assert out.dtype == torch.bfloat16 and out.shape == w.shape and out.device.type == device
    assert torch.equal(out.cpu().view(torch.int16), w.view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_unpack_all_bit_patterns(device, layout):
    w = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(64, 1024)
    out = _kunpack(glyd.pack(w, layout), device)
    assert torch.equal(out.cpu().view(torch.int16), w.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(4608, 3584), (512, 3584), (3584, 18944), (1000, 777)])
def test_unpack_bit_exact_large_gpu(layout, shape):
    from glyd import kernels

    w = random_weights(*shape, "normal", "cuda")
    p = glyd.pack(w, layout)
    assert torch.equal(kernels.unpack(p).view(torch.int16), w.view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flat", [(0, 4), (16, 2), (64, 4)])  # (groups a program, warps); 0: byte tiles
@pytest.mark.parametrize("shape", [(2, 2048), (33, 1024), (5, 64), (64, 1024)])
def test_fixed12_flat_and_byte_tile_unpack_bit_exact(device, flat, shape):
    # Whole rows (K == Kp) go to the flat kernel by default; the byte tiles stay for padded rows
    # and as its fallback. Group counts that do not divide the groups leave a masked last program.
    from glyd.kernels import UnpackConfig

    cfg = UnpackConfig(flat_groups=flat[0], flat_warps=flat[1])
    w = random_weights(*shape, "wide")  # exceptions too
    assert torch.equal(_kunpack(glyd.pack(w, "fixed12"), device, cfg).cpu().view(torch.int16), w.view(torch.int16))
    # every pattern (61,440 exceptions: 9-10 s of Triton's interpreter a config) with the configs other than
    # UnpackConfig()'s (16, 2): test_unpack_all_bit_patterns unpacks the same matrix with it (config None is it)
    if shape == (64, 1024) and cfg != UnpackConfig():
        w = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(64, 1024)
        got = _kunpack(glyd.pack(w, "fixed12"), device, cfg)
        assert torch.equal(got.cpu().view(torch.int16), w.view(torch.int16))


def test_unpack_refuses_another_layouts_config_by_name():
    # a config of another family used to reach the launcher and fail on a missing attribute
    # ("'GemvConfig' object has no attribute 'flat_groups'"); a falsy one was silently the default
    from glyd import kernels
    from glyd.kernels.dense11.unpack import Dense11UnpackConfig
    from glyd.kernels.fixed12.gemv import GemvConfig
    from glyd.kernels.fixed12.unpack import UnpackConfig
    from glyd.kernels.tiered.unpack import TieredUnpackConfig

    w = random_weights(4, 64, "normal")
    own = {"fixed12": UnpackConfig(), "tiered": TieredUnpackConfig(), "dense11": Dense11UnpackConfig()}
    for layout, cfg in own.items():
        p = glyd.pack(w, layout)
        for bad in [c for c in own.values() if c is not cfg] + [GemvConfig(), {}]:
            with pytest.raises(TypeError, match=f"config.*{type(cfg).__name__}.*{type(bad).__name__}"):
                kernels.unpack(p, None, bad)


#: Each layout's arrays the GPU kernels read through a pointer (``base``: one element, always contiguous).
_STRIDED = {"fixed12": ("lo", "code", "exc_idx", "exc_hi"), "tiered": ("sm", "d1", "table", "esc_base", "esc_off",
                                                                      "area")}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_strided_arrays_refused_by_name(device, layout):
    # an array of the right shape and dtype as a strided view (every other element of a wider tensor):
    # the codec reads it right, the kernels read it as one contiguous array (other rows' bytes, other
    # digits: wrong weights and products, no error) before this check
    from glyd import kernels
    from glyd.errors import FormatError

    w = random_weights(5, 1100, "wide")  # fixed12 exceptions, tiered escape areas
    p = glyd.pack(w, layout).to(device)
    x = torch.randn(2, 1100).to(torch.bfloat16).to(device)
    for name in _STRIDED[layout]:
        t = p.arrays[name]
        big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=device)
        big[..., ::2] = t
        bad = glyd.Packed(layout, p.shape, dict(p.arrays, **{name: big[..., ::2]}))
        assert torch.equal(glyd.unpack(bad.to("cpu")).view(torch.int16), w.view(torch.int16))
        with pytest.raises(FormatError, match=f"{layout} array '{name}' must be contiguous"):
            kernels.unpack(bad)
        with pytest.raises(FormatError, match=f"{layout} array '{name}' must be contiguous"):
            kernels.linear(x, bad)


@pytest.mark.parametrize("device", DEVICES)
def test_fixed12_words_at_an_unaligned_offset_refused_by_name(device):
    # a contiguous 'lo' or 'code' starting 1-3 bytes into its storage (a view of a byte buffer): the codec
    # reads it; the products' launchers view both as int32 words and raised torch's RuntimeError (storage
    # offset not divisible by 4) from inside kernels.linear before this check (found by the dense11 v3
    # campaign, which fixed the same in dense11's kernels)
    from glyd import kernels
    from glyd.errors import FormatError

    w = random_weights(5, 1100, "wide")
    p = glyd.pack(w, "fixed12").to(device)
    x = torch.randn(2, 1100).to(torch.bfloat16).to(device)
    for name in ("lo", "code"):
        t = p.arrays[name]
        for off in (1, 2, 3):
            buf = torch.zeros(t.numel() + 4, dtype=t.dtype, device=device)
            bad = glyd.Packed("fixed12", p.shape, dict(p.arrays, **{name: buf[off:off + t.numel()].view(t.shape)}))
            bad.arrays[name].copy_(t)
            assert torch.equal(glyd.unpack(bad.to("cpu")).view(torch.int16), w.view(torch.int16))
            for fn in (lambda: kernels.unpack(bad), lambda: kernels.linear(x, bad)):
                with pytest.raises(FormatError, match=f"fixed12 array '{name}' must start at a 4-byte aligned"):
                    fn()


def _inf_padding(layout: str):
    """A 4 x 1000 matrix of 2^113 whose padding columns (1000..1023) decode to +inf and the codec's
    matrix is unchanged: fixed12 at base 120 with padding code 7 and lo 0x80 (exponent 255); tiered with
    the unused table entry of rank 1 made 255 and padding digit 1."""
    w = torch.full((4, 1000), 2.0**113).to(torch.bfloat16)  # hi & 0x7F = 120
    p = glyd.pack(w, layout)
    a = {name: t.clone() for name, t in p.arrays.items()}
    n, kp = a["lo" if layout == "fixed12" else "sm"].shape
    if layout == "fixed12":
        codes = torch.zeros(n, kp, dtype=torch.uint8)  # base 120: the weights are code 0
        codes[:, 1000:] = 7
        g = codes.view(n, kp // 64, 2, 32)
        a.update(code=(g[:, :, 0] | (g[:, :, 1] << 4)).reshape(n, kp // 2), base=torch.tensor([120], dtype=torch.uint8))
        a["lo"][:, 1000:] = 0x80
    else:
        digits = torch.zeros(n, kp, dtype=torch.uint8)
        digits[:, 1000:] = 1
        q = digits.view(n, kp // 64, 4, 16)
        a["d1"] = (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(n, kp // 4)
        a["table"][1] = 255
    return w, glyd.Packed(layout, p.shape, a)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_padding_that_decodes_to_inf_refused(device, layout):
    # the codec dropped the padding and took any bytes there, but the fused GEMV multiplies the padding
    # by x's masked zeros: 0 * inf made every product NaN while the codec's matrix was finite; now the
    # codec and the kernels refuse it (CorruptError naming the padding)
    from glyd import kernels
    from glyd.errors import CorruptError

    w, bad = _inf_padding(layout)
    with pytest.raises(CorruptError, match="padding"):
        glyd.unpack(bad)
    bad = bad.to(device)
    with pytest.raises(CorruptError, match="padding"):
        kernels.unpack(bad)
    with pytest.raises(CorruptError, match="padding"):
        kernels.linear(torch.full((1, 1000), 1e-30, dtype=torch.bfloat16, device=device), bad)
