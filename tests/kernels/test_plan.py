"""Launch plans (``glyd.kernels._plan``): the same bits as the uncached path for every family and
layout, a new plan (or a recheck) whenever anything in the key changes, no matrix kept alive, and a
fast launch passes the compiled kernel exactly the arguments Triton's own launch binds."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import glyd
from glyd.codec.dense11 import pack_v1, pack_v2

from .conftest import DEVICES, HAS_CUDA, bits_of as _bits, needs_triton, random_weights

pytestmark = [needs_triton, pytest.mark.usefixtures("plans_on")]


def _forced(monkeypatch, name: str, cfg):
    """The registry chooses family ``name`` with ``cfg`` for every product; the calls are counted."""
    from glyd.kernels import registry

    kc = registry.kernel_class(name)
    calls = []
    monkeypatch.setattr(registry, "choose", lambda problem, device: calls.append(problem) or (kc, cfg))
    return calls


def _family_cases():
    from glyd.kernels import (Dense11GemvConfig, Dense11LongConfig, Dense11V2GemvConfig, Dense11V3GemvConfig,
                              GemvConfig, LongConfig,
                              MmaConfig, TcConfig, TieredGemvConfig, TieredLongConfig, TileConfig)

    # (family, config, layout, N, K, M)
    return [
        ("fixed12_gemv", GemvConfig(bm=2, bn=16, bk=128), "fixed12", 24, 256, 3),  # exceptions in the tile
        ("fixed12_gemv", GemvConfig(bm=1, bn=16, bk=128, split=2), "fixed12", 20, 300, 1),  # split-K, finalize
        ("fixed12_gemv", GemvConfig(bm=2, bn=16, bk=128, exc_pass=True), "fixed12", 24, 256, 2),  # a pass after
        ("fixed12_gemv", GemvConfig(bm=1, bn=16, bk=128, split=2, fixup=True), "fixed12", 16, 256, 1),  # counters
        ("fixed12_word_dot", TcConfig(bm=16, bn=16, bk=128, stages=1, split=2), "fixed12", 24, 256, 3),
        ("fixed12_byte_dot", TileConfig(bm=16, bn=16, bk=128, stages=1), "fixed12", 24, 256, 3),
        ("fixed12_operand_dot", MmaConfig(bm=16, bn=16, g=2, stages=1), "fixed12", 24, 256, 3),
        ("fixed12_unpack_cublas", LongConfig(), "fixed12", 24, 200, 3),
        ("tiered_gemv", TieredGemvConfig(), "tiered", 6, 1024, 2),
        ("tiered_unpack_cublas", TieredLongConfig(), "tiered", 12, 100, 3),
        ("dense11_gemv", Dense11GemvConfig(bn=16, bk=256), "dense11_v1", 12, 1100, 2),  # format version 1
        ("dense11_unpack_cublas", Dense11LongConfig(), "dense11", 12, 100, 3),
        ("dense11_v3_gemv", Dense11V3GemvConfig(bn=16, bk=256, prefetch=True), "dense11", 12, 1100, 1),
        ("dense11_v2_gemv", Dense11V2GemvConfig(bn=16, bk=256), "dense11_v2", 12, 1100, 2),  # format version 2
        ("dense11_unpack_cublas", Dense11LongConfig(), "dense11_v1", 12, 100, 3),
    ]


@pytest.mark.parametrize("case", range(15))
@pytest.mark.parametrize("device", DEVICES)
def test_a_plan_gives_the_uncached_bits_for_every_family(monkeypatch, device, case):
    # The first call makes the plan (the uncached path's work, kept); the next ones run it: the
    # same bits as the uncached path (plans off), and the kernel is chosen once.
    from glyd import kernels
    from glyd.kernels import _plan

    cases = _family_cases()
    assert len(cases) == 15
    name, cfg, layout, n, k, m = cases[case]
    calls = _forced(monkeypatch, name, cfg)
    w = random_weights(n, k, "normal")
    old = {"dense11_v1": pack_v1, "dense11_v2": pack_v2}
    p = (old[layout](w) if layout in old else glyd.pack(w, layout)).to(device)
    x = torch.randn(m, k).to(torch.bfloat16).to(device)
    bias = torch.randn(n).to(torch.bfloat16).to(device)
    _plan.set_enabled(False)
    want = _bits(kernels.linear(x, p, bias))
    _plan.set_enabled(True)
    calls.clear()
    # made, run (its launches recorded), run again (through the compiled kernels: CUDA only)
    for _ in range(3 if device == "cuda" else 2):
        assert torch.equal(_bits(kernels.linear(x, p, bias)), want)
    assert len(calls) == 1 and _plan.count() == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout, name", [("fixed12", "fixed12_unpack_cublas"), ("dense11", "dense11_unpack_cublas")])
def test_an_unpack_cublas_plan_returns_cublas_own_output(monkeypatch, layout, name, device):
    # A kept unpack + cuBLAS plan of one part lets cuBLAS allocate (no separate empty output on the
    # host): same bits as the uncached path, for a 3-D x with and without bias.
    from glyd import kernels
    from glyd.kernels import _plan, registry

    cfg = registry.kernel_class(name).Config()
    _forced(monkeypatch, name, cfg)
    n, k = 12, 100
    p = glyd.pack(random_weights(n, k, "normal"), layout).to(device)
    x = torch.randn(2, 3, k).to(torch.bfloat16).to(device)
    for bias in (None, torch.randn(n).to(torch.bfloat16).to(device)):
        _plan.set_enabled(False)
        want = _bits(kernels.linear(x, p, bias))
        _plan.set_enabled(True)
        kernels.linear(x, p, bias)  # makes the plan
        plans = [pl for e in _plan._ENTRIES.values() for pl in (*e.plans.values(), *(r[3] for r in e.ranged))]
        assert plans and all(pl.makes_out for pl in plans)
        y = kernels.linear(x, p, bias)
        assert y.shape == (2, 3, n) and torch.equal(_bits(y), want)


def _gemv(monkeypatch):
    from glyd.kernels import GemvConfig

    return _forced(monkeypatch, "fixed12_gemv", GemvConfig(bm=2, bn=16, bk=128))


def _uncached(x, p, bias=None):
    from glyd import kernels
    from glyd.kernels import GemvConfig

    return _bits(kernels.linear(x, p, bias, GemvConfig(bm=2, bn=16, bk=128)))  # an explicit config: no plan


def test_each_change_of_the_key_makes_a_new_plan(monkeypatch):
    from glyd import kernels
    from glyd.kernels import _plan

    calls = _gemv(monkeypatch)
    w = random_weights(16, 128, "normal")
    p = glyd.pack(w)
    x = torch.randn(2, 128).to(torch.bfloat16)
    assert torch.equal(_bits(kernels.linear(x, p)), _uncached(x, p))
    kernels.linear(x, p)
    assert (len(calls), _plan.count()) == (1, 1)
    # another matrix of the same shape
    q = glyd.pack(random_weights(16, 128, "normal"))
    assert torch.equal(_bits(kernels.linear(x, q)), _uncached(x, q))
    assert len(calls) == 2
    # x with another row stride, another address modulo 16, another M, more leading dims
    wide = torch.randn(2, 136).to(torch.bfloat16)[:, :128]
    buf = torch.randn(2 * 128 + 1).to(torch.bfloat16)
    odd = buf[1:].view(2, 128)
    assert odd.data_ptr() % 16 != x.data_ptr() % 16
    for xx in (wide, odd, torch.randn(3, 128).to(torch.bfloat16), torch.randn(2, 1, 128).to(torch.bfloat16)):
        before = len(calls)
        assert torch.equal(_bits(kernels.linear(xx, p)).reshape(-1, 16), _uncached(xx, p).reshape(-1, 16))
        assert len(calls) == before + 1
        kernels.linear(xx, p)
        assert len(calls) == before + 1  # and kept
    # a bias added
    bias = torch.randn(16).to(torch.bfloat16)
    before = len(calls)
    assert torch.equal(_bits(kernels.linear(x, p, bias)), _uncached(x, p, bias))
    assert len(calls) == before + 1


def test_a_plan_is_not_used_after_the_arrays_change_in_place(monkeypatch):
    # load_state_dict copies into the buffers (their version counter moves); ``.data =`` swaps the
    # storage (its address moves): either way the next call works out a new plan on the new arrays.
    from glyd import kernels

    calls = _gemv(monkeypatch)
    p = glyd.pack(random_weights(16, 128, "normal"))
    x = torch.randn(2, 128).to(torch.bfloat16)
    first = _bits(kernels.linear(x, p))
    kernels.linear(x, p)
    assert len(calls) == 1
    p.arrays["lo"].add_(3)  # other weights (any low byte is a weight)
    got = _bits(kernels.linear(x, p))
    assert len(calls) == 2 and torch.equal(got, _uncached(x, p)) and not torch.equal(got, first)
    code = p.arrays["code"]
    code.data = code.clone() ^ 0x11  # same tensor object, same version, another storage
    got = _bits(kernels.linear(x, p))
    assert len(calls) == 3 and torch.equal(got, _uncached(x, p))


def test_the_op_and_the_module_use_the_plans(monkeypatch):
    from glyd.kernels import _plan

    calls = _gemv(monkeypatch)
    lin = glyd.GlydLinear(glyd.pack(random_weights(16, 128, "normal")), torch.randn(16).to(torch.bfloat16))
    x = torch.randn(2, 128).to(torch.bfloat16)
    layout, shape, arrays, version = lin._op_args()
    from glyd.ops.backends import cuda

    y = cuda.linear(x, layout, shape, arrays, lin.bias, version)  # the op's CUDA implementation
    assert len(calls) == 1 and _plan.count() == 1
    assert _plan.run(x, layout, shape, arrays, lin.bias, version) is not None
    assert torch.equal(_bits(cuda.linear(x, layout, shape, arrays, lin.bias, version)), _bits(y))
    assert len(calls) == 1
    assert _plan.run(x, layout, shape, arrays, None, version) is None  # no bias: another key
    assert _plan.run(x.to(torch.float16), layout, shape, arrays, lin.bias, version) is None


def test_plans_hold_no_matrix_and_go_with_it(monkeypatch):
    from glyd import kernels
    from glyd.kernels import _plan

    _gemv(monkeypatch)
    p = glyd.pack(random_weights(16, 128, "normal"))
    x = torch.randn(2, 128).to(torch.bfloat16)
    kernels.linear(x, p)
    kernels.linear(x, p)
    assert _plan.count() == 1
    refs = [weakref.ref(a) for a in p.arrays.values()]
    del p
    gc.collect()
    assert all(r() is None for r in refs), "a plan kept the packed arrays alive"
    assert _plan.count() == 0


def test_plans_off_keep_nothing_and_reset_forgets(monkeypatch):
    from glyd import kernels
    from glyd.kernels import _plan, registry

    calls = _gemv(monkeypatch)
    p = glyd.pack(random_weights(16, 128, "normal"))
    x = torch.randn(1, 128).to(torch.bfloat16)
    monkeypatch.setenv("GLYD_PLANS", "0")
    _plan.set_enabled(None)
    from glyd import _env

    _env.settings.cache_clear()
    kernels.linear(x, p)
    kernels.linear(x, p)
    assert len(calls) == 2 and _plan.count() == 0
    _plan.set_enabled(True)
    kernels.linear(x, p)
    assert _plan.count() == 1
    registry.reset()
    assert _plan.count() == 0


def test_plans_a_matrix_are_bounded(monkeypatch):
    from glyd import kernels
    from glyd.kernels import _plan

    _gemv(monkeypatch)
    monkeypatch.setattr(_plan, "MAX_PLANS", 3)
    p = glyd.pack(random_weights(16, 128, "normal"))
    for m in range(1, 6):
        kernels.linear(torch.randn(m, 128).to(torch.bfloat16), p)
    assert _plan.count() == 3  # M = 3, 4, 5: the oldest went first
    assert _plan.run(torch.randn(1, 128).to(torch.bfloat16), *glyd.ops._args(p)[:3], None, p.version) is None
    # and in all: past MAX_TOTAL every plan is forgotten
    monkeypatch.setattr(_plan, "MAX_TOTAL", 4)
    q = glyd.pack(random_weights(16, 128, "normal"))
    kernels.linear(torch.randn(1, 128).to(torch.bfloat16), q)
    assert _plan.count() == 4
    kernels.linear(torch.randn(2, 128).to(torch.bfloat16), q)
    assert _plan.count() == 1


# -- the fast launch, against Triton's own binding of the arguments (no GPU: a stand-in compiled kernel)


def _kern_src():
    import triton.language as tl

    def _kern(x_ptr, c_ptr, n, y_ptr, BLOCK: tl.constexpr, FLAG: tl.constexpr = 0):
        pass

    return _kern


class _Launcher:
    """CUDA's launcher (``CudaLauncher``) for a kernel without scratch: ``__call__`` adds the launch
    flags and passes everything to the C ``launch``, which records here."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self):
        self.launched = []

    def __call__(self, gx, gy, gz, stream, function, *args):
        self.launch(gx, gy, gz, stream, function, self.launch_cooperative_grid, self.launch_pdl, None, None, *args)

    def launch(self, *args):
        self.launched.append(tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args))


class _Compiled:
    def __init__(self):
        self.function = 77
        self.packed_metadata = (4, 1, 0)
        self.run = _Launcher()


@pytest.fixture
def fake_kernel(monkeypatch):
    """A real ``JITFunction`` whose launch compiles nothing: Triton's binder and cache key pick a
    stand-in compiled kernel per specialization, which is launched as ``JITFunction.run`` does."""
    from triton import knobs
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, compute_cache_key, create_function_from_signature

    from glyd.kernels import _plan

    jf = JITFunction(_kern_src())
    binder = create_function_from_signature(jf.signature, jf.params, BaseBackend)
    cache, key_cache = {}, {}
    jf.device_caches[0] = (cache, key_cache, None, None, binder)
    jf.triton_calls = 0

    def run(*args, grid, warmup, **kwargs):
        kwargs["debug"] = kwargs.get("debug", jf.debug) or knobs.runtime.debug
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        bound, spec, options = binder(*args, **kwargs)
        compiled = cache.setdefault(compute_cache_key(key_cache, spec, options), _Compiled())
        g = tuple(grid) + (1, 1)
        compiled.run(g[0], g[1], g[2], 1234, compiled.function, compiled.packed_metadata, None, None, None,
                     *bound.values())
        jf.triton_calls += 1
        return compiled

    jf.run = run
    monkeypatch.setattr(_plan, "_device", lambda: 0)
    monkeypatch.setattr(_plan, "_raw_stream", lambda device: 1234)
    return jf


def test_the_fast_launch_passes_what_triton_passes(fake_kernel):
    # the same call of CUDA's C launch as Triton's own launch makes for the same tensors (a matrix
    # array, ``fixed``, taken once: a kept plan's key holds these arrays)
    from glyd.kernels import _plan

    x, y = _plan.slots(2)
    (arr,) = _plan.slots(1, 2, fixed=True)
    const = torch.zeros(8)
    launch = _plan.Launch(fake_kernel, (3, 2), (x, const, 7, y.view(torch.int32)),
                          dict(BLOCK=16, FLAG=arr, num_warps=4))
    xs = [torch.zeros(64, dtype=torch.bfloat16) for _ in range(2)]
    ys = [torch.zeros(64, dtype=torch.bfloat16) for _ in range(2)]
    matrix = torch.zeros(4, dtype=torch.uint8)
    launch(xs[0], ys[0], matrix)
    launch(xs[1], ys[1], matrix)
    assert fake_kernel.triton_calls == 2 and launch.fast is not None  # recorded at the second
    launch(xs[1], ys[1], matrix)
    assert fake_kernel.triton_calls == 2
    (compiled,) = {id(c): c for c in fake_kernel.device_caches[0][0].values()}.values()
    first, triton, fast = compiled.run.launched
    assert fast == triton and first != triton
    assert fast[:13] == (3, 2, 1, 1234, 77, False, True, None, None, (4, 1, 0), None, None, None)
    assert list(fast[13:]) == [xs[1].data_ptr(), const.data_ptr(), 7, ys[1].data_ptr(), 16, matrix.data_ptr()]


def test_the_fast_launch_steps_aside(fake_kernel):
    # a slot at another 16-byte alignment (Triton specializes on it), a launch hook, FAST off:
    # Triton's own launch (another current device finds another plan: the key holds the device)
    from triton import knobs

    from glyd.kernels import _plan

    (x,) = _plan.slots(1)
    launch = _plan.Launch(fake_kernel, (1,), (x, torch.zeros(4), 5, x), dict(BLOCK=8))
    t = torch.zeros(64, dtype=torch.bfloat16)
    for _ in range(3):
        launch(t)
    assert fake_kernel.triton_calls == 2
    launch(t[1:])
    assert fake_kernel.triton_calls == 3
    assert len(fake_kernel.device_caches[0][0]) == 2  # Triton compiled the other specialization

    def hook(meta):
        pass

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        launch(t)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert fake_kernel.triton_calls == 4
    _plan.FAST[0] = False
    try:
        launch(t)
    finally:
        _plan.FAST[0] = True
    assert fake_kernel.triton_calls == 5
    launch(t)
    assert fake_kernel.triton_calls == 5


def test_the_triton_internals_the_fast_launch_follows():
    # _plan._record and _Fast.launch follow Triton 3.6's JITFunction.run and CudaLauncher.__call__;
    # another Triton must be read again before this passes
    import inspect

    import triton
    from triton.backends.nvidia.driver import CudaLauncher
    from triton.runtime.jit import JITFunction

    run = inspect.getsource(JITFunction.run)
    for line in ('kwargs["debug"] = kwargs.get("debug", self.debug) or knobs.runtime.debug',
                 'kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode',
                 "bound_args, specialization, options = binder(*args, **kwargs)",
                 "key = compute_cache_key(kernel_key_cache, specialization, options)",
                 "kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, launch_metadata,"):
        assert line in run, (triton.__version__, line)
    call = inspect.getsource(CudaLauncher.__call__)
    assert ("self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,\n"
            "                    global_scratch, profile_scratch, *args)") in call
    assert "if size > 0:" in call


def test_no_fast_launch_without_a_compiled_kernel():
    # Triton's interpreter (what the CPU tests run) returns no compiled kernel: every launch stays Triton's
    from glyd.kernels import _plan

    class Interp:
        def __getitem__(self, grid):
            return lambda *a, **k: None

    launch = _plan.Launch(Interp(), (1,), (_plan.Slot(0),), {})
    for _ in range(3):
        launch(torch.zeros(4))
    assert launch.fast is None and launch.calls == 3


# -- on a GPU: the fast launches themselves


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("layout,n,k", [("fixed12", 4608, 3584), ("fixed12", 3584, 18944), ("fixed12", 37888, 3584),
                                        ("tiered", 3584, 3584), ("dense11", 3584, 3584)])
@pytest.mark.parametrize("m", [1, 8, 64])
def test_fast_launches_give_the_uncached_bits_on_the_gpu(layout, n, k, m):
    # The table's choice on the 7B's merged shapes, with 0.1% exceptions (the side-stream pass):
    # plans off, then the plan's first, second (recorded) and fast calls, with and without a bias.
    from glyd import kernels
    from glyd.kernels import _plan

    w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
    w.view(-1)[torch.randint(0, n * k, (n * k // 1000,), device="cuda")] = torch.tensor(1e-30).to(w)
    p = glyd.pack(w, layout)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    for bias in (None, torch.randn(n, device="cuda").to(torch.bfloat16)):
        _plan.set_enabled(False)
        want = kernels.linear(x, p, bias)
        _plan.set_enabled(True)
        before = _plan.LAUNCHES[0]
        for _ in range(4):
            y = kernels.linear(x, p, bias)
            assert torch.equal(y.view(torch.int16), want.view(torch.int16))
        if layout == "fixed12":  # its families at M <= 64 launch through plans (the others call launch)
            assert _plan.LAUNCHES[0] > before  # the last calls went through the compiled kernels


def _gpu_configs():
    from glyd.kernels import GluonConfig, TcConfig, WgConfig, WsConfig

    return [
        GluonConfig(bm=16, bn=64, bk=128, prefetch=True),  # the exceptions' pass on a side stream
        GluonConfig(bm=16, bn=64, bk=128, prefetch=True, exc_after=True, split=4),  # after, then finalize
        GluonConfig(bm=16, bn=64, bk=128, prefetch=True, exc_tile=True, split=4, fixup=True),  # counters
        GluonConfig(bm=64, bn=64, bk=128, prefetch=True, ring=2, ring_x=True, exc_tile=True),
        WgConfig(bm=64, bn=64, exc_tile=False),  # side stream
        WgConfig(bm=16, bn=64, exc_tile=False, exc_after=True, split=4),  # after, finalize
        WgConfig(bm=64, bn=64, exc_tile=True, pipe=True),
        WsConfig(bm=16, bn=64, stages=2),
        WsConfig(bm=64, bn=64, stages=3, maxnreg=80),
        TcConfig(bm=16, bn=32, bk=128, stages=3, exc_pass=True),
    ]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("case", range(10))
@pytest.mark.parametrize("m", [3, 64])
def test_every_launch_path_of_the_planned_families_on_the_gpu(monkeypatch, case, m):
    # Each branch of the planned launchers (side-stream or after pass, finalize, in-kernel split-K,
    # the TMA ring's descriptors, x permuted, an x that must be copied) through plans and fast launches
    from glyd import kernels
    from glyd.kernels import _plan, registry

    cfg = _gpu_configs()[case]
    kc = registry.kernel_for(cfg)
    calls = _forced(monkeypatch, kc.name, cfg)
    w = random_weights(4608, 3584, "normal", "cuda")
    p = glyd.pack(w)
    assert p.arrays["exc_idx"].numel() > 0
    xs = [torch.randn(m, 3584, device="cuda").to(torch.bfloat16),
          torch.randn(m, 3584 + 8, device="cuda").to(torch.bfloat16)[:, 8:]]  # a row stride
    if kc.name in ("fixed12_wgmma", "fixed12_wgmma_warpspec"):  # rows at 8 bytes: a copy of x first
        xs.append(torch.randn(m, 3584 + 4, device="cuda").to(torch.bfloat16)[:, :3584])
    for x in xs:
        for bias in (None, torch.randn(4608, device="cuda").to(torch.bfloat16)):
            _plan.set_enabled(False)
            want = kernels.linear(x, p, bias)
            _plan.set_enabled(True)
            calls.clear()
            fast = _plan.LAUNCHES[0]
            for _ in range(4):
                assert torch.equal(kernels.linear(x, p, bias).view(torch.int16), want.view(torch.int16))
            assert len(calls) == 1 and _plan.LAUNCHES[0] > fast
    refs = [weakref.ref(a) for a in p.arrays.values()]  # no plan keeps the matrix (TMA descriptors included)
    del p, w
    gc.collect()
    assert all(r() is None for r in refs) and _plan.count() == 0
