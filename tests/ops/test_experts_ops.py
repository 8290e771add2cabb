"""The experts ops (glyd::experts_linear, glyd::unpack_experts): schema and fakes, the twin (the
chosen experts unpacked, then F.linear on their rows), errors that name the problem."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from glyd.codec import pack_experts as codec_pack_experts
from glyd.ops import experts as ops


def _experts(e=4, n=12, k=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(e, n, k, generator=g) * 0.02
    w.view(-1)[::53] = 3.0  # far above the window: exceptions
    return w.to(torch.bfloat16)


#: opcheck without its AOT-dispatch check (tens of seconds on 2 cores; the fakes are checked here
#: and by test_fake_shapes_follow_the_inputs).
CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor")


def test_ops_pass_opcheck():
    p = ops.pack_experts(_experts(), "tiered")
    args = ops.experts_args(p)
    x = torch.randn(5, 96).to(torch.bfloat16)
    ids = torch.tensor([3, 0, 3, 1, 2])
    torch.library.opcheck(torch.ops.glyd.experts_linear.default, (x, ids, *args), test_utils=CHECKS)
    torch.library.opcheck(torch.ops.glyd.unpack_experts.default, (*args, torch.tensor([2, 0])), test_utils=CHECKS)


def test_fake_shapes_follow_the_inputs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = ops.experts_args(ops.pack_experts(_experts(), "fixed12"))
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        x = mode.from_tensor(torch.randn(2, 3, 96).to(torch.bfloat16))
        ids = mode.from_tensor(torch.zeros(2, 3, dtype=torch.int64))
        assert torch.ops.glyd.experts_linear(x, ids, *args).shape == (2, 3, 12)
        index = mode.from_tensor(torch.zeros(5, dtype=torch.int64))
        assert torch.ops.glyd.unpack_experts(*args, index).shape == (5, 12, 96)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_twin_is_each_chosen_experts_f_linear(dtype):
    w = _experts()
    p = ops.pack_experts(w, "fixed12")
    x = torch.randn(2, 4, 96).to(dtype)
    ids = torch.tensor([[1, 3, 1, 1], [0, 3, 1, 0]])
    y = ops.experts_linear(x, ids, p)
    assert y.shape == (2, 4, 12) and y.dtype == dtype
    x2, flat = x.reshape(-1, 96), ids.reshape(-1)
    want = torch.empty(8, 12, dtype=dtype)
    for e in flat.unique().tolist():
        rows = (flat == e).nonzero().reshape(-1)
        want[rows] = F.linear(x2[rows], w[e].to(dtype))  # bf16's own product on the same rows
    assert torch.equal(y.reshape(8, 12).view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))


def test_unpack_experts_gives_the_chosen_experts_bit_for_bit():
    w = _experts()
    p = ops.pack_experts(w, "dense11")
    assert torch.equal(ops.unpack_experts(p, [3, 1, 3]).view(torch.int16), w[[3, 1, 3]].view(torch.int16))
    assert torch.equal(ops.unpack_experts(p).view(torch.int16), w.view(torch.int16))


_HAS_CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("device", [
    pytest.param("cpu", marks=pytest.mark.skipif(_HAS_CUDA, reason="CUDA present: the gpu-marked variant runs")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not _HAS_CUDA, reason="needs CUDA")])])
@pytest.mark.parametrize("k", [128, 96])  # one launch for a run of experts (K a multiple of 64); one an expert
def test_the_kernels_unpack_experts_bit_for_bit(k, device):
    # the op's CUDA implementation (on the CPU: called directly, its kernels in Triton's interpreter)
    torch.manual_seed(5)
    w = torch.randn(6, 24, k) * 0.02
    w.view(-1)[torch.randint(0, w.numel(), (30,))] = 4.0  # exceptions
    w = w.to(torch.bfloat16).to(device)
    p = ops.pack_experts(w, "fixed12")
    for index in (None, [1, 2, 3], [5], [3, 1, 3]):
        want = w if index is None else w[index]
        if device == "cuda":
            got = ops.unpack_experts(p, index)
        else:
            got = ops._unpack_experts_cuda(*ops.experts_args(p), torch.tensor(index or list(range(6))))
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_pack_experts_auto_on_the_cpu_is_the_codecs_fixed12():
    w = _experts()
    a, b = ops.pack_experts(w, "auto"), codec_pack_experts(w, "fixed12")
    assert a.layout == "fixed12"
    assert all(torch.equal(a.arrays[k], b.arrays[k]) for k in b.arrays)


def test_bad_arguments_are_named():
    p = ops.pack_experts(_experts(), "fixed12")
    x = torch.randn(3, 96).to(torch.bfloat16)
    with pytest.raises(IndexError, match="expert 4, outside the 4 experts"):
        ops.experts_linear(x, torch.tensor([0, 4, 1]), p)
    with pytest.raises(IndexError, match="expert -1"):
        ops.experts_linear(x, torch.tensor([0, -1, 1]), p)
    with pytest.raises(TypeError, match="ids must be int32 or int64"):
        ops.experts_linear(x, torch.tensor([0.0, 1.0, 1.0]), p)
    with pytest.raises(ValueError, match="one expert a row"):
        ops.experts_linear(x, torch.tensor([0, 1]), p)
    with pytest.raises(ValueError, match="K = 96"):
        ops.experts_linear(torch.randn(3, 95).to(torch.bfloat16), torch.tensor([0, 1, 1]), p)
    with pytest.raises(IndexError, match="expert 7"):
        ops.unpack_experts(p, [7])
    with pytest.raises(TypeError, match="PackedExperts"):
        ops.experts_linear(x, torch.tensor([0, 1, 1]), p.expert(0))


def test_arrays_changed_in_place_are_checked_again():
    p = ops.pack_experts(_experts(), "fixed12")
    args = ops.experts_args(p)
    x, ids = torch.randn(2, 96).to(torch.bfloat16), torch.tensor([0, 1])
    torch.ops.glyd.experts_linear(x, ids, *args)  # validated and remembered
    args[2][-1][0, 0] += 1  # lens: expert 0 claims a row of 'lo' more
    with pytest.raises(ValueError, match="lens gives 49 entries of array 'lo'"):
        torch.ops.glyd.experts_linear(x, ids, *args)


def test_unpack_experts_refuses_an_index_that_is_not_ints():
    # ops.unpack_experts(p, [1.7]) made an int64 tensor of it: expert 1, silently
    p = ops.pack_experts(_experts(), "fixed12")
    with pytest.raises(TypeError, match="expert 1.7 is not an int"):
        ops.unpack_experts(p, [1.7])
    with pytest.raises(TypeError, match="expert True is not an int"):
        ops.unpack_experts(p, [True])


def test_validated_experts_do_not_outlive_their_arrays():
    # the cache of validated experts held each PackedExperts (its arrays, lens too) for good: the entry
    # was to die with lens, which it kept alive itself, so every packed experts tensor ever used stayed
    import gc
    import weakref

    p = ops.pack_experts(_experts(), "fixed12")
    ops.experts_linear(torch.randn(2, 96).to(torch.bfloat16), torch.tensor([0, 3]), p)
    ops.unpack_experts(p, [1])
    refs = [weakref.ref(t) for t in p.arrays.values()]
    del p
    gc.collect()
    assert all(r() is None for r in refs)


def test_route_sorts_the_rows_by_expert_stably():
    ids = torch.tensor([3, 0, 3, 1, 0, 3], dtype=torch.int32)
    order, sids, offs, tokens = ops.route(ids, 5, 2)
    assert order.tolist() == [1, 4, 3, 0, 2, 5] and torch.equal(sids, ids[order])
    assert offs.dtype == torch.int32 and offs.tolist() == [2, 3, 3, 6, 6]  # expert 2 and 4: no rows
    assert tokens.tolist() == [0, 2, 1, 0, 1, 2]
    torch.library.opcheck(torch.ops.glyd.experts_route.default, (ids, 5, 2), test_utils=CHECKS)
    with pytest.raises(TypeError, match="1-D int32 or int64"):
        ops.route(ids.reshape(2, 3), 5)
    with pytest.raises(ValueError, match="at least one expert"):
        ops.route(ids, 0)
    with pytest.raises(IndexError, match="expert 5, outside the 5 experts"):
        ops.route(torch.tensor([0, 5, 1]), 5)


def test_the_sorted_op_is_the_product_of_the_sorted_rows_and_checks_its_routing():
    # glyd::experts_linear_sorted gives experts_linear's rows in the sorted order, bit for bit (its
    # twin is that twin); opcheck and the fake; the twin refuses rows out of order and wrong offsets
    p = ops.pack_experts(_experts(), "fixed12")
    args = ops.experts_args(p)
    x = torch.randn(7, 96).to(torch.bfloat16)
    ids = torch.tensor([3, 0, 3, 1, 2, 0, 3])
    order, sids, offs, _ = ops.route(ids, 4)
    y = ops.experts_linear_sorted(x[order], sids, offs, p)
    assert torch.equal(y.view(torch.int16), ops.experts_linear(x, ids, p)[order].view(torch.int16))
    torch.library.opcheck(torch.ops.glyd.experts_linear_sorted.default, (x[order], sids, offs, *args),
                          test_utils=CHECKS)
    with pytest.raises(ValueError, match="ids must be sorted"):
        ops.experts_linear_sorted(x, ids, offs, p)
    with pytest.raises(ValueError, match="rows of experts <= e"):
        ops.experts_linear_sorted(x[order], sids, offs.flip(0).contiguous(), p)
    with pytest.raises(ValueError, match=r"offs must be an int32 \[4\]"):
        ops.experts_linear_sorted(x[order], sids, offs.long(), p)
    with pytest.raises(IndexError, match="expert 4, outside the 4 experts"):
        bad = torch.tensor([0, 0, 1, 2, 3, 3, 4])
        ops.experts_linear_sorted(x, bad, torch.tensor([2, 3, 4, 6], dtype=torch.int32), p)
    assert ops.sorts_rows(x, 5000, p.layout, p.shape) is False  # CPU tensors: the twin, which sorts nothing
