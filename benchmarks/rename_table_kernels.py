"""Rewrite a kernel table (``src/glyd/kernels/tables/<GPU>.json``) from the kernel family keys of
before 2026-12-03 (``gemv``, ``tc``, ``mma``, ``tile``, ``gluon``, ``wg``, ``ws``, ``long``,
``tiered_long``, ``dense11_long``) to the keys that say what each family is (``fixed12_gemv``,
``fixed12_word_dot``, ...). Nothing else changes: the rewrite replaces the ``"kernel"`` values in
place (the file's formatting kept) and checks that the result parses to the same table with only
those values renamed. Keys already new are left as they are, so running it twice changes nothing.
The rewrite of the H200 table was proved to choose as before in every (layout, shape class, M
bucket) on six device kinds by tests/kernels/test_table_rename.py, a one-time proof removed with the
old table after it passed (``git log -- tests/kernels/test_table_rename.py`` finds the commit).

    python benchmarks/rename_table_kernels.py src/glyd/kernels/tables/NVIDIA_H200.json [more tables]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

#: Old family key -> new family key (docs/kernels.md describes each family).
RENAMES = {
    "gemv": "fixed12_gemv",
    "tc": "fixed12_word_dot",
    "mma": "fixed12_operand_dot",
    "tile": "fixed12_byte_dot",
    "gluon": "fixed12_mma_v2",
    "wg": "fixed12_wgmma",
    "ws": "fixed12_wgmma_warpspec",
    "long": "fixed12_unpack_cublas",
    "tiered_long": "tiered_unpack_cublas",
    "dense11_long": "dense11_unpack_cublas",
}

_KERNEL = re.compile(r'("kernel"\s*:\s*")([A-Za-z0-9_]+)(")')


def _renamed(table: dict) -> dict:
    """``table`` with every candidate's kernel key renamed (the expected result, built from the parse)."""
    out = json.loads(json.dumps(table))
    for classes in out.get("linear", {}).values():
        for buckets in classes.values():
            for cands in buckets.values():
                for c in cands:
                    c["kernel"] = RENAMES.get(c["kernel"], c["kernel"])
    return out


def rewrite(text: str) -> str:
    """The table text with the old kernel keys replaced by the new ones; raises if anything else changed."""
    new = _KERNEL.sub(lambda m: m.group(1) + RENAMES.get(m.group(2), m.group(2)) + m.group(3), text)
    if json.loads(new) != _renamed(json.loads(text)):
        raise ValueError("the rewrite changed more than the kernel keys (a \"kernel\" string outside a candidate?)")
    return new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", nargs="+", type=Path)
    args = ap.parse_args(argv)
    for path in args.tables:
        text = path.read_text(encoding="utf-8")
        new = rewrite(text)
        n = sum(1 for m in _KERNEL.finditer(text) if m.group(2) in RENAMES)
        if new != text:  # whole or not at all: a temporary name in the same folder, then a rename
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(new, encoding="utf-8")
            os.replace(tmp, path)
        print(f"{path}: {n} candidates renamed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
