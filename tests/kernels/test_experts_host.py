"""The host work of an MoE block on the prompt path (rows past 2048: route, unpack + grouped GEMM): its
Triton launches through kept ``glyd.kernels._plan`` launches (Triton's binder for none of them once
recorded), the preparation for a capture once a packed experts tensor, the sorted product's plan
(no check of the packed arrays again), bits unchanged. CPU, Triton's interpreter: a recorded fast
launch is a stand-in that counts (the interpreter compiles nothing to record)."""

from __future__ import annotations

import pytest
import torch

from .conftest import HAS_CUDA, needs_triton
from .test_experts_kernels import _experts

pytestmark = needs_triton
#: The CPU tests count the interpreter's launches (the GPU test below counts the fast ones).
cpu_only = pytest.mark.skipif(HAS_CUDA, reason="counts the interpreter's launches; the gpu test runs here")

E, K, N_UP, ROWS, TOP_K = 6, 64, 128, 2100, 2  # rows past 2048: the unpack + grouped GEMM


@pytest.fixture
def ops_on_cpu():
    """The experts ops' CUDA implementations (glyd.kernels) for CPU tensors, plans on and empty (route's kept
    launches too: they are kept a problem, not a matrix, so ``_plan.set_enabled`` leaves them; one recorded by an
    earlier test of the same rows made the binder counts below depend on the order)."""
    from glyd.kernels import _plan, experts_route
    from glyd.ops import experts as ops

    lib = torch.library.Library("glyd", "IMPL")  # noqa: TOR901 - destroyed below
    lib.impl("experts_linear", ops._experts_linear_cuda, "CPU")
    lib.impl("experts_linear_sorted", ops._experts_linear_sorted_cuda, "CPU")
    lib.impl("experts_route", ops._experts_route_cuda, "CPU")
    _plan.set_enabled(True)
    experts_route._LAUNCHES.clear()
    try:
        yield ops
    finally:
        _plan.set_enabled(None)
        experts_route._LAUNCHES.clear()
        lib._destroy()


class _Counts:
    """Every Triton launch (the interpreter's ``run``) and those a recorded fast launch took."""

    def __init__(self, monkeypatch):
        from triton.runtime.interpreter import InterpretedFunction

        from glyd.kernels import _plan

        self.triton = self.fast = 0
        real_run = InterpretedFunction.run

        def run(fn, *a, **kw):
            self.triton += 1
            return real_run(fn, *a, **kw)

        counts = self

        class Fast:  # what _plan._record gives on a GPU: counted, then the interpreter runs the launch
            def launch(self, vals, stream):
                counts.fast += 1
                return False

        monkeypatch.setattr(InterpretedFunction, "run", run)
        monkeypatch.setattr(_plan, "_record", lambda *a: Fast())

    def binder(self) -> int:
        """Launches that went through Triton's binder (no recorded fast launch)."""
        return self.triton - self.fast


def _block(ops, x, ids, up, down):
    # GlydExperts._sorted_products' launches: route once, both products on the sorted rows, put back
    order, sids, offs, tokens = torch.ops.glyd.experts_route(ids, E, TOP_K)
    h = torch.ops.glyd.experts_linear_sorted(x.index_select(0, tokens), sids, offs, *ops.experts_args(up))
    y = torch.ops.glyd.experts_linear_sorted(h[:, :K].contiguous(), sids, offs, *ops.experts_args(down))
    return torch.empty_like(y).index_copy_(0, order, y)


def _inputs(seed: int = 0, device: str = "cpu"):
    from glyd.ops.experts import pack_experts

    torch.manual_seed(seed)
    up = pack_experts(_experts(E, N_UP, K, device), "fixed12")
    down = pack_experts(_experts(E, K, K, device), "fixed12")
    x = torch.randn(ROWS // TOP_K, K).to(torch.bfloat16).to(device)
    ids = torch.randint(0, E, (ROWS,)).to(device)
    return x, ids, up, down


@cpu_only
def test_a_prompt_block_takes_no_triton_binder_once_its_launches_are_recorded(ops_on_cpu, monkeypatch):
    # route + two unpacks: Triton's binder at a launch's first two calls (the second records it), none after;
    # the block's bits those of the uncached path (plans off: every launch Triton's own, each call)
    from glyd.kernels import _plan

    x, ids, up, down = _inputs()
    counts = _Counts(monkeypatch)
    per_call = []
    for _ in range(3):
        before = (counts.triton, counts.binder())
        y = _block(ops_on_cpu, x, ids, up, down)
        per_call.append((counts.triton - before[0], counts.binder() - before[1]))
    assert per_call == [(3, 3), (3, 3), (3, 0)], per_call
    _plan.set_enabled(False)
    before = counts.binder()
    off = _block(ops_on_cpu, x, ids, up, down)
    assert counts.binder() - before == 3
    assert torch.equal(y.view(torch.int16), off.view(torch.int16))


@cpu_only
def test_a_kept_sorted_product_checks_no_arrays_and_prepares_once(ops_on_cpu, monkeypatch):
    # the second call of a product: no validation of the packed arrays, no choice, no preparation for a
    # capture (the plan's key holds them); an in-place change of an array: validated and prepared again
    from glyd.kernels import experts as kernels

    x, ids, up, down = _inputs(1)
    packs, prepares = [], []
    real_packed, real_prepare = ops_on_cpu.experts_packed, kernels.ExpertsGroupedKernel.prepare
    monkeypatch.setattr(ops_on_cpu, "experts_packed", lambda *a: packs.append(1) or real_packed(*a))
    monkeypatch.setattr(kernels.ExpertsGroupedKernel, "prepare",
                        classmethod(lambda cls, p, config=None: prepares.append(1) or real_prepare(p, config)))
    first = _block(ops_on_cpu, x, ids, up, down)
    assert (len(packs), len(prepares)) == (2, 2)  # each product once
    again = _block(ops_on_cpu, x, ids, up, down)
    assert (len(packs), len(prepares)) == (2, 2)
    assert torch.equal(first.view(torch.int16), again.view(torch.int16))
    up.arrays["lo"].add_(0)  # the same bits, a new version: the plans go
    _block(ops_on_cpu, x, ids, up, down)
    assert (len(packs), len(prepares)) == (3, 3)


@cpu_only
def test_an_unsorted_prompt_product_prepares_once(ops_on_cpu, monkeypatch):
    # linear() without offs (no plan of its own): _prepare_for_capture once a packed experts tensor,
    # not every call; registry.reset() forgets it with the plans (the choices may change)
    from glyd.kernels import experts as kernels
    from glyd.kernels import registry

    x, ids, up, _ = _inputs(2)
    prepares = []
    real_prepare = kernels.ExpertsGroupedKernel.prepare
    monkeypatch.setattr(kernels.ExpertsGroupedKernel, "prepare",
                        classmethod(lambda cls, p, config=None: prepares.append(1) or real_prepare(p, config)))
    xs = x.repeat_interleave(TOP_K, dim=0)
    a = kernels.linear(xs, ids, up)
    b = kernels.linear(xs, ids, up)
    assert len(prepares) == 1 and torch.equal(a.view(torch.int16), b.view(torch.int16))
    registry.reset()
    kernels.linear(xs, ids, up)
    assert len(prepares) == 2


@cpu_only
def test_a_kept_sorted_product_still_refuses_ids_outside_the_experts(ops_on_cpu):
    # the plan's key holds the arguments' shapes, not their values: ids route() did not check are
    # checked on every call, by name
    from glyd.kernels import experts as kernels
    from glyd.ops.experts import route

    x, ids, up, _ = _inputs(3)
    order, sids, offs, tokens = route(ids, E, TOP_K)
    xs = x.index_select(0, tokens)
    for _ in range(2):  # the second call through the kept plan
        kernels.linear(xs, sids.clone(), up, offs=offs)
    bad = sids.clone()
    bad[-1] = E
    with pytest.raises(RuntimeError, match="ids outside the experts"):
        kernels.linear(xs, bad, up, offs=offs)


@cpu_only
def test_route_launches_are_kept_a_problem_and_bounded(ops_on_cpu, monkeypatch):
    from glyd.kernels import experts_route as kernel

    monkeypatch.setattr(kernel, "MAX_LAUNCHES", 2)
    kernel._LAUNCHES.clear()
    for s in (5, 6, 6, 7):  # the oldest kept goes first
        order, sids, offs, tokens, ok = kernel.route(torch.randint(0, 3, (s,)), 3)
        assert torch.equal(sids, torch.sort(sids).values) and bool(ok)
    assert [k[0] for k in kernel._LAUNCHES] == [6, 7]
    assert [launch.calls for launch in kernel._LAUNCHES.values()] == [2, 1]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_gpu_a_prompt_block_launches_fast_with_the_uncached_bits():
    # on the GPU the block's three Triton launches go through recorded fast launches from their third
    # call, with the bits of the uncached path (plans off); a capture of the block (fast launches in
    # it) replays new routing as an eager call gives it
    from glyd.kernels import _plan
    from glyd.ops import experts as ops

    x, ids, up, down = _inputs(4, "cuda")
    try:
        _plan.set_enabled(False)
        want = _block(ops, x, ids, up, down)
        _plan.set_enabled(True)
        for _ in range(2):
            _block(ops, x, ids, up, down)
        fast, triton = _plan.LAUNCHES
        got = _block(ops, x, ids, up, down)
        assert (_plan.LAUNCHES[0] - fast, _plan.LAUNCHES[1] - triton) == (3, 0)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _block(ops, x, ids, up, down)
        ids.copy_(torch.randint(0, E, (ROWS,), device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), _block(ops, x, ids, up, down).view(torch.int16))
    finally:
        _plan.set_enabled(None)


@cpu_only
def test_a_kept_sorted_product_is_not_taken_for_strided_offs(ops_on_cpu):
    # the op tries the kept plan before linear(): its key holds offs' strides, so a strided view of the
    # same shape (read by the unpack as one array it would skip experts that have rows) misses it
    from glyd.ops.experts import route

    x, ids, up, _ = _inputs(5)
    other = _inputs(6)[2]
    order, sids, offs, tokens = route(ids, E, TOP_K)
    xs = x.index_select(0, tokens)
    for _ in range(2):  # the second call through the kept plan
        want = torch.ops.glyd.experts_linear_sorted(xs, sids, offs, *ops_on_cpu.experts_args(up))
    big = torch.zeros(2 * E, dtype=torch.int32)
    big[::2] = offs
    torch.ops.glyd.experts_linear_sorted(xs, sids, offs, *ops_on_cpu.experts_args(other))  # other's experts in the scratch
    got = torch.ops.glyd.experts_linear_sorted(xs, sids, big[::2], *ops_on_cpu.experts_args(up))
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
