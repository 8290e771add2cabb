"""Rows sorted by expert once (an MoE block's shared routing): the route kernel (glyd.kernels.experts_route)
against torch.sort, each family's product of sorted rows (linear(..., offs=)) against its unsorted
product bit for bit, the choice of the families that sort, a captured sorted product on the GPU."""

from __future__ import annotations

import pytest
import torch

from .conftest import DEVICES, needs_triton
from .test_experts_kernels import _check, _experts

pytestmark = needs_triton


def _sorted_cases():
    from glyd.kernels.experts import ExpertsGroupedConfig, ExpertsLoopConfig
    from glyd.kernels.fixed12.experts import ExpertsGemvConfig
    from glyd.kernels.fixed12.experts_mma import ExpertsMmaConfig

    return [ExpertsGroupedConfig(groups=4), ExpertsGroupedConfig(max_scratch_bytes=2 * 24 * 128 * 2, groups=4),
            ExpertsGroupedConfig(max_scratch_bytes=1000), ExpertsLoopConfig(), ExpertsGemvConfig(bn=32),
            ExpertsMmaConfig()]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(6))
def test_rows_sorted_once_give_each_familys_rows_bit_for_bit(device, case):
    # linear(..., offs=): rows sorted by expert beforehand (an MoE block's shared routing) give every
    # family's rows of the unsorted call, bit for bit, in the sorted order: the unpack + grouped GEMM
    # (whole, in chunks, the loop past its bound) skips its own sort; the others take them as any rows
    from glyd.kernels import experts as kernels
    from glyd.ops.experts import pack_experts, route

    cfg = _sorted_cases()[case]
    torch.manual_seed(20 + case)
    e, n, k, s = 5, 24, 128, 40
    w = _experts(e, n, k, device)
    p = pack_experts(w, "fixed12")
    x = torch.randn(s, k).to(torch.bfloat16).to(device)
    ids = (torch.randint(0, e, (s,)) % (e - 1)).to(device)  # expert e - 2 has rows, e - 1 none
    order, sids, offs, _ = route(ids, e)
    want = kernels.linear(x, ids, p, cfg)
    got = kernels.linear(x.index_select(0, order), sids, p, cfg, offs=offs)
    assert torch.equal(got.view(torch.int16), want[order].view(torch.int16))
    _check(got, x[order], sids, w)


def test_sorted_rows_are_checked_by_their_ends_and_their_offsets_by_shape():
    from glyd.kernels import experts as kernels
    from glyd.ops.experts import pack_experts, route

    p = pack_experts(_experts(3, 8, 64, "cpu"), "fixed12")
    x = torch.randn(4, 64).to(torch.bfloat16)
    order, sids, offs, _ = route(torch.tensor([0, 2, 1, 1]), 3)
    with pytest.raises(RuntimeError, match="ids outside the experts"):
        kernels.linear(x, torch.tensor([0, 1, 1, 3]), p, offs=offs)
    with pytest.raises(RuntimeError, match="ids outside the experts"):
        kernels.linear(x, torch.tensor([-1, 1, 1, 2]), p, offs=offs)
    with pytest.raises(ValueError, match=r"offs must be an int32 \[3\]"):
        kernels.linear(x, sids, p, offs=offs[:2])
    with pytest.raises(ValueError, match=r"sorted rows take x \[S, K\]"):
        kernels.linear(x.reshape(2, 2, 64), sids.reshape(2, 2), p, offs=offs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("s,e,group,kind", [(0, 4, 1, "random"), (1, 1, 1, "random"), (37, 5, 1, "int32"),
                                            (2500, 128, 8, "random"), (300, 8, 2, "one"), (50, 6, 1, "outside")])
def test_the_route_kernel_sorts_rows_as_torch_sort(device, s, e, group, kind):
    # one launch: the stable order, the sorted ids, the offsets and the tokens torch.sort and
    # torch.searchsorted give (the twin); ids outside the experts first (below) or last (above)
    from glyd.kernels.experts_route import route
    from glyd.ops import experts as ops

    g = torch.Generator().manual_seed(s + e)
    ids = torch.randint(0, e, (s,), generator=g)
    if kind == "one":
        ids.fill_(e - 1)
    ids = ids.to(torch.int32 if kind == "int32" else torch.int64)
    if kind == "outside":
        ids[[3, 9]], ids[[4, 20]] = torch.tensor([e, e + 3]), torch.tensor([-1, -7])
    got = [t.cpu() for t in route(ids.to(device), e, group)]
    assert got[0].dtype == got[3].dtype == torch.int64 and got[1].dtype == ids.dtype and got[2].dtype == torch.int32
    assert got[4].tolist() == [kind != "outside"]  # the flag: every id one of the experts
    if kind == "outside":  # the bad rows at the ends in row order, the others as torch sorts them
        assert got[0][:2].tolist() == [4, 20] and got[0][-2:].tolist() == [3, 9]
        assert got[1][0] < 0 and got[1][-1] >= e
        good = (ids >= 0) & (ids < e)
        want = ops._route_torch(torch.where(good, ids, torch.where(ids < 0, -1, e)), e, group)
    else:
        want = ops._route_torch(ids, e, group)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2]) and torch.equal(got[3], want[3])
    if kind != "outside":
        assert torch.equal(got[1], want[1])


def test_sorts_rows_names_the_families_that_sort():
    from glyd.kernels import experts as kernels

    cpu = torch.device("cpu")
    sorts = lambda rows, k=128, layout="fixed12": kernels.sorts_rows(layout, (3, 24, k), rows, cpu)  # noqa: E731
    assert sorts(2049) and sorts(5000)  # the unpack + grouped GEMM
    assert not sorts(16) and not sorts(2048) and not sorts(0)  # the GEMV, the MMA
    assert not sorts(5000, k=96) and not sorts(5000, layout="tiered")  # K padded: the loop; tiered: the loop


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_captured_sorted_product_follows_new_ids_on_gpu():
    # route + the sorted grouped product in one CUDA graph: every replay sorts the rows it finds then
    # and equals the eager unsorted product's rows bit for bit (ids outside the experts: NaN rows)
    from glyd.kernels import experts as kernels
    from glyd.ops.experts import pack_experts, route

    torch.manual_seed(31)
    e, n, k, s = 16, 96, 256, 3000
    w = _experts(e, n, k, "cuda")
    p = pack_experts(w, "fixed12")
    x = torch.randn(s, k).to(torch.bfloat16).cuda()
    ids = torch.randint(0, e, (s,), device="cuda")

    def step():
        order, sids, offs, _ = route(ids, e)
        return order, kernels.linear(x.index_select(0, order), sids, p, offs=offs)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm: compiled, prepared
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        order, y = step()
    for seed, routing in ((1, "random"), (2, "half"), (3, "outside")):
        g = torch.Generator().manual_seed(seed)
        new = torch.randint(0, e, (s,), generator=g)
        if routing == "half":
            new = new % (e // 2) * 2
        if routing == "outside":
            new[5], new[-1] = e, -1
        ids.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        back = torch.empty_like(y).index_copy_(0, order, y)
        good = (new >= 0) & (new < e)
        if routing == "outside":
            assert torch.isnan(back.cpu()[~good]).all()
            _check(back.cpu()[good], x.cpu()[good], new[good], w)
            continue
        eager = kernels.linear(x, ids, p)
        assert torch.equal(back.view(torch.int16), eager.view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("plans", [False, True])
def test_strided_offs_give_the_bits_of_contiguous_ones(device, plans):
    # The experts unpack read offs as one contiguous int32 [E] array: a strided view (every other
    # element of a longer tensor) skipped experts that had rows, and the grouped GEMM multiplied
    # them by what the scratch held before (another tensor's experts): wrong values, no error. With
    # plans on, a kept plan made for contiguous offs took the strided ones too (its key held offs'
    # shape, not its strides).
    from glyd.kernels import _plan
    from glyd.kernels import experts as kernels
    from glyd.ops.experts import pack_experts, route

    torch.manual_seed(5)
    e, n, k, s = 6, 128, 64, 2100  # rows past 2048: the unpack + grouped GEMM
    p = pack_experts(_experts(e, n, k, device), "fixed12")
    other = pack_experts(_experts(e, n, k, device), "fixed12")
    x = torch.randn(s, k).to(torch.bfloat16).to(device)
    order, sids, offs, _ = route(torch.randint(0, e, (s,)).to(device), e)
    xs = x.index_select(0, order)
    _plan.set_enabled(plans)
    try:
        want = kernels.linear(xs, sids, p, offs=offs)
        big = torch.zeros(2 * e, dtype=torch.int32, device=device)
        big[::2] = offs
        for _ in range(2):
            kernels.linear(xs, sids, other, offs=offs)  # the scratch holds other's experts
            got = kernels.linear(xs, sids, p, offs=big[::2])
            assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    finally:
        _plan.set_enabled(None)


def test_route_refuses_rows_whose_chunk_loop_would_pass_2_31():
    # The kernel walks the rows in int32 chunks: for S past 2**31 - chunk its last step (s0 + CH) wrapped
    # negative and the loop ran on at negative rows (reads and writes outside the tensors). Refused by
    # name first, with nothing allocated (meta ids).
    from glyd.kernels.experts_route import CHUNK, route

    for s in (2**31 - 1, 2**31 - CHUNK + 1):
        with pytest.raises(ValueError, match="ids has"):
            route(torch.empty(s, dtype=torch.int32, device="meta"), 8)
    with pytest.raises(ValueError, match="ids has"):
        route(torch.empty(2**31 - 64 + 1, dtype=torch.int32, device="meta"), 8, chunk=64)
