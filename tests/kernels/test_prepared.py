"""Per-matrix data derived once (exception values, checked offsets) is made again when any array it
was derived from changes in place: ``load_state_dict`` copies one buffer at a time, so a matrix whose
``exc_hi`` or ``lo`` alone changed must not decode with the old exception values."""

from __future__ import annotations

import pytest
import torch

import glyd
from glyd.kernels import _common as C

from .conftest import DEVICES, needs_triton, random_weights

pytestmark = needs_triton


def test_cached_is_made_again_when_a_source_changes():
    key, src = torch.zeros(3), torch.zeros(2)
    made = []
    get = lambda: C.cached(key, lambda: made.append(1) or len(made), (key, src))  # noqa: E731
    assert get() == 1 and get() == 1
    src.add_(1)  # only a source changed
    assert get() == 2 and get() == 2
    key.add_(1)
    assert get() == 3
    other = torch.zeros(2)  # a source replaced by another tensor: its id differs
    assert C.cached(key, lambda: made.append(1) or len(made), (key, other)) == 4


def _mutate(p, layout):
    # A change of one exception's true bits in one array only (the key arrays keep their versions).
    a = p.arrays
    if layout == "fixed12":
        a["exc_hi"][0] ^= 1  # sign/exponent byte of the first exception
    else:
        a["exc_exp"][0] ^= 1
    return p


@pytest.mark.parametrize("layout", ["fixed12", "dense11"])
@pytest.mark.parametrize("device", DEVICES)
def test_unpack_sees_an_exception_changed_in_place(layout, device):
    from glyd import kernels

    w = random_weights(6, 130, "wide")
    p = glyd.pack(w, layout).to(device)
    key = "exc_hi" if layout == "fixed12" else "exc_exp"
    assert p.arrays[key].numel() > 0, "wide weights have exceptions"
    assert torch.equal(kernels.unpack(p).cpu().view(torch.int16), w.view(torch.int16))  # caches the data
    _mutate(p, layout)
    want = glyd.unpack(p.to("cpu"))  # the CPU codec reads the arrays as they are now
    assert not torch.equal(want.view(torch.int16), w.view(torch.int16))
    assert torch.equal(kernels.unpack(p).cpu().view(torch.int16), want.view(torch.int16))


def test_cached_is_made_again_when_a_freed_source_leaves_its_id_to_another(monkeypatch):
    # CPython gives a freed tensor's id to the next one made: a source replaced that way (one array of a
    # matrix reassigned, the key array kept) had the old one's id and version 0, and the old prepared data
    # (a fixed12 matrix's exception values, read by the rows kernel and every unpack) was taken for it
    key = torch.zeros(3)
    made = []
    src = torch.zeros(2)
    assert C.cached(key, lambda: made.append(1) or len(made), (key, src)) == 1
    old = id(src)
    del src
    new = torch.ones(2)
    for _ in range(100):  # (usually the first try)
        if id(new) == old:
            break
        new = torch.ones(2)
    else:  # CPython gave the slot to another object: the module sees the old id, the same case
        real = id
        monkeypatch.setattr(C, "id", lambda o: old if o is new else real(o), raising=False)
    assert getattr(C, "id", id)(new) == old
    assert C.cached(key, lambda: made.append(1) or len(made), (key, new)) == 2


def _relabelled(layout):
    """(packed matrix, the same arrays under another format version or true width): dense11 version 3
    read as 2 and 1 (its block-wise words land in the padding columns), each layout's width moved inside
    its 64-column padding (real weights land there). The codec refuses each."""
    w = random_weights(3, 70, "wide")
    if layout == "dense11":
        from glyd.codec.dense11 import pack_v3

        p = pack_v3(w)
        return p, [(f"version {v}", glyd.Packed(layout, p.shape, p.arrays, v)) for v in (2, 1)] + \
            [("width 66", glyd.Packed(layout, (3, 66), p.arrays, 3))]
    p = glyd.pack(w, layout)
    return p, [("width 66", glyd.Packed(layout, (3, 66), p.arrays, p.version))]


@pytest.mark.parametrize("layout", ["fixed12", "tiered", "dense11"])
@pytest.mark.parametrize("device", DEVICES)
def test_the_same_arrays_under_another_version_or_shape_are_prepared_again(layout, device):
    # The prepared data was keyed on the arrays only: a Packed over the very tensors of one the kernels had
    # prepared, with another format version (dense11 3 -> 2 or 1) or width, took the other matrix's checks,
    # offsets and exception values (wrong weights and products, no error, where the codec refuses it)
    from glyd import kernels
    from glyd.errors import CorruptError

    p, others = _relabelled(layout)
    p = p.to(device)
    x = torch.ones(1, 70, dtype=torch.bfloat16, device=device)
    for what, q in others:
        with pytest.raises(CorruptError):
            glyd.unpack(q)
        q = glyd.Packed(layout, q.shape, p.arrays, q.version)  # over the device's tensors
        kernels.unpack(p), kernels.linear(x, p)  # prepares p's data
        with pytest.raises(CorruptError):
            kernels.unpack(q)
        with pytest.raises(CorruptError):
            kernels.linear(x[:, : q.shape[1]], q)
        assert torch.equal(kernels.unpack(p).cpu().view(torch.int16), glyd.unpack(p.to("cpu")).view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
def test_unsorted_exception_indices_raise_before_a_fused_product(device):
    # exc_idx must be strictly increasing (the row pointers find each row's exceptions by bisection): two entries
    # swapped, every index still inside the matrix, gave a wrong product silently (4 of 128 outputs off by up to 64,
    # 2026-12-06) where the torch twin raised; now the fused kernels' prepare raises too, naming the array
    from glyd import kernels
    from glyd.errors import CorruptError

    w = random_weights(64, 256, "normal")
    w.view(-1)[torch.randperm(w.numel())[:40]] = 30.0  # far above the window: exceptions with big corrections
    p = glyd.pack(w, "fixed12")
    for name in ("exc_idx", "exc_hi"):
        a = p.arrays[name]
        a[[0, -1]] = a[[-1, 0]].clone()
    p = p.to(device)
    x = torch.randn(2, 256).to(torch.bfloat16).to(device)
    with pytest.raises(CorruptError, match="exc_idx"):
        kernels.linear(x, p, None)


@pytest.mark.parametrize("device", DEVICES)
def test_an_experts_unsorted_exception_indices_raise(device):
    # the same for packed experts: each expert's list strictly increasing (here the first expert's two first swapped)
    from glyd.codec import fixed12
    from glyd.errors import CorruptError
    from glyd.kernels.fixed12.experts import prepare
    from glyd.ops.experts import pack_experts

    w = torch.stack([random_weights(32, 128, "normal") for _ in range(3)])
    w.view(-1)[torch.randperm(w.numel())[:60]] = 30.0
    p = pack_experts(w, "fixed12")
    a, b = p.arrays["exc_idx"], p.arrays["exc_hi"]
    starts = p.starts[fixed12.ARRAYS.index("exc_idx")]
    assert starts[1] - starts[0] >= 2  # the first expert has two to swap
    a[[0, 1]] = a[[1, 0]].clone()
    b[[0, 1]] = b[[1, 0]].clone()
    with pytest.raises(CorruptError, match="exc_idx"):
        prepare(p.to(device))
