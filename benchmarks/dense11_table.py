"""Write the dense11 cells a ``dense11_step.py`` run measured into a GPU's kernel table.

``dense11_step.py --out DIR`` times the registry's dense11 choice (column ``dense11``) beside config columns (``gemv
SPEC``: ``dense11_v3_gemv``; ``wg SPEC``: ``dense11_wgmma``; ``long SPEC``: ``dense11_unpack_cublas``) on one merged
decode step of a Qwen2.5-7B shape (qkv, o, gate_up, down and the lm_head) at each M. Where a column's step is faster
than the registry's choice by more than ``--margin`` at an M, its kernel and config become the first candidate of
that M's bucket in the target table's ``linear.dense11`` cells of the step's shape classes (the cell's other
candidates follow; the GPU's fallback table's after them); every other cell and part stays as it was, an ``about``
line names the run, the table is checked as ``sweep_shapes.py`` checks its own and written whole or not at all. The
step is one measure of all its shapes: each of its classes gets the step's winner.

    PYTHONPATH=src .venv/bin/python benchmarks/dense11_table.py DIR/dense11_step.json \\
        src/glyd/kernels/tables/NVIDIA_H100_80GB_HBM3.json --note "2026-12-07, an H100 (history/...)"
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import merge_table  # noqa: E402
import sweep_shapes  # noqa: E402

#: the step's shapes (N, K) where its JSON does not list them (runs before 2026-12-07's): a Qwen2.5-7B layer, merged
STEP_SHAPES = ((4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944), (152064, 3584))


def candidate(label: str) -> dict:
    """The table candidate of a ``dense11_step.py`` column: ``"wg bm=64,pipe=1"`` or ``"gemv bn=32,..."`` (the
    config's fields that differ from its defaults).

    >>> candidate("wg bm=32,pipe=1")
    {'kernel': 'dense11_wgmma', 'config': {'bm': 32, 'pipe': True}}
    >>> candidate("long unpack=wg")
    {'kernel': 'dense11_unpack_cublas', 'config': {'unpack': 'wg'}}
    """
    import dense11_step

    kind, _, spec = label.partition(" ")
    if kind == "wg":
        name, cfg = "dense11_wgmma", dense11_step.wg_spec(spec)
    elif kind == "gemv":
        name, cfg = "dense11_v3_gemv", dense11_step.gemv_spec(spec)
    elif kind == "long":
        name, cfg = "dense11_unpack_cublas", dense11_step.long_spec(spec)
    else:
        raise ValueError(f"not a config column of dense11_step.py: {label!r}")
    default = type(cfg)()
    return {"kernel": name, "config": {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
                                       if getattr(cfg, f.name) != getattr(default, f.name)}}


def winners(step: dict, margin: float) -> dict[str, tuple[str, float]]:
    """{M bucket: (column, its time / the registry's choice's)} where a config column beat the registry's choice
    by more than ``margin`` (the fastest column of the M)."""
    from glyd.kernels import registry

    out = {}
    for m, times in step["ms"].items():
        base = times.get("dense11")
        cols = {c: t for c, t in times.items() if c.startswith(("wg ", "gemv ", "long "))}
        if not base or not cols:
            continue
        best = min(cols, key=cols.get)
        if cols[best] < base * (1 - margin):
            out[registry.m_bucket(int(m))] = (best, cols[best] / base)
    return out


def apply(step: dict, target: dict, note: str, margin: float) -> tuple[dict, list[str]]:
    """``target`` with the step's winning columns first in their buckets' dense11 cells; (table, cells taken)."""
    from glyd.kernels import registry

    if step.get("device") != target.get("gpu"):
        raise ValueError(f"the step ran on {step.get('device')!r}, the target table is {target.get('gpu')!r}'s")
    won = winners(step, margin)
    if not won:
        raise ValueError("no config column beat the registry's choice at any M: nothing to write")
    classes = sorted({registry.shape_class(n, k) for n, k in step.get("shapes") or STEP_SHAPES})
    out = json.loads(json.dumps(target))
    dense = out["linear"].setdefault("dense11", {})
    taken = []
    for bucket, (label, ratio) in sorted(won.items(), key=lambda kv: int(kv[0].split("-")[0].rstrip("+"))):
        cand = candidate(label)
        for cls in classes:
            cell = dense.setdefault(cls, {}).get(bucket, [])
            dense[cls][bucket] = [cand] + [c for c in cell if c != cand]
        taken.append(f"{bucket}: {label} ({ratio:.3f} of the registry's step)")
    order = [b for b, _, _ in registry.M_BUCKETS]
    for cls in dense:
        dense[cls] = {b: dense[cls][b] for b in order if b in dense[cls]}
    out["about"] = [f"{note}: linear.dense11 cells of {', '.join(classes)} from dense11_step.py's columns, "
                    f"M buckets {'; '.join(taken)}."] + list(out.get("about", []))
    sweep_shapes.check_table(out)
    return out, taken


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", help="dense11_step.json of a dense11_step.py run with --wg or --gemv columns")
    ap.add_argument("target", help="the GPU's kernel table to update in place")
    ap.add_argument("--note", required=True, help="the about line's start: which run, where it is recorded")
    ap.add_argument("--margin", type=float, default=0.03, help="how much faster a column must be (0.03: 3%%)")
    args = ap.parse_args(argv)
    with open(args.step, encoding="utf-8") as f:
        step = json.load(f)
    with open(args.target, encoding="utf-8") as f:
        text = f.read()
    try:
        table, taken = apply(step, json.loads(text), args.note, args.margin)
        new = merge_table.render(table, text)
        if json.loads(new) != table:
            raise ValueError("the rendered table does not read back as the updated one")
    except (ValueError, KeyError) as e:
        sys.exit(f"dense11_table: {e}")
    sweep_shapes.write_atomic(args.target, new)
    print(f"{args.target}: {'; '.join(taken)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
