"""State glyd keeps past a call (caches, reused buffers) is made outside CUDA graph pools
(``glyd.kernels._common.persistent``): CUDA graph trees' warm-up routes every allocation of its
thread into the graphs' pool and raises on any live block there that is not an output (issue 38)."""

from __future__ import annotations

import threading

import pytest
import torch

from glyd.kernels import _common as C

CPU = torch.device("cpu")


def test_persistent_runs_inline_on_the_cpu():
    seen = []
    assert C.persistent(CPU, lambda: seen.append(threading.get_ident()) or 7) == 7
    assert seen == [threading.get_ident()]
    assert not C._off_thread(CPU)
    assert not C._off_thread(torch.device("meta"))


def test_in_thread_runs_make_on_another_thread_and_gives_back_its_value():
    seen = {}

    def make():
        seen["thread"] = threading.get_ident()
        seen["inside"] = getattr(C._LOCAL, "inside", False)
        seen["grad"] = torch.is_grad_enabled()
        seen["nested"] = C._off_thread(torch.device("cuda"))  # a nested call runs inline
        return torch.arange(3)

    out = C._in_thread(make, CPU)
    assert out.tolist() == [0, 1, 2]
    assert seen["thread"] != threading.get_ident()
    assert seen["inside"] and not seen["grad"] and not seen["nested"]
    assert not getattr(C._LOCAL, "inside", False)  # the caller's thread is not marked


def test_in_thread_raises_makes_own_exception_in_the_caller():
    err = ValueError("the exception index holds indices outside the matrix")

    def make():
        raise err

    with pytest.raises(ValueError) as info:
        C._in_thread(make, CPU)
    assert info.value is err


@pytest.fixture
def routed(monkeypatch):
    """Every ``persistent`` call recorded (and run inline); fresh scratch and counter buffers."""
    calls = []

    def record(device, make):
        calls.append(device)
        return make()

    monkeypatch.setattr(C, "persistent", record)
    monkeypatch.setattr(C, "_SCRATCH", {})
    monkeypatch.setattr(C, "_COUNTERS", {})
    monkeypatch.setattr(C, "_CAPTURED_SCRATCH", {})
    return calls


def test_scratch_and_counters_allocate_through_persistent_only_when_they_grow(routed):
    a = C.scratch(CPU, 100)
    assert a.numel() == 100 and len(routed) == 1
    C.scratch(CPU, 50)  # fits: reused
    assert len(routed) == 1
    C.scratch(CPU, 1000)
    assert len(routed) == 2
    c = C.counters(CPU, 4)
    assert int(c.count_nonzero()) == 0 and len(routed) == 3
    C.counters(CPU, 4)
    assert len(routed) == 3


def test_cached_and_exception_tiles_make_through_persistent_on_a_miss_only(routed):
    key = torch.zeros(4)
    assert C.cached(key, lambda: "made") == "made"
    assert C.cached(key, lambda: "again") == "made" and len(routed) == 1
    key.add_(1)  # changed in place: made again
    assert C.cached(key, lambda: "again") == "again" and len(routed) == 2

    class Owner:
        pass

    owner = Owner()
    pos = torch.tensor([1, 9, 4], dtype=torch.int64)
    vals = torch.tensor([5, 6, 7], dtype=torch.int16)
    ptr, p, v = C.exception_tiles(owner, "t", pos, vals, pos // 4, 3)
    assert ptr.tolist() == [0, 1, 2, 3] and p.tolist() == [1, 4, 9] and v.tolist() == [5, 7, 6]
    C.exception_tiles(owner, "t", pos, vals, pos // 4, 3)
    assert len(routed) == 3


def test_a_scratch_buffer_a_capture_was_handed_outlives_its_growth(routed, monkeypatch):
    # a graph replays into the buffer it captured: freed when scratch grows, it would be another
    # tensor's memory (silently wrong products)
    first = C.scratch(CPU, 64)
    monkeypatch.setattr(C, "_capturing", lambda device: True)
    assert C.scratch(CPU, 32).data_ptr() == first.data_ptr()
    monkeypatch.setattr(C, "_capturing", lambda device: False)
    grown = C.scratch(CPU, 4096)
    assert grown.data_ptr() != first.data_ptr()
    assert list(C._CAPTURED_SCRATCH) == [first.data_ptr()]  # kept, not freed
    C.scratch(CPU, 8192)  # never captured: not kept
    assert list(C._CAPTURED_SCRATCH) == [first.data_ptr()]


def _in_pool(pool, t: torch.Tensor) -> bool:
    ptr = t.data_ptr()
    return any(s["address"] <= ptr < s["address"] + s["total_size"] for s in pool.snapshot())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_persistent_allocations_stay_outside_a_thread_routed_pool_gpu():
    import glyd
    from glyd import kernels

    dev = torch.device("cuda")
    w = (torch.randn(256, 512, device=dev) * 0.02).to(torch.bfloat16)
    w[3, 7] = 1e-30  # far below the matrix's exponent window: an exception
    p = glyd.pack(w, layout="fixed12")
    assert p.arrays["exc_idx"].numel() >= 1
    x = torch.randn(8, 512, device=dev).to(torch.bfloat16)
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):  # the routing CUDA graph trees' warm-up uses (by thread)
        inside = torch.empty(1 << 20, device=dev)
        kept = C.persistent(dev, lambda: torch.empty(1 << 20, device=dev))
        scratch = C.scratch(dev, 1 << 26)  # larger than any before: a new buffer
        kernels.prepare(p)  # the fixed12 exception index
        prep = C._CACHE[id(p.arrays["exc_idx"])][2]
        y = kernels.linear(x, p)
    torch.cuda.synchronize()
    assert _in_pool(pool, inside)
    assert not _in_pool(pool, kept) and not _in_pool(pool, scratch)
    assert not any(_in_pool(pool, t) for t in (prep.rowptr, prep.pos, prep.vals))
    again = kernels.linear(x, p)  # outside the pool: the same bits
    assert torch.equal(y.view(torch.int16), again.view(torch.int16))
