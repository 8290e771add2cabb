"""benchmarks/merge_table.py: a sweep's measured cells into a GPU's table, every other part kept verbatim."""

import copy
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import merge_table  # noqa: E402

TABLES = ROOT / "src" / "glyd" / "kernels" / "tables"


@pytest.mark.parametrize("name", ["NVIDIA_H200.json", "NVIDIA_H100_80GB_HBM3.json"])
def test_merge_takes_the_measured_cells_only(tmp_path, name):
    text = (TABLES / name).read_text(encoding="utf-8")
    target = json.loads(text)
    donor = json.loads((TABLES / ("NVIDIA_H100_80GB_HBM3.json" if "H200" in name else "NVIDIA_H200.json")).read_text())
    sweep = copy.deepcopy(target)
    cls, bucket = "qkv", "2"
    new_cell = donor["linear"]["fixed12"]["big"]["65-128"]
    sweep["linear"]["fixed12"][cls][bucket] = new_cell
    sweep["linear"]["fixed12"]["qo"]["2"] = []  # changed but not measured: must not be taken
    sweep["measured"] = [[cls, bucket]]
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    out = tmp_path / name
    out.write_text(text, encoding="utf-8")
    assert merge_table.main([str(tmp_path / "sweep.json"), str(out), "--note", "a test run"]) == 0
    merged = json.loads(out.read_text(encoding="utf-8"))
    assert merged["linear"]["fixed12"][cls][bucket] == new_cell
    assert merged["linear"]["fixed12"]["qo"] == target["linear"]["fixed12"]["qo"]
    assert merged["about"][0].startswith("a test run: linear.fixed12 cells qkv 2")
    assert merged["about"][1:] == target["about"]
    rest = {k: v for k, v in merged.items() if k not in ("about", "linear")}
    assert rest == {k: v for k, v in target.items() if k not in ("about", "linear")}
    new_text = out.read_text(encoding="utf-8")
    for key in [k for k in target if k not in ("gpu", "about", "linear")]:  # the parts after linear, verbatim
        start = text.index(f'\n  "{key}"')
        assert text[start:] in new_text


def test_merge_refuses_a_sweep_without_measured_cells_or_of_another_gpu(tmp_path):
    target = json.loads((TABLES / "NVIDIA_H200.json").read_text(encoding="utf-8"))
    with pytest.raises(ValueError, match="no measured cells"):
        merge_table.merge(dict(target), target, "x")
    other = dict(target, gpu="NVIDIA H100 80GB HBM3", measured=[["qkv", "2"]])
    with pytest.raises(ValueError, match="ran on"):
        merge_table.merge(other, target, "x")


def test_merge_takes_only_the_buckets_asked_for():
    target = json.loads((TABLES / "NVIDIA_H200.json").read_text(encoding="utf-8"))
    sweep = copy.deepcopy(target)
    fixed = sweep["linear"]["fixed12"]
    fixed["big"]["65-128"] = [{"kernel": "fixed12_unpack_cublas", "config": {"chunk": 0}}]
    fixed["qkv"]["2"] = [{"kernel": "fixed12_unpack_cublas", "config": {"chunk": 0}}]
    sweep["measured"] = [["qkv", "2"], ["big", "65-128"]]
    merged, taken = merge_table.merge(sweep, target, "x", ["65-128"])
    assert taken == ["big 65-128"]
    assert merged["linear"]["fixed12"]["big"]["65-128"] == fixed["big"]["65-128"]
    assert merged["linear"]["fixed12"]["qkv"]["2"] == target["linear"]["fixed12"]["qkv"]["2"]
    with pytest.raises(ValueError, match="no cell in the buckets 129-255"):
        merge_table.merge(sweep, target, "x", ["129-255"])
