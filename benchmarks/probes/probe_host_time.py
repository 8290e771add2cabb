#!/usr/bin/env python3
"""Host time of one packed product on CUDA, eager (no CUDA graph), taken apart by stage, with launch
plans (``glyd.kernels._plan``, ``glyd.ops._eager``) off and on.

fixed12 at M = 1, 8, 64 on the Qwen2.5-7B merged shapes (qkv with Qwen's bias), weights with ~0.1%
outside the exponent window (``exc``, real weights have 0.02-0.13%) and without (random normal
weights have almost none), bf16 ``F.linear`` as the reference, all under ``torch.no_grad()`` as a
decode step runs. Host time = wall time of N calls with no sync between them (the GPU idle before
each batch), median of R batches; GPU time = median replay of one call in a CUDA graph. Stages
(plans off) are differences of nested entry points: the op's dispatch (``torch.ops.glyd.linear``
against its CUDA implementation called directly), the op's CUDA implementation above
``glyd.kernels.linear`` (``twin.packed``), ``glyd.kernels.linear`` above the family's launch
(checks, kernel choice, the output), the family's launch; with plans on: the direct-call checks,
the plan lookup, the plan's call with the compiled kernels' launchers and with Triton's own launch.
Outputs are checked bit for bit equal with plans on and off (and near float64). cProfile of 1000
calls (top 25 by tottime) for the cases in ``--profile``; the short table last.

    PYTHONPATH=src python3 benchmarks/probes/probe_host_time.py --out $OUT                  # H200
    PYTHONPATH=src TRITON_INTERPRET=1 python3 benchmarks/probes/probe_host_time.py --tiny     # CPU check

``--tiny`` runs tiny shapes through Triton's interpreter (the CUDA implementation called on CPU
tensors: plans on and off, bits compared), times the op on CPU tensors (glyd's C kernels: the shared
layers above a backend) and the plans' own Python (a stand-in for the compiled launcher). Its M = 80
rows take the table's long-prompt family (``fixed12_unpack_cublas``). ``--tiny --stub-kernels``
replaces a kernel launch (the interpreter's, which snapshots Triton's namespaces and runs the kernel
in numpy) by a call that does nothing (bits not checked): what is left is the host work of glyd's
layers and the torch ops on CPU tensors (cuBLAS's stand-in: CPU ``mm``; the scatter: CPU
``index_put``), so two commits' numbers compare the Python a call makes and the ops it issues, not
the GPU's launch costs (Triton's binder or the compiled launcher, the CUDA driver) nor GPU time.

    PYTHONPATH=src python3 benchmarks/probes/probe_host_time.py --tiny --stub-kernels --ms 80 --profile none
    PYTHONPATH=src python3 benchmarks/probes/probe_host_time.py --model qwen2.5-0.5b --ms 512 --profile gate_up:512:exc --out $OUT   # H200
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

if "--tiny" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports the kernels

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import glyd  # noqa: E402
from glyd import kernels  # noqa: E402
from glyd.kernels import _common as C  # noqa: E402
from glyd.kernels import _plan, registry  # noqa: E402
from glyd.ops import _eager  # noqa: E402
from glyd.ops.backends import cuda as cuda_impl  # noqa: E402
from glyd.ops.backends import torch as twin  # noqa: E402

SHAPES = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)}
#: --model qwen2.5-0.5b: its merged shapes (issue 38: its first token is host-bound, 2026-12-04)
SHAPES_05B = {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864)}
BIASED = {"qkv"}
TINY = {"qkv": (48, 256), "down": (24, 512)}


def sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def host_us(fn, dev: str, n: int, reps: int, stat=statistics.median) -> float:
    """Median (``stat``) over ``reps`` batches of the wall microseconds a call of ``n`` calls without a sync."""
    fn()
    times = []
    for _ in range(reps):
        sync(dev)
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n * 1e6)
    sync(dev)
    return stat(times)


def weights(n: int, k: int, exc: bool, dev: str) -> torch.Tensor:
    w = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
    if exc:  # ~0.1% far below the window: exceptions
        idx = torch.randint(0, n * k, (max(1, n * k // 1000),), device=dev)
        w.view(-1)[idx] = torch.tensor(1e-30, device=dev).to(torch.bfloat16)
    return w


class Case:
    """One matrix and x: the module, the op's arguments, and the family the table chooses."""

    def __init__(self, sname: str, n: int, k: int, m: int, exc: bool, dev: str) -> None:
        self.name, self.m, self.exc, self.dev = f"{sname} M={m}{' exc' if exc else ''}", m, exc, dev
        self.w = weights(n, k, exc, dev)
        self.bias = torch.randn(n, device=dev).to(torch.bfloat16) if sname in BIASED else None
        self.lin = glyd.GlydLinear(glyd.pack(self.w), self.bias)
        self.x = torch.randn(m, k, device=dev).to(torch.bfloat16)
        self.args = self.lin._op_args()
        self.packed = twin.packed(*self.args)
        self.nexc = int(self.packed.arrays["exc_idx"].numel())
        self.x2 = C.check_x(self.x, k)
        self.kernel, self.cfg = kernels.choose(self.x, self.packed)
        self.out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)

    def op(self):
        layout, shape, arrays, version = self.args
        return torch.ops.glyd.linear(self.x, layout, shape, arrays, self.bias, version)

    def impl(self):
        layout, shape, arrays, version = self.args
        return cuda_impl.linear(self.x, layout, shape, arrays, self.bias, version)


def _forced(flag: bool):
    """Kept plans launch through the compiled kernels' launchers (True) or Triton's ``kernel[grid]``."""
    _plan.FAST[0] = flag


def stages(c: Case, n: int, reps: int, tiny: bool) -> dict:
    """Host microseconds a call of each entry point and stage (see the module's docstring)."""
    dev, r = c.dev, {}
    h = lambda fn: host_us(fn, dev, n, reps)  # noqa: E731
    layout, shape, arrays, version = c.args
    _plan.set_enabled(False)
    if not tiny:
        r["bf16 F.linear"] = h(lambda: F.linear(c.x, c.w, c.bias))
        r["off: module"] = h(lambda: c.lin(c.x))
        r["off: op"] = h(c.op)
    r["off: CUDA impl"] = h(c.impl)
    r["off: kernels.linear"] = h(lambda: kernels.linear(c.x, c.packed, c.bias))
    r["off: family launch"] = h(lambda: c.kernel.launch(c.x2, c.packed, c.bias, c.cfg, c.out))
    r["twin.packed"] = h(lambda: twin.packed(*c.args))
    r["checks"] = h(lambda: (C.check_x(c.x, shape[1]), C.check_device(c.packed, c.x2),
                             C.check_bias(c.bias, shape[0], c.x2.device)))
    problem = kernels._problem(c.x2, c.packed)
    r["choose"] = h(lambda: registry.choose(problem, registry.Device.of(c.x2.device)))
    r["torch.empty out"] = h(lambda: torch.empty(c.m, shape[0], dtype=torch.bfloat16, device=dev))
    _plan.set_enabled(True)
    c.impl(), c.impl(), c.impl()  # made, recorded, fast
    # a family planned for a range of M keeps its plan in the entry's ranged list (h119), others by exact key
    plan = (_plan.kept(layout, shape, arrays, version, _plan._key(c.x, c.bias))
            or _plan._kept_rows(layout, shape, arrays, version, c.x, c.bias))
    if not tiny:
        r["on: module"] = h(lambda: c.lin(c.x))
        r["on: op"] = h(c.op)
    r["on: CUDA impl"] = h(c.impl)
    r["on: direct checks"] = h(lambda: _eager.backend(c.x, c.bias, arrays))
    r["on: plan lookup"] = h(lambda: _plan.kept(layout, shape, arrays, version, _plan._key(c.x, c.bias))
                             or _plan._kept_rows(layout, shape, arrays, version, c.x, c.bias))
    before = list(_plan.LAUNCHES)
    r["on: plan call"] = h(lambda: plan(c.x, c.bias, arrays))
    calls = n * reps + 1
    r["launches a call (compiled, Triton)"] = [round((a - b) / calls, 2) for a, b in zip(_plan.LAUNCHES, before)]
    _forced(False)
    r["on: plan call, Triton's launch"] = h(lambda: plan(c.x, c.bias, arrays))
    _forced(True)
    return r


def check_bits(c: Case, tiny: bool) -> tuple[bool, float]:
    """Plans off and on (made, recorded, fast calls) give the same bits; relative error to float64."""
    call = c.impl if tiny else (lambda: c.lin(c.x))
    _plan.set_enabled(False)
    want = call()
    _plan.set_enabled(True)
    same = all(torch.equal(call().view(torch.int16), want.view(torch.int16)) for _ in range(4))
    ref = F.linear(c.x.double(), c.w.double(), None if c.bias is None else c.bias.double())
    return same, float((want.double() - ref).norm() / ref.norm())


def stub_extras(c: Case, n: int, reps: int) -> dict:
    """--stub-kernels: the product's torch matmul alone (CPU ``mm``, the part that stands in for
    cuBLAS) and the Python function calls a call of the CUDA implementation makes, plans on."""
    _plan.set_enabled(True)
    w = torch.empty(c.packed.shape, dtype=torch.bfloat16)
    r = {"stub: CPU mm alone": host_us(lambda: torch.mm(c.x2, w.t(), out=c.out), "cpu", n, reps)}
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(100):
        c.impl()
    pr.disable()
    r["stub: python calls a product"] = sum(v[1] for v in pstats.Stats(pr).stats.values()) / 100
    r["stub: on - mm"] = r.get("on: CUDA impl", 0.0)
    return r


def gpu_us(fn) -> float:
    from glyd.timing import cuda_graph_ms

    return cuda_graph_ms(fn, 20) * 1e3


def profile(c: Case, calls: int, tiny: bool, out: Path | None) -> None:
    """cProfile of ``calls`` module calls (the CUDA implementation with --tiny), plans off and on."""
    call = c.impl if tiny else (lambda: c.lin(c.x))
    for on in (False, True):
        _plan.set_enabled(on)
        call(), call(), call()
        sync(c.dev)
        pr = cProfile.Profile()
        pr.enable()
        for i in range(calls):
            call()
            if i % 100 == 99:
                sync(c.dev)  # the launch queue never fills: host time only
        sync(c.dev)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        text = f"== cProfile {c.name}, plans {'on' if on else 'off'}, {calls} calls\n{s.getvalue()}"
        print(text[:9000], flush=True)
        if out:
            name = "".join(ch if ch.isalnum() else "_" for ch in c.name)
            (out / f"cprofile_{name}_{'on' if on else 'off'}.txt").write_text(text)


def shared_layers(n: int, reps: int) -> dict:
    """On CPU tensors (glyd's C kernels when built): the op's dispatch and ``twin.packed``, and the
    plans' own Python per product and per launch, with a stand-in for the compiled launcher."""
    from glyd.ops.backends import cpu as cpu_impl

    w = (torch.randn(64, 256) * 0.02).to(torch.bfloat16)
    lin = glyd.GlydLinear(glyd.pack(w))
    x = torch.randn(1, 256).to(torch.bfloat16)
    layout, shape, arrays, version = lin._op_args()
    h = lambda fn: host_us(fn, "cpu", n, reps, min)  # noqa: E731  (the least loaded batch: a shared CPU)
    r = {"cpu C kernels built": bool(cpu_impl.kernels_available())}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core a product, as the C kernels at M = 1
    with torch.no_grad():
        r["cpu: F.linear 64x256"] = h(lambda: F.linear(x, w))
        _plan.set_enabled(False)
        r["cpu: module, through the op"] = h(lambda: lin(x))
        _plan.set_enabled(True)
        r["cpu: module, direct"] = h(lambda: lin(x))
        r["cpu: op"] = h(lambda: torch.ops.glyd.linear(x, layout, shape, arrays, None, version))
        r["cpu: CPU impl called directly"] = h(lambda: cpu_impl.linear(x, layout, shape, arrays, None, version))
        r["cpu: twin.packed"] = h(lambda: twin.packed(layout, shape, arrays, version))
        r["cpu: op args (module)"] = h(lin._op_args)
        r["cpu: direct checks"] = h(lambda: _eager.passes_through(x, None, arrays))
    # a stored plan whose body makes three launches through a stand-in compiled launcher
    saved = _plan._device, _plan._raw_stream
    try:
        r.update(_stand_in(x, layout, shape, arrays, version, h))
    finally:
        _plan._device, _plan._raw_stream = saved
        _plan.clear()
        torch.set_num_threads(threads)
    return r


def _stand_in(x, layout, shape, arrays, version, h) -> dict:
    r = {}
    stub = _StubKernel()
    s = _plan.slots(4) + _plan.slots(5, 4, fixed=True)
    launches = [_plan.Launch(stub, (64, 2, 1), (s[0], s[4], s[5], s[6], s[1], s[2], s[3], 1, 64, 256, 256, 256, 128),
                             dict(BM=1, BN=16, EVEN=True, num_warps=4)) for _ in range(3)]

    def body(x2, bias, out, arrays):
        for launch in launches:
            launch(x2, out, out, out, *arrays)
        return out

    _plan.set_enabled(True)
    _plan.store(x, layout, shape, arrays, None, version, _plan.Plan(body, x, x, 64))
    r["stand-in: plan hit (run), 3 launches"] = h(lambda: _plan.run(x, layout, shape, arrays, None, version))
    r["stand-in: one fast launch"] = h(lambda: launches[0](x, x, x, x, *arrays))
    entry = _plan._ENTRIES[id(arrays[0])]
    r["stand-in: plan lookup"] = h(lambda: entry.holds(arrays, _plan._op(layout, shape, version)))
    r["stand-in: key"] = h(lambda: _plan._key(x, None))
    r["stand-in: torch.empty 1x64"] = h(lambda: torch.empty(1, 64, dtype=torch.bfloat16))
    return r


class _StubKernel:
    """Launches nothing; behaves as a compiled JITFunction for ``_plan._record`` (CPU timing only)."""

    arg_names = [f"a{i}" for i in range(13)] + ["BM", "BN", "EVEN"]
    pre_run_hooks: list = []
    debug = None

    def __init__(self) -> None:
        from triton.backends.compiler import BaseBackend
        from triton.runtime.jit import create_function_from_signature
        import inspect

        params = [inspect.Parameter(a, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in self.arg_names]
        sig = inspect.Signature(params)

        class P:
            def __init__(self, i, name):
                self.num, self.name = i, name
                self.is_constexpr = name in ("BM", "BN", "EVEN")
                self.is_const, self.do_not_specialize, self.do_not_specialize_on_alignment = False, False, False
                self.annotation_type = ""

        binder = create_function_from_signature(sig, [P(i, a) for i, a in enumerate(self.arg_names)], BaseBackend)
        self.compiled = _StubCompiled()
        self.cache: dict = {}
        self.device_caches = {0: (self.cache, {}, None, None, binder)}
        _plan._device = lambda: 0  # the stand-in runs on no device
        _plan._raw_stream = lambda device: 0

    def __getitem__(self, grid):
        from triton import knobs
        from triton.runtime.jit import compute_cache_key

        def run(*args, **kwargs):
            kwargs["debug"] = kwargs.get("debug", self.debug) or knobs.runtime.debug
            kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
            _, spec, options = self.device_caches[0][4](*args, **kwargs)
            return self.cache.setdefault(compute_cache_key(self.device_caches[0][1], spec, options), self.compiled)

        return run


class _StubCompiled:
    function = None
    packed_metadata = (4, 1, 0)

    @staticmethod
    def run(*args):
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--model", choices=("qwen2.5-7b", "qwen2.5-0.5b"), default="qwen2.5-7b",
                    help="whose merged shapes (--shapes picks among them)")
    ap.add_argument("--ms", default=None, help="x rows (default 1,8,64; --tiny: 1,2,80)")
    ap.add_argument("--calls", type=int, default=100, help="calls a batch (no sync inside)")
    ap.add_argument("--reps", type=int, default=5, help="batches (median)")
    ap.add_argument("--profile", default="gate_up:1:exc,down:1:exc,qkv:8:exc,o:64:exc",
                    help="shape:M[:exc] cases to cProfile (1000 calls, plans off and on), or none")
    ap.add_argument("--tiny", action="store_true", help="CPU check under TRITON_INTERPRET=1 on tiny shapes")
    ap.add_argument("--stub-kernels", action="store_true", help="--tiny: kernels execute nothing (host time only)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = Path(a.out) if a.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    dev = "cpu" if a.tiny else "cuda"
    table = SHAPES_05B if a.model == "qwen2.5-0.5b" else SHAPES
    shapes = TINY if a.tiny else {s: table[s] for s in a.shapes.split(",")}
    ms = [int(v) for v in (a.ms or ("1,2,80" if a.tiny else "1,8,64")).split(",")]
    n, reps = (3, 1) if a.tiny else (a.calls, a.reps)
    if a.stub_kernels:
        if not a.tiny:
            ap.error("--stub-kernels needs --tiny")
        from triton.runtime.interpreter import InterpretedFunction

        from glyd.kernels import _interp

        InterpretedFunction.run = lambda self, *args, grid, warmup, **kw: None  # noqa: ARG005
        # and the interpreter's launch path (namespace snapshots a launch): a launch costs ~nothing
        _interp._Isolated.__getitem__ = lambda self, grid: (lambda *args, **kw: None)  # noqa: ARG005
        n, reps = a.calls, a.reps
    wanted = set() if a.profile == "none" else set(a.profile.split(","))
    if a.tiny and a.profile != "none":
        wanted = {"qkv:1:exc"}
    torch.manual_seed(0)
    rows, ok = [], True
    with torch.no_grad():
        for sname, (rows_n, k) in shapes.items():
            for m in ms:
                for exc in (False, True):
                    c = Case(sname, rows_n, k, m, exc, dev)
                    same, err = (True, float("nan")) if a.stub_kernels else check_bits(c, a.tiny)
                    ok &= same and (a.stub_kernels or err < 1e-2)
                    r = dict(case=c.name, kernel=c.kernel.name, nexc=c.nexc, bits_equal=same, rel_err=err,
                             **stages(c, n, reps, a.tiny))
                    if a.stub_kernels:
                        r.update(stub_extras(c, n, reps))
                        r["stub: on - mm"] = r["on: CUDA impl"] - r["stub: CPU mm alone"]
                    if not a.tiny:
                        r["gpu us: bf16"] = gpu_us(lambda: F.linear(c.x, c.w, c.bias))
                        r["gpu us: fixed12"] = gpu_us(lambda: c.lin(c.x))
                    print(json.dumps({k2: round(v, 2) if isinstance(v, float) else v for k2, v in r.items()}),
                          flush=True)
                    rows.append(r)
                    if f"{sname}:{m}{':exc' if exc else ''}" in wanted:
                        profile(c, 5 if a.tiny else 1000, a.tiny, out)
                    del c
        layers = shared_layers(20 if a.tiny else 500, 3 if a.tiny else 5)
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in layers.items()}), flush=True)
    if out:
        (out / "host_time.json").write_text(json.dumps(dict(rows=rows, shared_layers=layers), indent=1))
    print(f"\n{'case':22s} {'dispatch':>8s} {'packed':>7s} {'checks':>7s} {'launch':>8s} | {'direct':>6s} "
          f"{'lookup':>6s} {'plan':>6s} {'+triton':>7s}")
    for r in rows:
        d = r.get("off: op", float("nan")) - r["off: CUDA impl"]
        extra = r["on: plan call, Triton's launch"] - r["on: plan call"]
        print(f"{r['case']:22s} {d:8.1f} {r['off: CUDA impl'] - r['off: kernels.linear']:7.1f} "
              f"{r['off: kernels.linear'] - r['off: family launch']:7.1f} {r['off: family launch']:8.1f} | "
              f"{r['on: direct checks']:6.1f} {r['on: plan lookup']:6.1f} {r['on: plan call']:6.1f} "
              f"{extra:7.1f}")
    print("plans off: dispatch = op - CUDA impl; packed = CUDA impl - kernels.linear; checks = kernels.linear - "
          "the family's launch (checks, choice, output); launch = the family's launch. Plans on: the direct "
          "call's checks, the plan lookup, the plan's call, and what Triton's own launch adds to it")
    key = "off: CUDA impl" if a.tiny else "off: module"
    key_on = "on: CUDA impl" if a.tiny else "on: module"
    print(f"\n{'case':22s} {'kernel':24s} {'nexc':>7s} {'bf16':>7s} {'off':>8s} {'on':>8s} {'on/bf16':>8s} "
          f"{'gpu us':>7s} bits")
    for r in rows:
        bf = r.get("bf16 F.linear", float("nan"))
        print(f"{r['case']:22s} {r['kernel']:24s} {r['nexc']:7d} {bf:7.1f} {r[key]:8.1f} {r[key_on]:8.1f} "
              f"{r[key_on] / bf:8.2f} {r.get('gpu us: fixed12', float('nan')):7.1f} "
              f"{'equal' if r['bits_equal'] else 'DIFFER'}")
    print("host us a call (median of batches without sync); off/on: the module (--tiny: the CUDA impl) with "
          "launch plans off/on")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
