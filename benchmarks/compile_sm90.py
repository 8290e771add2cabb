"""Every Triton launch of the CPU tests, compiled for the H200 (sm_90) on the CPU (no GPU needed).

Triton's interpreter (``TRITON_INTERPRET=1``, the CPU tests) never lowers a kernel, so what only the
compiler rejects (a loop-carried value changing type, i32/i64 mixes, ``tl.dot`` shape and dtype
limits, layout conversions, ops without a lowering, shared memory past the SM's 227 KB) first shows
on the GPU. This runs pytest in this process under the interpreter with every launch of a
``@triton.jit`` kernel recorded (its argument types and 16-byte divisibility as Triton's own binder
derives them for CUDA, its constexprs, num_warps, num_stages, maxnreg ...) as the GPU would make it
(glyd's launchers are told they do not interpret, ``GPU_ANSWERS``: bf16 dots, inline PTX, maxnreg; the
interpreter still runs its twins of those constexprs, ``INTERPRETER_RUNS``), then compiles each
distinct launch for ``GPUTarget("cuda", 90, 32)`` with Triton's own ptxas, in fresh processes (2 at
most; a fresh process because the interpreter leaves ``triton.language`` patched), into a new, empty
Triton cache unless ``--cache DIR``. It prints a table (kernel, launches, distinct variants
compiled, failures, most registers, local memory and shared memory of a variant) and each failure
with its constexprs, then the kernels the tests never launched (``@triton.jit`` kernels and helpers
no test reached; ``@gluon.jit`` kernels, which cannot run under the interpreter: their own tests
compile them). Exit status 1 if any variant fails to compile (or the tests fail, with
``--strict-tests``), 2 if pytest did not run them all (a collection error, an interrupt).

    PYTHONPATH=src .venv/bin/python benchmarks/compile_sm90.py tests/kernels tests/kv tests/nn tests/ops
    PYTHONPATH=src .venv/bin/python benchmarks/compile_sm90.py tests/kernels/test_linear.py -- -k fixed12 -m ''

A test whose configuration the GPU refuses fails under ``GPU_ANSWERS`` (its launch does not exist there:
the fused KV kernels' 16-token sub-tiles); ``--as-interpreted`` records the CPU's own launches instead.
Arguments after ``--`` go to pytest as they are (the default run's ``-m 'not slow and not gpu'``
comes from pyproject.toml; ``-m 'not gpu'`` adds the slow CPU cases, hence more variants).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib
import multiprocessing
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict

H200_SHARED = 232448  # bytes of shared memory one block may use on sm_90 (227 KB)
H200_REGS = 65536  # 32-bit registers an SM (a block's threads x registers must fit)
#: glyd's launchers ask these whether Triton interprets, to pass interpreter-only constexprs (fp32 dots for
#: the interpreter's wrong bf16 dot, integer twins of inline PTX, no maxnreg): while recording they say no,
#: so the GPU's launches are recorded, except to the callers named (they only allow CPU tensors)
GPU_ANSWERS = {"glyd.kernels._common:interpreting": {"check_device"}, "glyd.kv._triton:_interpreting": set(),
               "glyd.kv._triton_fixed:_interpreting": set()}
#: ... and the interpreter then runs each launch with these constexprs, as the CPU launch would pass them
INTERPRETER_RUNS = {"PRMT": False, "HW_POPC": False, "HW": False, "F32DOT": True, "F32": True, "QK_F32": True}


class Recorder:
    """Wraps ``InterpretedFunction.run`` (every ``kernel[grid](...)``) and ``__call__`` (helpers)."""

    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.compiler import make_backend
        from triton.runtime.interpreter import InterpretedFunction

        self.backend = make_backend(GPUTarget("cuda", 90, 32))
        self.option_names = set(CUDAOptions.__dataclass_fields__)
        self.cls = InterpretedFunction
        self.jobs: dict[tuple, tuple] = {}  # dedup key -> compile job
        self.launches: dict[str, int] = defaultdict(int)  # kernel name -> launches seen
        self.reached: set = set()  # python functions of helpers called inside kernels
        self.errors: dict[str, str] = {}  # kernel name -> why a launch could not be recorded
        self._binders: dict = {}
        self.trail: list[str] = []  # dedup keys of the launches recorded, in order (a caller may clear it)
        self._run, self._call = InterpretedFunction.run, InterpretedFunction.__call__

    def install(self, gpu: bool, execute: bool = True) -> None:
        """Record every launch (as the GPU would make it when ``gpu``); ``execute=False`` records
        without running the kernel (its outputs stay unwritten: ``compile_table.py``)."""
        rec = self

        def run(self, *args, grid, warmup, **kwargs):
            try:
                rec.record(self, args, kwargs)
            except Exception as exc:  # a launch the tool cannot describe must not fail the test
                rec.errors.setdefault(name_of(self.fn), f"{type(exc).__name__}: {exc}")
                rec.trail.append(f"!{name_of(self.fn)}: not recorded ({type(exc).__name__}: {exc})")
            if not execute:
                return None
            if gpu:  # run what the interpreter can (its twins of the GPU-only constexprs)
                args = [INTERPRETER_RUNS.get(n, a) for n, a in zip(self.arg_names, args)]
                kwargs = {k: INTERPRETER_RUNS.get(k, v) for k, v in kwargs.items()}
            return rec._run(self, *args, grid=grid, warmup=warmup, **kwargs)

        def call(self, *args, **kwargs):
            rec.reached.add(self.fn)
            return rec._call(self, *args, **kwargs)

        self.cls.run, self.cls.__call__ = run, call
        self.saved = []
        for target, keep in GPU_ANSWERS.items() if gpu else ():
            module, _, name = target.partition(":")
            try:
                mod = importlib.import_module(module)
                self.saved.append((mod, name, getattr(mod, name)))
            except (ImportError, AttributeError):  # another tree: not there
                continue
            setattr(mod, name, lambda keep=keep: sys._getframe(1).f_code.co_name in keep)

    def uninstall(self) -> None:
        self.cls.run, self.cls.__call__ = self._run, self._call
        for mod, name, fn in self.saved:
            setattr(mod, name, fn)

    def record(self, interp, args, kwargs) -> None:
        from triton.runtime.jit import JITFunction, create_function_from_signature

        fn = interp.fn
        name = name_of(fn)
        self.launches[name] += 1
        if fn not in self._binders:  # Triton's own binder for CUDA, with the kernel's jit settings
            dns = {k: v for k, v in interp.kwargs.items() if k.startswith("do_not_specialize")}
            jf = JITFunction(fn, **dns)
            self._binders[fn] = jf, create_function_from_signature(jf.signature, jf.params, self.backend)
        jf, binder = self._binders[fn]
        bound, spec, _ = binder(*args, **kwargs)
        opts = {k: v for k, v in kwargs.items() if k in self.option_names and v is not None}
        _, sig, consts, attrs = jf._pack_args(self.backend, dict(opts), bound, spec, {})
        consts = {k: portable(v) for k, v in consts.items()}
        job = (fn.__module__, fn.__qualname__, sig, consts, attrs, opts)
        self.jobs.setdefault(repr(job), job)
        self.trail.append(repr(job))


def name_of(fn) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


def portable(value):
    """A constexpr value a fresh process can rebuild (kernels and dtypes by name)."""
    import triton.language as tl

    if isinstance(value, tl.constexpr):
        value = value.value
    if isinstance(value, tl.dtype):
        return ("__dtype__", value.name)
    if hasattr(value, "fn") and hasattr(value.fn, "__qualname__"):  # a kernel passed as a constexpr
        return ("__jit__", value.fn.__module__, value.fn.__qualname__)
    return value


def _rebuild(value):
    import triton.language as tl

    if isinstance(value, tuple) and value and value[0] == "__dtype__":
        return tl.dtype(value[1])
    if isinstance(value, tuple) and value and value[0] == "__jit__":
        return _resolve(value[1], value[2])
    return value


def _resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "_kernel", obj)  # glyd.kernels._interp.isolated returns compiled kernels as they are


def compile_job(job) -> dict:
    """Compile one recorded launch for sm_90 (in a worker process: TRITON_INTERPRET=0)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, qualname, sig, consts, attrs, opts = job
    try:
        if "<locals>" in qualname:
            raise LookupError("defined inside a function: cannot import it by name")
        kernel = _resolve(module, qualname)
        consts = {k: _rebuild(v) for k, v in consts.items()}
        k = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    except Exception as exc:
        lines = [s.strip() for s in str(exc).strip().splitlines() if s.strip()] or [""]
        where = lines[0] if lines[0].startswith("at ") else ""
        return {"error": f"{type(exc).__name__}: {lines[-1][:200]} {where}".strip()}
    res = res_usage(bytes(k.asm["cubin"]))
    res["SHARED"] = k.metadata.shared
    res["THREADS"] = 32 * k.metadata.num_warps
    return res


def res_usage(cubin: bytes) -> dict:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    return {key: int(v) for key, v in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", out)}


def compile_all(jobs: list, workers: int) -> list[dict]:
    """``compile_job`` of each job in fresh processes; a job whose process dies (a compiler abort)
    is found by running those left one a process."""
    ctx = multiprocessing.get_context("spawn")
    results: list = [None] * len(jobs)
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(compile_job, job) for job in jobs]
        for i, fut in enumerate(futures):
            try:
                results[i] = fut.result()
            except cf.process.BrokenProcessPool:
                pass
    for i in [i for i, r in enumerate(results) if r is None]:
        with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            try:
                results[i] = pool.submit(compile_job, jobs[i]).result()
            except cf.process.BrokenProcessPool:
                results[i] = {"error": "the compiler's process died (an abort in Triton's C++ passes or ptxas)"}
    return results


def launch_problem(res: dict) -> str | None:
    """Why a compiled variant would still fail to launch on the H200 (Triton's OutOfResources)."""
    if res["SHARED"] > H200_SHARED:
        return f"OutOfResources: shared memory {res['SHARED']} B > {H200_SHARED} B"
    if res.get("REG", 0) * res["THREADS"] > H200_REGS:
        return f"OutOfResources: {res['REG']} registers x {res['THREADS']} threads > {H200_REGS}"
    return None


def kernels_in(prefix: str, packages: list[str]) -> dict[str, object]:
    """Every module-level ``@triton.jit`` and ``@gluon.jit`` object of the modules under ``prefix``."""
    for pkg in packages:
        try:
            mod = importlib.import_module(pkg)
        except Exception:  # a package the tests do not need may not import here
            continue
        for info in pkgutil.walk_packages(getattr(mod, "__path__", []), pkg + "."):
            try:
                importlib.import_module(info.name)
            except Exception:
                pass
    found = {}
    for mname, mod in list(sys.modules.items()):
        if not mname.startswith(prefix) or mod is None:
            continue
        for obj in list(vars(mod).values()):
            obj = getattr(obj, "_kernel", obj)
            fn = getattr(obj, "fn", None)
            if callable(fn) and getattr(fn, "__module__", None) == mname and hasattr(obj, "arg_names"):
                found[name_of(fn)] = obj
    return found


def by_module(names: list[str]) -> str:
    groups: dict[str, list[str]] = defaultdict(list)
    for n in names:
        mod, _, fn = n.partition(":")
        groups[mod].append(fn)
    return "\n".join(f"  {mod}: {', '.join(fns)}" for mod, fns in sorted(groups.items())) or "  none"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="test files or folders")
    ap.add_argument("--workers", type=int, default=2, help="compile processes (2 at most on a shared machine)")
    ap.add_argument("--cache", help="Triton cache folder for the compiles (default: a new, empty one)")
    ap.add_argument("--package", default="glyd", help="the package whose kernels are listed as not launched")
    ap.add_argument("--as-interpreted", action="store_true",
                    help="record the launches as the CPU makes them (default: as the GPU would, GPU_ANSWERS)")
    ap.add_argument("--strict-tests", action="store_true", help="exit 1 when the tests themselves fail")
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)

    os.environ["TRITON_INTERPRET"] = "1"  # before anything defines a kernel
    sys.path.insert(0, os.getcwd())  # as `python -m pytest` has it: tests import `tests.kernels...`
    import pytest

    rec = Recorder()
    rec.install(gpu=not args.as_interpreted)
    try:
        status = pytest.main(["-q", "-p", "no:cacheprovider", *args.paths, *extra])
    finally:
        rec.uninstall()
    from triton.runtime.interpreter import InterpretedFunction

    known = kernels_in(args.package + ".", [f"{args.package}.kernels", f"{args.package}.kv"])

    os.environ["TRITON_INTERPRET"] = "0"  # the workers compile
    cache = args.cache or tempfile.mkdtemp(prefix="compile-sm90-cache-")
    os.environ["TRITON_CACHE_DIR"] = cache
    jobs = list(rec.jobs.values())
    print(f"\n{len(jobs)} distinct launches of {len(rec.launches)} kernels; compiling for sm_90 "
          f"({args.workers} processes, cache {cache})", flush=True)
    results = compile_all(jobs, max(1, min(args.workers, 2)))
    if not args.cache:
        shutil.rmtree(cache, ignore_errors=True)

    rows: dict[str, dict] = defaultdict(lambda: {"ok": 0, "fail": [], "REG": 0, "LOCAL": 0, "SHARED": 0})
    for job, res in zip(jobs, results):
        row = rows[f"{job[0]}:{job[1]}"]
        error = res.get("error") or launch_problem(res)
        if error:
            row["fail"].append((job, error))
            continue
        row["ok"] += 1
        for key in ("REG", "SHARED"):
            row[key] = max(row[key], res.get(key, 0))
        row["LOCAL"] = max(row["LOCAL"], res.get("LOCAL", 0) + res.get("STACK", 0))
    print("\n| kernel | launches | variants | compiled | failed | max regs | max local B | max shared B |")
    print("|---|---|---|---|---|---|---|---|")
    for name in sorted(rows):
        r = rows[name]
        print(f"| {name} | {rec.launches[name]} | {r['ok'] + len(r['fail'])} | {r['ok']} | {len(r['fail'])} "
              f"| {r['REG']} | {r['LOCAL']} | {r['SHARED']} |")
    failures = [(name, job, err) for name in sorted(rows) for job, err in rows[name]["fail"]]
    for name, job, err in failures:
        names = list(job[2])
        consts = {names[k[0]] if len(k) == 1 else k: v for k, v in job[3].items()}
        print(f"\nFAILED {name} {job[5]} constexprs {consts}\n    {err}")
    for name, err in sorted(rec.errors.items()):
        print(f"\nNOT RECORDED {name}: {err}")
    launched = {n for n in rec.launches}
    reached = {name_of(fn) for fn in rec.reached}
    idle = sorted(n for n, obj in known.items() if isinstance(obj, InterpretedFunction)
                  and n not in launched and n not in reached)
    gluon = sorted(n for n, obj in known.items() if not isinstance(obj, InterpretedFunction))
    print(f"\n@triton.jit functions of {args.package} never launched or called by these tests ({len(idle)}):")
    print(by_module(idle))
    print(f"@gluon.jit functions (not covered: the interpreter cannot run Gluon) ({len(gluon)}):")
    print(by_module(gluon))
    print(f"\nsm_90: {sum(r['ok'] for r in rows.values())} variants compiled, {len(failures)} failed; "
          f"pytest exit status {int(status)}")
    if status not in (0, 1, 5):  # interrupted, a collection error, a usage error: the launches are not all there
        return 2
    return 1 if failures or (args.strict_tests and status == 1) else 0


if __name__ == "__main__":
    sys.exit(main())
