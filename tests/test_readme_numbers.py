"""Every number README.md and docs/*.md state is one benchmarks/RESULTS.md (or a history file it links) holds.

A number is a run of digits (with thousands commas and a decimal part) standing on its own or before
``x`` or ``%`` (``0.752``, ``2.1-2.9x``, ``553-579``, ``143,771``); digits inside a name (``bf16``,
``fixed12``, ``Qwen2.5-7B``, ``H200``) are not numbers. Each must appear as a number in the corpus:
RESULTS.md and every ``history/*.md`` it links. A figure quoted rounded, or from a run RESULTS.md
does not link, fails here: quote it as RESULTS.md has it, or put its run there. A number that is
no measurement (a version, a port, a format field, an example value) goes in ``NOT_FIGURES`` under
its file, with a one-line reason.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
#: Numbers in README.md and docs/*.md that are no measurement, with why, by file.
NOT_FIGURES: dict[str, dict[str, str]] = {
    "README.md": {"3.10": "the Python version the package needs"},
    "docs/architecture.md": {"600": "the size rule for files (lines), a definition"},
    "docs/eval.md": {
        "131": "the size of the text sample shipped in glyd/apps/eval_data (131,058 characters)",
        "3090": "a GPU's name (RTX 3090) among --gpu's choices",
        "4090": "a GPU's name (RTX 4090), in an example command and among --gpu's choices",
        "6000": "a GPU's name (RTX 6000 Ada) among --gpu's choices",
        "32768": "an example --context value in a code snippet",
    },
    "docs/format.md": {
        "00001": "the shard file name pattern model-00001-of-0000N.safetensors",
        "154": "a golden byte of the dense11 example (sm[0, :8])",
        "210": "the element count of the dense11 golden example's linspace",
        "249": "the range of dense11's base field (format field)",
        "1023": "the last column of a 1024-column block (format definition)",
        "4,300": "Python's default int-digit limit, a constant of the JSON reader",
        "32768": "the largest superblock area in bytes (format field bound)",
        "65535": "the bound on P * D of a KV page (format field bound)",
        "16777184": "a golden int32 word of the dense11 example's code plane",
        "16777215": "a golden int32 word of the dense11 example's code plane",
        "19088744": "a golden int32 word of the dense11 example's esc array",
        "285212671": "a golden int32 word of the dense11 example's esc array",
        "1985229327": "a golden int32 word of the dense11 example's esc array",
        "16777224": "a golden int32 word of the dense11 version-2 example's esc array",
        "17477": "a golden int32 word of the dense11 version-2 example's code words",
        "4473924": "a golden int32 word of the dense11 version-2 example's code words",
        "53687092": "a golden int32 word of the dense11 version-2 example's code words",
        "858923554": "a golden int32 word of the dense11 version-2 example's code words",
        "876889157": "a golden int32 word of the dense11 version-2 example's code words",
        "1127428916": "a golden int32 word of the dense11 version-2 example's code words",
        "2004318071": "a golden int32 word of the dense11 version-2 example's code words",
    },
    "docs/models.md": {
        "1.1": "a version (accelerate 1.1.0)",
        "5.24": "a version (transformers 5.24.0)",
        "1,000": "ImageNet's class count in the ViT model names, a definition",
        "805": "a size by arithmetic, no measurement: the grouped experts' scratch, 128 x 1536 x 2048 x 2 bytes (MB)",
        "9.00": "an example memory_limit (9 GiB) in the memory_limit section's log lines",
        "10.00": "an example memory_limit (10 GiB) in the memory_limit section's log lines",
        "40.00": "an example memory_limit (40 GiB) in the memory_limit section's log lines",
        "9.62": "a size by arithmetic (glyd fit's count of Qwen2.5-7B in tiered at 10.85 bits), no measurement",
        "10.68": "a size by arithmetic (glyd fit's count of Qwen2.5-7B in fixed12 at 12.05 bits), no measurement",
        "9.99": "a size by arithmetic (glyd fit's count of Qwen2.5-7B in dense11 at 11.25 bits and its per-row tables), "
                "no measurement",
    },
    "docs/serving.md": {
        "5.24": "a version (transformers 5.24)",
        "404": "an HTTP status code",
        "8000": "the server's default port",
    },
}
#: The Markdown files whose numbers are checked.
DOCS = ["README.md"] + sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
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


@lru_cache(maxsize=1)
def corpus_numbers() -> frozenset[str]:
    return frozenset(numbers(corpus()[0]))


def test_numbers_are_found_as_written():
    assert numbers("fixed12 bf16 Qwen2.5-7B H200 at 0.752 of bf16, 2.1-2.9x, 553-579 MB/s, 143,771 MiB, 95%, 16K") \
        == {"0.752", "2.1", "2.9", "553", "579", "143,771", "95"}


def test_corpus_links_history():
    _, linked = corpus()
    assert linked, "RESULTS.md links no history file"


@pytest.mark.parametrize("name", DOCS)
def test_every_number_is_in_results(name):
    have = corpus_numbers()
    allowed = NOT_FIGURES.get(name, {})
    text = (ROOT / name).read_text(encoding="utf-8")
    missing = sorted(numbers(text) - have - set(allowed), key=lambda s: float(s.replace(",", "")))
    assert missing == [], f"{name} numbers not in benchmarks/RESULTS.md or a history file it links: {missing}"


def test_not_figures_are_current():
    """Every allow-listed number names a checked file, is still in it, and says why."""
    assert set(NOT_FIGURES) <= set(DOCS), f"NOT_FIGURES names unchecked files: {set(NOT_FIGURES) - set(DOCS)}"
    for name, allowed in NOT_FIGURES.items():
        stale = sorted(set(allowed) - numbers((ROOT / name).read_text(encoding="utf-8")))
        assert stale == [], f"NOT_FIGURES lists numbers {name} no longer states: {stale}"
        assert all(why.strip() for why in allowed.values()), f"NOT_FIGURES[{name!r}] has an empty reason"
