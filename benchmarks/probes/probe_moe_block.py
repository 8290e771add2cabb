#!/usr/bin/env python3
"""Issue 36 probe: a whole mixture-of-experts block's experts (gate_up, the gate's activation, down,
the routing weights' sum) at Qwen3-30B-A3B's shapes (128 experts, top-8, hidden 2048,
moe_intermediate 768), eager and as one CUDA graph:

* ``bf16 block``: transformers' ``Qwen3MoeExperts`` on bf16 experts, ``grouped_mm`` implementation;
* ``glyd per-product``: ``GlydExperts`` with every product routing its own rows (``experts_linear``:
  gather, sort and scatter inside each product; the path before the shared routing);
* ``glyd shared``: ``GlydExperts`` as it runs (rows sorted once a block by ``glyd::experts_route``,
  ``experts_linear_sorted`` twice, the rows put back once; taken where the kernel sorts: the unpack +
  grouped GEMM, above 2048 rows by default);
* ``route op`` / ``route kernel C/W`` / ``torch.sort route``: the routing alone (the op: one Triton
  launch and its one id check; the kernel at chunks of C rows and W warps; ``torch.sort`` +
  ``torch.searchsorted`` as the twin sorts).

The shared and per-product outputs are compared bit for bit, both against the bf16 block (max
error over the largest output). Eager: CUDA events around each call (host time included), median.

``--ops`` (CPU, Triton's interpreter): the ops one block (and one grouped product) issues, old and
new, by a ``TorchDispatchMode`` around the CUDA implementation called on CPU tensors: torch ops that
launch kernels on a GPU (views and allocations apart), Triton launches by kernel, host syncs
(``_local_scalar_dense``); and the call's CPU time with the Triton launches stubbed (glyd's Python
and the torch ops on tiny CPU tensors: a stand-in for host time, not the GPU's launch costs); and
the host steps of one steady call, counted (``sys.setprofile``): Triton launches through Triton's
binder or a recorded fast launch (its stand-in here: a GPU records them, the interpreter cannot),
Python function calls (glyd's, all) and C calls. Copy it into another checkout to list that one.

    PYTHONPATH=src python3 benchmarks/probes/probe_moe_block.py --out $OUT/moe_block.json        # H200
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/probes/probe_moe_block.py --tiny         # CPU check
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/probes/probe_moe_block.py --ops          # op lists
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import glyd.ops  # noqa: E402,F401  (registers torch.ops.glyd)
from glyd.kernels import experts as EK  # noqa: E402
try:  # absent before the shared routing (--ops on an older checkout)
    from glyd.kernels import experts_route as route_module  # noqa: E402
    from glyd.kernels.experts_route import route as route_kernel  # noqa: E402
except ImportError:
    route_kernel = route_module = None
from glyd.nn.experts import GlydExperts  # noqa: E402
from glyd.ops import experts as ops  # noqa: E402

SHAPE = dict(hidden=2048, inter=768, experts=128, top_k=8)
TINY = dict(hidden=64, inter=64, experts=8, top_k=2)
VIEWS = {"view", "_unsafe_view", "reshape", "_reshape_alias", "transpose", "t", "slice", "select", "unsqueeze",
         "squeeze", "expand", "alias", "as_strided", "permute", "split", "split_with_sizes", "chunk", "detach",
         "unbind", "narrow", "empty", "empty_like", "new_empty", "empty_strided", "lift_fresh"}


def build(dims, dev, seed=0):
    """(bf16 transformers experts module, the same packed as GlydExperts)."""
    import transformers
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = transformers.Qwen3MoeConfig(hidden_size=dims["hidden"], moe_intermediate_size=dims["inter"],
                                      num_experts=dims["experts"], num_experts_per_tok=dims["top_k"],
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    cfg._experts_implementation_internal = "grouped_mm"
    with torch.device(dev):
        ref = Qwen3MoeExperts(cfg).to(torch.bfloat16)
    g = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_((torch.randn(p.shape, generator=g, device=dev) * 0.02).to(torch.bfloat16))
    packed = {n: ops.pack_experts(getattr(ref, n).detach(), "fixed12") for n in ("gate_up_proj", "down_proj")}
    return ref, GlydExperts(copy.deepcopy(ref), packed)


def routing(tokens, dims, dev, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    h = torch.randn(tokens, dims["hidden"], generator=g, device=dev).to(torch.bfloat16)
    logits = torch.randn(tokens, dims["experts"], generator=g, device=dev)
    val, idx = logits.softmax(-1).topk(dims["top_k"], dim=-1)
    return h, idx, (val / val.sum(-1, keepdim=True)).to(torch.bfloat16)


@contextlib.contextmanager
def path(shared):
    """GlydExperts with the shared routing on (True), off (False) or as it chooses (None)."""
    real = ops.sorts_rows
    if shared is not None:
        ops.sorts_rows = lambda *a: shared
    try:
        yield
    finally:
        ops.sorts_rows = real


@contextlib.contextmanager
def kernels_on_cpu():
    """The experts ops' CUDA implementations for CPU tensors (Triton's interpreter)."""
    lib = torch.library.Library("glyd", "IMPL")  # noqa: TOR901 - destroyed below
    for name in ("experts_linear", "experts_linear_sorted", "experts_route"):
        impl = getattr(ops, f"_{name}_cuda", None)
        if impl is not None:
            lib.impl(name, impl, "CPU")
    try:
        yield
    finally:
        lib._destroy()


def time_ms(fn, dev, reps):
    for _ in range(2):
        fn()
    out = []
    for _ in range(reps):
        if dev == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def graph_ms(fn, reps):
    from glyd.timing import cuda_graph_ms

    try:
        return cuda_graph_ms(fn, reps)
    except Exception as exc:  # a variant that cannot be captured is a row, not the end of the probe
        print(f"  graph: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        return float("nan")


def run(dims, tokens_list, dev, reps):
    ref, mod = build(dims, dev)
    rows = []
    for tokens in tokens_list:
        h, idx, w = routing(tokens, dims, dev, seed=tokens)
        with torch.no_grad():
            want = ref(h, idx, w).float()
            with path(False):
                own = mod(h, idx, w)
            with path(True):
                shared = mod(h, idx, w)
        equal = torch.equal(own.view(torch.int16), shared.view(torch.int16))
        err = float((shared.float() - want).abs().max() / want.abs().max())
        default = ops.sorts_rows(h, tokens * dims["top_k"], "fixed12", mod.packed_shapes["gate_up_proj"])
        ids = idx.reshape(-1)
        cands = {"bf16 block": (None, lambda: ref(h, idx, w)),
                 "glyd per-product": (False, lambda: mod(h, idx, w)),
                 "glyd shared": (True, lambda: mod(h, idx, w)),
                 "glyd default": (None, lambda: mod(h, idx, w)),
                 "route op": (None, lambda: ops.route(ids, dims["experts"], dims["top_k"])),
                 "torch.sort route": (None, lambda: ops._route_torch(ids, dims["experts"], dims["top_k"]))}
        for chunk, warps in ((1024, 4), (2048, 8), (4096, 8)) if route_kernel else ():  # its launch shapes
            cands[f"route kernel {chunk}/{warps}"] = (None, lambda c=chunk, wp=warps: route_kernel(
                ids, dims["experts"], dims["top_k"], chunk=c, warps=wp))
        for name, (shared_on, fn) in cands.items():
            with torch.no_grad(), path(shared_on):
                ms = time_ms(fn, dev, reps)
                gms = graph_ms(fn, reps) if dev == "cuda" else float("nan")
            rows.append(dict(tokens=tokens, rows=tokens * dims["top_k"], variant=name, ms=ms, graph_ms=gms,
                             shared_equal=equal, err=err, default_shared=default))
            print(f"  tokens={tokens} {name}: {ms:.3f} ms, graph {gms:.3f} ms", flush=True)
        print(f"  tokens={tokens}: shared == per-product bit for bit: {equal}; max err / max |bf16 block| "
              f"{err:.2e}; default path shared: {default}", flush=True)
    return rows


class _Count(torch.utils._python_dispatch.TorchDispatchMode):
    """Every torch op dispatched from Python (glyd's own ops run their CUDA implementation inside)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if func.namespace == "glyd":
            self.ops.append(f"glyd::{name}")
            with self:
                return getattr(ops, f"_{name}_cuda")(*args, **(kwargs or {}))
        self.ops.append(name)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting_triton(log):
    """Each interpreted Triton launch named in ``log``, run with the counting mode off."""
    from glyd.kernels import _interp
    from torch.utils._python_dispatch import _disable_current_modes

    real = _interp._Isolated.__getitem__

    def getitem(self, grid):
        launch = real(self, grid)

        def counted(*a, **kw):
            log.append(f"triton:{self._kernel.fn.__name__}")
            with _disable_current_modes():
                return launch(*a, **kw)
        return counted

    _interp._Isolated.__getitem__ = getitem
    try:
        yield
    finally:
        _interp._Isolated.__getitem__ = real


@contextlib.contextmanager
def stub_triton():
    """Triton launches replaced by a stand-in that costs nearly nothing (host time of the rest): the
    route kernel's outputs copied from its first real launch (its rows are needed), others skipped."""
    from glyd.kernels import _interp

    real, kept = _interp._Isolated.__getitem__, {}

    def getitem(self, grid):
        name = self._kernel.fn.__name__
        launch = real(self, grid)

        def stub(*a, **kw):
            if name != "_route_kernel":
                return None
            outs, key = a[1:6], (a[0].shape[0], a[8])  # order, sorted ids, tokens, offs, ok; (S, group)
            if key not in kept:
                launch(*a, **kw)
                kept[key] = [t.clone() for t in outs]
            for t, v in zip(outs, kept[key]):
                t.copy_(v)
        return stub

    _interp._Isolated.__getitem__ = getitem
    try:
        yield
    finally:
        _interp._Isolated.__getitem__ = real


@contextlib.contextmanager
def fast_stand_in(log):
    """A GPU's recorded fast launches (``_plan._record``; the interpreter compiles nothing to record):
    launched through the stubbed kernel, counted in ``log`` as "fast" (absent before the kept launches)."""
    try:
        from glyd.kernels import _plan
    except ImportError:
        yield
        return
    real = _plan._record
    _plan.clear()  # launches recorded before (none: the interpreter's) are made again, and recorded here
    getattr(route_module, "_LAUNCHES", {}).clear()

    def record(launch, compiled, args, meta):
        class Fast:
            def launch(self, vals, stream):
                log.append("fast")
                a = [vals[x.index] if type(x) is _plan.Slot else x for x in launch.args]  # the stub reads no dtype
                launch.kernel[launch.grid](*a, **launch.meta)
                return True
        return Fast()

    _plan._record = record
    try:
        yield
    finally:
        _plan._record = real


def host_steps(fn):
    """(Triton launches through Triton's binder, through a recorded fast launch, glyd's Python calls,
    Python calls in all, C calls) of one steady call of ``fn`` (the stand-in: Triton launches stubbed;
    the launches' own Python, the binder's or the fast launcher's, not in the calls)."""
    log, calls = [], collections.Counter()
    src = str(Path(__file__).resolve().parents[2] / "src" / "glyd")

    def prof(frame, event, arg):
        # not counted: this probe's stubs and stand-ins, Triton's interpreter and glyd's wrapper of it
        # (a GPU has neither: its launches are counted by path instead)
        name = frame.f_code.co_filename
        if name == __file__ or "/triton/" in name or name.endswith("_interp.py"):
            return
        if event == "call":
            calls["python"] += 1
            calls["glyd"] += name.startswith(src)
        elif event == "c_call":
            calls["c"] += 1

    with stub_triton(), fast_stand_in(log), torch.no_grad():
        for _ in range(3):  # a launch is recorded at its second call
            fn()
        from glyd.kernels import _interp

        real = _interp._Isolated.__getitem__

        def getitem(self, grid):  # every launch reaches the stub through here; "fast" ones are logged too
            log.append("triton")
            return real(self, grid)

        _interp._Isolated.__getitem__ = getitem
        log.clear()
        sys.setprofile(prof)
        try:
            fn()
        finally:
            sys.setprofile(None)
            _interp._Isolated.__getitem__ = real
    fast = log.count("fast")
    return log.count("triton") - fast, fast, calls["glyd"], calls["python"], calls["c"]


def host_us(fn, n=200):
    """Median microseconds of ``fn`` over ``n`` calls, Triton launches stubbed (the CPU stand-in)."""
    with stub_triton(), torch.no_grad():
        fn()
        out = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e6)
    return statistics.median(out)


def op_list(fn):
    mode = _Count()
    with counting_triton(mode.ops), mode, torch.no_grad():
        fn()
    launches = [o for o in mode.ops if o not in VIEWS and not o.startswith("glyd::")]
    return collections.Counter(launches), sum(o == "_local_scalar_dense" for o in mode.ops)


def ops_report(tokens):
    """The op lists of one block and one grouped product (CPU stand-in), old and new paths."""
    dims = TINY
    _, mod = build(dims, "cpu")
    h, idx, w = routing(tokens, dims, "cpu", seed=1)
    ids = idx.reshape(-1)
    p = mod.packed("gate_up_proj")
    x = h.repeat_interleave(dims["top_k"], dim=0)
    cases = {"block, as it runs": (None, lambda: mod(h, idx, w))}
    if hasattr(ops, "sorts_rows"):
        cases = {"block, per-product routing": (False, lambda: mod(h, idx, w)),
                 "block, shared routing": (True, lambda: mod(h, idx, w))}
    cfg = EK.ExpertsGroupedConfig()
    cases["one grouped product (experts_linear)"] = (None, lambda: EK.linear(x, ids, p, cfg))
    if hasattr(ops, "route"):
        order, sids, offs, tok = ops._experts_route_twin(ids, dims["experts"], dims["top_k"])
        xs = h.index_select(0, tok)
        cases["one sorted product (experts_linear_sorted)"] = (None, lambda: EK.linear(xs, sids, p, cfg, offs=offs))
    out = {}
    grouped = (EK.ExpertsGroupedKernel, cfg)  # every product through the unpack + grouped GEMM, whatever its rows
    with kernels_on_cpu(), contextlib.ExitStack() as stack:
        real_choose = EK.choose
        EK.choose = lambda *a, **kw: grouped
        stack.callback(setattr, EK, "choose", real_choose)
        for name, (shared, fn) in cases.items():
            with path(shared) if hasattr(ops, "sorts_rows") else contextlib.nullcontext():
                fn()  # compiled, prepared: the steady state's ops
                counts, syncs = op_list(fn)
                binder, fast, glyd_calls, py_calls, c_calls = host_steps(fn)
                us = host_us(fn)
            total = sum(counts.values())
            out[name] = dict(ops=dict(counts), launches=total, host_syncs=syncs, host_us=us, triton_binder=binder,
                             fast_launches=fast, glyd_python_calls=glyd_calls, python_calls=py_calls, c_calls=c_calls)
            print(f"{name} ({tokens} tokens x top-{dims['top_k']}): {total} launching ops, {syncs} host syncs, "
                  f"{us:.0f} us on the CPU with Triton launches stubbed")
            print(f"    Triton launches: {binder} through Triton's binder, {fast} recorded fast; Python calls: "
                  f"{glyd_calls} glyd's, {py_calls} in all; {c_calls} C calls")
            for op, c in sorted(counts.items(), key=lambda t: -t[1]):
                print(f"    {c:3d}  {op}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small shapes (CPU, TRITON_INTERPRET=1)")
    ap.add_argument("--ops", action="store_true", help="the op lists of a block and a product (CPU, interpreter)")
    ap.add_argument("--tokens", default=None, help="comma-separated token counts (default 64,512,2048)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args()
    if a.ops:
        torch.set_num_threads(1)  # the stand-in's times: one thread, less noise from a shared CPU
        rows = ops_report(int(a.tokens or 64))
    else:
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        dims = TINY if a.tiny else SHAPE
        tokens = [int(t) for t in (a.tokens or ("5,1100" if a.tiny else "64,512,2048")).split(",")]
        print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}; {dims}",
              flush=True)
        with kernels_on_cpu() if dev == "cpu" else contextlib.nullcontext():
            rows = run(dims, tokens, dev, a.reps or (1 if a.tiny else 20))
        base = {(r["tokens"]): (r["ms"], r["graph_ms"]) for r in rows if r["variant"] == "bf16 block"}
        print(f"\n{'tokens':>6s} {'rows':>6s} {'variant':22s} {'ms':>8s} {'x bf16':>7s} {'graph ms':>9s} {'x bf16':>7s}")
        for r in rows:
            b, gb = base[r["tokens"]]
            print(f"{r['tokens']:6d} {r['rows']:6d} {r['variant']:22s} {r['ms']:8.3f} {r['ms'] / b:7.2f} "
                  f"{r['graph_ms']:9.3f} {r['graph_ms'] / gb:7.2f}")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
