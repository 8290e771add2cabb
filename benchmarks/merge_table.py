"""Copy the measured cells of a sweep's table (``sweep_shapes.py --table``) into a GPU's kernel table.

The sweep's table is a whole table: its measured ``linear.fixed12`` cells (listed under ``measured``)
and the fallback's everywhere else. This takes only the measured cells into ``TARGET`` (e.g.
``src/glyd/kernels/tables/NVIDIA_H200.json``), keeps every other cell and part (``kv``, ``layout``,
``linear.dense11``) as it was, adds an ``about`` line naming the run, checks the result as the sweep
checks its own, and writes it whole or not at all.

    PYTHONPATH=src .venv/bin/python benchmarks/merge_table.py sweep44_table.json \\
        src/glyd/kernels/tables/NVIDIA_H200.json --note "round 44 at 0.1% exceptions (history/2026-12-06-h200-21.md)"
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_shapes  # noqa: E402  (the table's checks and layout)


def merge(sweep: dict, target: dict, note: str, buckets: list[str] | None = None) -> tuple[dict, list[str]]:
    """``target`` with ``sweep``'s measured fixed12 cells in place of its own (only those of ``buckets`` if
    given); (table, the cells taken)."""
    cells = sweep.get("measured")
    if not isinstance(cells, list) or not cells:
        raise ValueError("the sweep's table lists no measured cells (a 'measured' list: sweep_shapes.py --table "
                         "writes it since 2026-12-06)")
    if buckets is not None:
        cells = [c for c in cells if c[1] in buckets]
        if not cells:
            raise ValueError(f"the sweep measured no cell in the buckets {', '.join(buckets)}")
    if sweep.get("gpu") != target.get("gpu"):
        raise ValueError(f"the sweep ran on {sweep.get('gpu')!r}, the target table is {target.get('gpu')!r}'s")
    out = json.loads(json.dumps(target))
    fixed = out["linear"].setdefault("fixed12", {})
    taken = []
    for cls, bucket in cells:
        fixed.setdefault(cls, {})[bucket] = sweep["linear"]["fixed12"][cls][bucket]
        taken.append(f"{cls} {bucket}")
    from glyd.kernels import registry
    order = [b for b, _, _ in registry.M_BUCKETS]
    for cls in fixed:
        fixed[cls] = {b: fixed[cls][b] for b in order if b in fixed[cls]}
    out["about"] = [f"{note}: linear.fixed12 cells {', '.join(taken)} from that sweep's table."] + list(out.get("about", []))
    sweep_shapes.check_table(out)
    return out, taken


def render(table: dict, old_text: str) -> str:
    """``table`` laid out as ``old_text`` (the target file) was: its ``about`` on one line or a line an entry as
    before, ``linear`` as the sweep writes it, every part after ``linear`` (``layout``, ``kv``) verbatim."""
    lines = old_text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith('  "')]
    keys = [lines[i].split('"')[1] for i in starts]
    if keys[:3] != ["gpu", "about", "linear"]:
        raise ValueError(f"the target table's parts are {keys}: expected gpu, about, linear first")
    head = sweep_shapes.dump_table({"gpu": table["gpu"], "about": table["about"], "linear": table["linear"]})
    head = head.splitlines()[:-2] + ["  }" + ("," if len(keys) > 3 else "")]  # up to linear's end
    if starts[2] - starts[1] > 1:  # about one entry a line
        about = ["  \"about\": ["] + [f"    {json.dumps(a)}," for a in table["about"]]
        about[-1] = about[-1][:-1]
        head = head[:2] + about + ["  ],"] + head[3:]
    tail = lines[starts[3]:] if len(keys) > 3 else ["}"]
    return "\n".join(head + tail) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", help="the sweep's table (sweep_shapes.py --table)")
    ap.add_argument("target", help="the GPU's kernel table to update in place")
    ap.add_argument("--note", required=True, help="the about line's start: which run, where it is recorded")
    ap.add_argument("--buckets", help="only these M buckets' cells, comma-separated (e.g. 65-128)")
    args = ap.parse_args(argv)
    buckets = args.buckets.split(",") if args.buckets else None
    with open(args.sweep, encoding="utf-8") as f:
        sweep = json.load(f)
    with open(args.target, encoding="utf-8") as f:
        target = json.load(f)
    try:
        table, taken = merge(sweep, target, args.note, buckets)
        text = render(table, open(args.target, encoding="utf-8").read())
        if json.loads(text) != table:
            raise ValueError("the rendered table does not read back as the merged one")
    except (ValueError, KeyError) as e:
        sys.exit(f"merge_table: {e}")
    sweep_shapes.write_atomic(args.target, text)
    print(f"{args.target}: {len(taken)} cells from {args.sweep}: {', '.join(taken)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
