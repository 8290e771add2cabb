"""Every number README.md states is one benchmarks/RESULTS.md (or a history file it links) holds.

A number is a run of digits (with thousands commas and a decimal part) standing on its own or before
``x`` or ``%`` (``0.752``, ``2.1-2.9x``, ``553-579``, ``143,771``); digits inside a name (``bf16``,
``fixed12``, ``Qwen2.5-7B``, ``H200``) are not numbers. Each must appear as a number in the corpus:
RESULTS.md and every ``history/*.md`` it links. A figure quoted rounded, or from a run RESULTS.md
does not link, fails here: quote it as RESULTS.md has it, or put its run there.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
#: Numbers in README.md that are no measurement, with why.
NOT_FIGURES = {"3.10": "the Python version the package needs"}
NUMBER = re.compile(r"(?<![A-Za-z0-9_.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![A-Za-z_](?<![x%]))(?![0-9])")


def numbers(text: str) -> set[str]:
    """The numbers of ``text`` (see the module docstring), as written."""
    out = set()
    for m in NUMBER.finditer(text):
        nxt = text[m.end():m.end() + 1]
        if nxt.isalpha() and nxt != "x":
            continue
        out.add(m.group(1) + (m.group(2) or ""))
    return out


def corpus() -> tuple[str, list[Path]]:
    text = RESULTS.read_text(encoding="utf-8")
    linked = sorted({RESULTS.parent / p for p in re.findall(r"\((history/[^)\s]+\.md)\)", text)})
    missing = [p for p in linked if not p.is_file()]
    assert not missing, f"RESULTS.md links files that do not exist: {missing}"
    return text + "\n".join(p.read_text(encoding="utf-8") for p in linked), linked


def test_numbers_are_found_as_written():
    assert numbers("fixed12 bf16 Qwen2.5-7B H200 at 0.752 of bf16, 2.1-2.9x, 553-579 MB/s, 143,771 MiB, 95%, 16K") \
        == {"0.752", "2.1", "2.9", "553", "579", "143,771", "95"}


def test_every_readme_number_is_in_results():
    source, linked = corpus()
    assert linked, "RESULTS.md links no history file"
    have = numbers(source)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = sorted(numbers(readme) - have - set(NOT_FIGURES), key=lambda s: float(s.replace(",", "")))
    assert missing == [], f"README.md numbers not in benchmarks/RESULTS.md or a history file it links: {missing}"
