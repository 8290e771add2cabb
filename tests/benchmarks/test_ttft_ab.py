"""``benchmarks/ttft_ab.py --tiny``: bf16 and a Glyd model resident together, prefills interleaved,
ratios from the same rounds (on the CPU)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _ttft_ab():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("ttft_ab", BENCH / "ttft_ab.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def test_tiny_run_interleaves_and_reports_ratios_to_bf16(tmp_path):
    mod = _ttft_ab()
    assert mod.main(["--tiny", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "ab.json").read_text())
    assert [(r["size"], r["prompt"]) for r in results] == [("tiny", 16), ("tiny", 32)]
    for r in results:
        bf16, packed = r["variants"]["bf16"], r["variants"]["fixed12"]
        assert bf16["ratio"] == 1.0 and len(bf16["walls"]) == len(packed["walls"]) == 3
        ratios = sorted(w / b for w, b in zip(packed["walls"], bf16["walls"]))
        assert packed["ratio"] == ratios[1] and packed["ratio_min"] == ratios[0]  # the median of the rounds'
    assert all(r["prefill"] == "eager" for r in results)
    text = (tmp_path / "ab.md").read_text()
    assert "| tiny | 32 | fixed12 |" in text and "rounds, eager prefill" in text


@pytest.mark.slow  # 50 s on the 2-core CI machine with an empty inductor cache (two models, two prompt lengths)
def test_tiny_compiled_run_says_so(tmp_path):
    """``--compile`` through ``scale_parts.compile_prefill`` (inductor on the CPU): every result says so."""
    mod = _ttft_ab()
    assert mod.main(["--tiny", "--compile", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "ab.json").read_text())
    assert [r["prefill"] for r in results] == ['torch.compile(mode="reduce-overhead")'] * 2
    walls = [w for r in results for v in r["variants"].values() for w in v["walls"]]
    assert len(walls) == 12 and all(math.isfinite(w) and w > 0 for w in walls)
    assert 'rounds, torch.compile(mode="reduce-overhead") prefill' in (tmp_path / "ab.md").read_text()


def test_bad_arguments_are_refused_by_name(capsys):
    mod = _ttft_ab()
    with pytest.raises(SystemExit):
        mod.main(["--tiny", "--variants", "bf16"])
    assert "--variants takes Glyd layouts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mod.main(["--tiny", "--rounds", "0"])
    assert "--rounds must be >= 1" in capsys.readouterr().err
