"""Property tests: any shape, any value distribution, bit-exact."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import glyd

shapes = st.tuples(st.integers(1, 40), st.integers(1, 700))


@st.composite
def matrices(draw):
    n, k = draw(shapes)
    kind = draw(st.sampled_from(["normal", "bits", "narrow", "mixed", "sparse"]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        std = draw(st.sampled_from([1e-30, 1e-4, 0.02, 1.0, 1e20]))
        return (torch.randn(n, k, generator=g) * std).to(torch.bfloat16)
    if kind == "bits":  # any 16-bit pattern at all
        return torch.randint(-32768, 32768, (n, k), generator=g, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    if kind == "narrow":  # few exponents
        e = torch.randint(0, draw(st.integers(1, 4)), (n, k), generator=g) + draw(st.integers(1, 250))
        m = torch.randint(0, 256, (n, k), generator=g)
        s = torch.randint(0, 2, (n, k), generator=g)
        return ((s << 15) | (e.clamp(max=255) << 7) | (m & 0x7F)).to(torch.int32).to(torch.int16).view(torch.bfloat16)
    if kind == "sparse":
        w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
        return w * (torch.rand(n, k, generator=g) < 0.1)
    # mixed: normal weights with a sprinkle of arbitrary patterns (exceptions everywhere)
    w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16).view(torch.int16)
    noise = torch.randint(-32768, 32768, (n, k), generator=g, dtype=torch.int32).to(torch.int16)
    pick = torch.rand(n, k, generator=g) < draw(st.sampled_from([0.001, 0.05, 0.5]))
    return torch.where(pick, noise, w).view(torch.bfloat16)


@settings(max_examples=150, deadline=None)
@given(w=matrices(), layout=st.sampled_from(["fixed12", "tiered"]))
def test_roundtrip_is_bit_exact(w, layout):
    p = glyd.pack(w, layout=layout)
    assert torch.equal(glyd.unpack(p).view(torch.int16), w.view(torch.int16))


@settings(max_examples=40, deadline=None)
@given(w=matrices())
def test_pack_is_deterministic(w):
    for layout in ("fixed12", "tiered"):
        a, b = glyd.pack(w, layout), glyd.pack(w.clone(), layout)
        assert a.arrays.keys() == b.arrays.keys()
        assert all(torch.equal(a.arrays[k], b.arrays[k]) for k in a.arrays)
