"""benchmarks/README.md indexes every script of benchmarks/ (and names no script that is gone)."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_index_names_every_script():
    text = (BENCH / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([a-z0-9_]+\.py)`", text))
    scripts = {p.name for p in BENCH.glob("*.py")}
    assert scripts - named == set(), "scripts missing from benchmarks/README.md"
    assert {n for n in named if not (BENCH / n).exists() and not (BENCH / "probes" / n).exists()
            and not n.startswith("test_")} == set(), "benchmarks/README.md names scripts that are gone"
