"""Every Triton config of a kernel table, launched at a real shape of its cell and compiled for sm_90 on the CPU.

``compile_sm90.py`` compiles the launches the CPU tests make, so a table config is compiled only where a
test happens to use it; the GPU launches exactly the table's configs at model shapes. This goes through
the table (default: the H200's, ``src/glyd/kernels/tables/NVIDIA_H200.json``): for every candidate of
``linear.<layout>.<shape class>.<M bucket>`` it packs random weights of that class's representative
shape (``SHAPES``: Qwen2.5-7B's where the class has one, since constexprs such as EVEN_K follow the
shape) in the layout, in every format version its codec still writes (an older file runs other
kernels), takes M as the bucket's first (as ``registry.choose`` does), asks the family whether it can
run the problem on an H200 (``devices``; one that needs Gluon there is listed as not covered: the
interpreter cannot run Gluon, its own tests compile it) and calls the family's launcher with the cell's
config under ``compile_sm90.Recorder`` in record-only mode, once for each version it takes: each
launch is recorded as the GPU would make it and not run (running the interpreter at these shapes takes
hours; outputs stay unwritten, which nothing reads). The ``kv`` section's candidates are launched the
same way at ``KV_SHAPES`` (an ``experts`` section is counted, not launched). Each distinct launch is
then compiled for sm_90 as ``compile_sm90.py`` does, and a row a candidate printed: compiled / failed
(the error) / steps aside (why) / Gluon, with the registers, local memory (spills) and shared memory
of its launches (the most of each). Exit status 1 if a launch fails to compile or to be recorded.

    PYTHONPATH=src .venv/bin/python benchmarks/compile_table.py                      # the H200 table
    PYTHONPATH=src .venv/bin/python benchmarks/compile_table.py --table T.json --only dense11 --cache /tmp/c

Launch work the CPU cannot mirror: a launcher that asks ``x.is_cuda`` (fixed12's side exception pass)
takes its CPU branch; SM counts are the H200's (132). ``tall_wide`` (N >= 65536 and K > N: 2^32
weights at least) is not built.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compile_sm90 as cs  # noqa: E402  (the recorder and the compile step)

log = logging.getLogger("compile_table")

TABLE = Path(__file__).resolve().parents[1] / "src/glyd/kernels/tables/NVIDIA_H200.json"
#: N x K a shape class is launched at: Qwen2.5-7B's matrices, else a real model's, else the smallest of the class
SHAPES = {
    "kv": (512, 3584, "Qwen2.5-7B k/v"), "qo": (3584, 3584, "Qwen2.5-7B q/o"),
    "qkv": (4608, 3584, "Qwen2.5-7B q, k, v merged"), "gate": (18944, 3584, "Qwen2.5-7B gate/up"),
    "big": (37888, 3584, "Qwen2.5-7B gate, up merged"), "tall": (3584, 18944, "Qwen2.5-7B down"),
    "wide": (151936, 768, "a Qwen vocab at K 768"), "wide_big": (151936, 896, "Qwen2.5-0.5B lm_head"),
    "tall_small": (1536, 8960, "Qwen2.5-1.5B down"), "tall_tiny": (256, 8192, "the class's corner"),
    "wide_small": (65536, 256, "the class's corner"), "wide_tiny": (65536, 64, "the class's corner"),
    "tall_wide": None,
}
#: KV problems: (page tokens, head dim); 4 KV heads, 7 query heads each (Qwen2.5-7B's grouping)
KV_SHAPES = [(64, 128), (32, 128), (64, 64), (32, 64)]
KV_HEADS, KV_GROUP = 4, 7
H200_SMS = 132


def devices():
    """The H200 as ``can_implement`` sees it, and the same without Gluon (a family refused there is Gluon)."""
    from glyd.kernels.registry import Device

    full = Device("cuda", "NVIDIA H200", (9, 0), H200_SMS, False, frozenset({"gluon", "wgmma", "tma"}))
    return full, dataclasses.replace(full, features=frozenset())


def packings(layout: str) -> list:
    """The packers of ``layout``: ``glyd.pack``, then each older format version its codec still writes."""
    import importlib

    import glyd

    out = [lambda w: glyd.pack(w, layout)]
    codec = importlib.import_module(f"glyd.codec.{layout}")
    for old in ("pack_v2", "pack_v1"):  # dense11 writes version 3; version 2 and 1 files still load
        if hasattr(codec, old):
            out.append(getattr(codec, old))
    return out


@dataclasses.dataclass
class Cell:
    """One candidate of a table cell and what became of it."""

    where: str  # e.g. linear.fixed12.gate.5-8
    index: int  # its place in the cell's list
    kernel: str
    config: dict
    status: str = ""  # launched / steps aside: why / gluon / torch / not built: why / launch failed: why
    keys: list = dataclasses.field(default_factory=list)
    shape: str = ""
    params: tuple = ()  # a kv cell's (page, head dim, "pool" or "store")


def linear_cells(table: dict, only: set) -> dict[tuple, list[Cell]]:
    """The table's linear candidates grouped by (layout, shape class): cells sharing one packed matrix."""
    groups: dict[tuple, list[Cell]] = defaultdict(list)
    for layout, classes in table["linear"].items():
        if only and layout not in only:
            continue
        for cls, buckets in classes.items():
            for bucket, cands in buckets.items():
                for i, c in enumerate(cands):
                    groups[layout, cls].append(Cell(f"linear.{layout}.{cls}.{bucket}", i, c["kernel"], c["config"]))
    return groups


def launch_linear(rec, cells: list[Cell], layout: str, cls: str, gen) -> None:
    """Pack the class's shape (each format version) and launch every candidate of ``cells`` on it."""
    import torch

    from glyd.kernels.registry import M_BUCKETS, kernel_class

    if SHAPES.get(cls) is None:
        for c in cells:
            c.status = "not built: the class's smallest matrix has 2^32 weights"
        return
    n, k, what = SHAPES[cls]
    w = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
    packs = [pack(w) for pack in packings(layout)]
    del w
    for c in cells:
        bucket = c.where.rsplit(".", 1)[1]
        m = next(lo for b, lo, _ in M_BUCKETS if b == bucket)
        x2 = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        launch_candidate(rec, c, kernel_class(c.kernel), x2, packs)
        c.shape = f"{n}x{k} ({what}){c.shape}, M {m}"


def launch_candidate(rec, c: Cell, kc, x2, packs: list) -> None:
    """Launch ``c`` on each packing of its matrix that its family takes on an H200 (every format version
    it reads: an older file runs other kernels)."""
    import torch

    from glyd.kernels import _problem

    full, plain = devices()
    whys, versions = [], []
    for p in packs:
        problem = _problem(x2, p)
        try:
            cfg = kc.make_config(dict(c.config), problem)
        except (TypeError, ValueError) as exc:
            c.status = f"bad config: {exc}"
            return
        ok, why = kc.can_implement(problem, full, cfg)
        if not ok:
            whys.append(why)
            continue
        versions.append(f"v{getattr(p, 'version', 1)}")
        if not kc.can_implement(problem, plain, cfg)[0]:
            c.status = "gluon"
            continue
        out = torch.empty(x2.shape[0], p.shape[0], dtype=torch.bfloat16)
        record(rec, c, lambda: kc.launch(x2, p, None, cfg, out))
    if len(packs) > 1 and versions:
        c.shape = f" {'+'.join(versions)}"
    if not versions:
        c.status = "steps aside: " + "; ".join(dict.fromkeys(whys))


def record(rec, cell: Cell, launch) -> None:
    """Run ``launch`` (record-only) and add the launches it made to ``cell``'s (a failure stays)."""
    rec.trail.clear()
    try:
        launch()
        status = "launched" if rec.trail else "launched nothing"
    except Exception as exc:
        status = f"launch failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    cell.keys += rec.trail
    if not cell.status.startswith(("launch failed", "launched nothing")):
        cell.status = status


def kv_cells(table: dict) -> list[Cell]:
    """The table's kv candidates, once for each of ``KV_SHAPES`` (and, for kvf12 attention, pool and store)."""
    out = []
    for code, ops in table.get("kv", {}).items():
        for op, cands in ops.items():
            for i, c in enumerate(cands):
                for page, d in KV_SHAPES:
                    wheres = ("pool", "store") if (code, op) == ("kvf12", "attention") else (
                        ("pool",) if code == "kvf12" else ("store",))
                    for where in wheres:
                        cell = Cell(f"kv.{code}.{op}", i, c["kernel"], c["config"], params=(page, d, where))
                        cell.shape = f"page {page}, head dim {d}, {where}"
                        out.append(cell)
    return out


def launch_kv(rec, c: Cell, gen) -> None:
    """Launch one kv candidate at ``c.params`` (a decode step over two pages and a tail; a prompt's write)."""
    from glyd.kv.registry import KVProblem, kernel_class

    page, d, where = c.params
    code, op = c.where.split(".")[1:]
    if c.kernel.endswith("_torch"):
        c.status = "torch twin: nothing to compile"
        return
    kc = kernel_class(c.kernel)
    cfg = kc.Config(**c.config)
    full, plain = devices()
    problem = KVProblem(code, op, page, d, d, 1 if op == "write" else KV_GROUP, where)
    ok, why = kc.can_implement(problem, full, cfg)
    if not ok:
        c.status = f"steps aside: {why}"
    elif not kc.can_implement(problem, plain, cfg)[0]:
        c.status = "gluon"
    else:
        record(rec, c, kv_launch(kc, cfg, code, op, where, page, d, gen))


def kv_launch(kc, cfg, code: str, op: str, where: str, page: int, d: int, gen):
    """A no-argument call of ``kc.launch`` with KV data of the problem (stores and pools on the CPU)."""
    import math

    import torch

    from glyd.kv import PageStore
    from glyd.kv.attention import _lens
    from glyd.kv.fixed import FixedPageStore, store_view
    from glyd.kv.pool import FixedPagePool

    t = 2 * page + 5
    k, v = (torch.randn(1, KV_HEADS, t, d, generator=gen).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(1, KV_HEADS * KV_GROUP, d, generator=gen).to(torch.bfloat16)
    scale = 1 / math.sqrt(d)
    if where == "pool":
        pool = FixedPagePool(1, 1, KV_HEADS, d, t, page=page)
        lens = pool.lens + t
        if op == "write":
            lo, codes, base, meta, exc, raw = pool.k.layer(0)
            return lambda: kc.launch(k, lens, pool.block_index, lo, codes, base, meta, exc, pool.k.used[0], raw,
                                     config=cfg)
        return lambda: kc.launch(q, lens, None, pool.block_index, pool.k.layer(0), pool.v.layer(0), scale, config=cfg)
    if code == "kvf12":
        ks, vs = FixedPageStore.from_bf16(k, page=page), FixedPageStore.from_bf16(v, page=page)
        bidx, kside, vside = store_view(ks, vs)
        lens = _lens(ks, q.device).to(torch.int32)
        return lambda: kc.launch(q, lens, None, bidx, kside, vside, scale, config=cfg, capped=False)
    ks, vs = PageStore.from_bf16(k, page=page), PageStore.from_bf16(v, page=page)
    return lambda: kc.launch(q, ks, vs, _lens(ks, q.device), scale, None, None, config=cfg)


def compile_cells(rec, cells: list[Cell], workers: int, cache: str | None) -> dict[str, dict]:
    """Compile each distinct launch the cells made (``compile_sm90.compile_all``): dedup key -> result."""
    keys = list(dict.fromkeys(k for c in cells for k in c.keys if not k.startswith("!")))
    os.environ["TRITON_INTERPRET"] = "0"  # the workers compile
    folder = cache or tempfile.mkdtemp(prefix="compile-table-cache-")
    os.environ["TRITON_CACHE_DIR"] = folder
    print(f"{len(keys)} distinct launches; compiling for sm_90 ({workers} processes, cache {folder})", flush=True)
    try:
        results = cs.compile_all([rec.jobs[k] for k in keys], workers)
    finally:
        if not cache:
            shutil.rmtree(folder, ignore_errors=True)
    return dict(zip(keys, results))


def verdict(c: Cell, results: dict[str, dict], jobs: dict) -> tuple[str, dict]:
    """(compiled / FAILED: error / the cell's status, max REG, LOCAL, SHARED of its launches)."""
    use = {"REG": 0, "LOCAL": 0, "SHARED": 0}
    if c.status != "launched":
        failed = c.status.startswith(("launch failed", "launched nothing", "bad config"))
        return ("FAILED: " if failed else "") + c.status, use
    errors = [k[1:] for k in c.keys if k.startswith("!")]
    for k in c.keys:
        if k.startswith("!"):
            continue
        res = results[k]
        error = res.get("error") or cs.launch_problem(res)
        if error:
            module, qualname, _, consts = jobs[k][:4]
            errors.append(f"{module}:{qualname} {jobs[k][5]} constexprs {consts}: {error}")
            continue
        use["REG"] = max(use["REG"], res.get("REG", 0))
        use["LOCAL"] = max(use["LOCAL"], res.get("LOCAL", 0) + res.get("STACK", 0))
        use["SHARED"] = max(use["SHARED"], res.get("SHARED", 0))
    return ("FAILED: " + "; ".join(errors)) if errors else "compiled", use



@contextlib.contextmanager
def h200_sm_counts():
    """The launchers' SM counts (splits, programs) as the H200's while recording."""
    import glyd.kernels._common as common
    import glyd.kv._triton as kvt

    saved = common.sm_count, kvt._sm_count
    common.sm_count = kvt._sm_count = lambda device: H200_SMS
    try:
        yield
    finally:
        common.sm_count, kvt._sm_count = saved


def launch_all(table: dict, only: set) -> tuple[object, list[Cell]]:
    """Record (not run) every candidate's launches: (the recorder, the cells in table order)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    rec = cs.Recorder()
    rec.install(gpu=True, execute=False)
    cells: list[Cell] = []
    try:
        with h200_sm_counts():
            for (layout, cls), group in linear_cells(table, only).items():
                t0 = time.perf_counter()
                launch_linear(rec, group, layout, cls, gen)
                log.info("linear.%s.%s: %d candidates in %.1f s", layout, cls, len(group), time.perf_counter() - t0)
                cells += group
            for c in kv_cells(table) if not only or "kv" in only else ():
                launch_kv(rec, c, gen)
                cells.append(c)
    finally:
        rec.uninstall()
    return rec, cells


def report(cells: list[Cell], results: dict[str, dict], jobs: dict) -> int:
    """Print a row a candidate and the counts; the number of failures."""
    print("\n| cell | # | kernel | config | shape | result | regs | local B | shared B |")
    print("|---|---|---|---|---|---|---|---|---|")
    counts: dict[str, int] = defaultdict(int)
    failures = []
    for c in cells:
        text, use = verdict(c, results, jobs)
        kind = text.split(":")[0].split(" (")[0]
        counts["failed" if kind == "FAILED" else kind] += 1
        if kind == "FAILED":
            failures.append((c, text))
        config = ", ".join(f"{k}={v}" for k, v in c.config.items())
        nums = f"{use['REG']} | {use['LOCAL']} | {use['SHARED']}" if text == "compiled" else " | | "
        print(f"| {c.where} | {c.index} | {c.kernel} | {config} | {c.shape} | {text} | {nums} |")
    for c, text in failures:
        print(f"\nFAILED {c.where} #{c.index} {c.kernel} {c.config} at {c.shape}\n    {text}")
    print("\n" + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f" ({len(cells)} candidates)")
    return len(failures)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", default=str(TABLE), help="the table (default: the H200's)")
    ap.add_argument("--only", default="", help="comma-separated layouts (and/or 'kv') to launch (default: all)")
    ap.add_argument("--workers", type=int, default=2, help="compile processes (2 at most on a shared machine)")
    ap.add_argument("--cache", help="Triton cache folder for the compiles (default: a new, empty one)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ["TRITON_INTERPRET"] = "1"  # before anything defines a kernel
    import json

    from glyd.kernels.registry import check_table

    table = json.loads(Path(args.table).read_text(encoding="utf-8"))
    check_table(table, args.table)
    t0 = time.perf_counter()
    rec, cells = launch_all(table, {s for s in args.only.split(",") if s})
    t1 = time.perf_counter()
    results = compile_cells(rec, cells, max(1, min(args.workers, 2)), args.cache)
    failed = report(cells, results, rec.jobs)
    experts = sum(len(c) for cells_ in table.get("experts", {}).values() for c in cells_.values())
    print(f"experts section: {experts} candidates (not launched: their products take expert ids; "
          "compile_sm90.py's tests/kernels run compiles what the experts tests launch)")
    print(f"{args.table}: launches recorded in {t1 - t0:.0f} s, compiled in {time.perf_counter() - t1:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
