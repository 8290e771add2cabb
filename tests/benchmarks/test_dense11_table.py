"""benchmarks/dense11_table.py: a dense11_step.py run's winning columns into a GPU's table's dense11 cells."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import dense11_table  # noqa: E402

TABLES = ROOT / "src" / "glyd" / "kernels" / "tables"


def _step(gpu, times):
    return {"device": gpu, "shapes": [[4608, 3584], [3584, 18944]], "ms": times}


def test_the_winning_columns_go_first_in_their_buckets(tmp_path):
    name = "NVIDIA_H200.json"
    text = (TABLES / name).read_text(encoding="utf-8")
    target = json.loads(text)
    step = _step(target["gpu"], {
        "1": {"bf16": 1.0, "dense11": 1.0, "wg bm=64": 1.5},  # the registry's choice wins: no cell
        "16": {"bf16": 1.0, "dense11": 1.2, "wg bm=64": 1.19, "wg bm=64,pipe=1": 1.1},  # 8% faster: pipe
        "32": {"bf16": 1.0, "dense11": 1.5, "wg bm=32": 1.0, "gemv bn=32,bk=128": 1.2},
        "64": {"bf16": 1.0, "dense11": 1.5, "wg bm=64": 1.47}})  # 2%: under the margin
    (tmp_path / "step.json").write_text(json.dumps(step))
    out = tmp_path / name
    out.write_text(text, encoding="utf-8")
    assert dense11_table.main([str(tmp_path / "step.json"), str(out), "--note", "a test run"]) == 0
    got = json.loads(out.read_text(encoding="utf-8"))
    for cls in ("qkv", "tall"):  # the step's shapes' classes
        cells, old = got["linear"]["dense11"][cls], target["linear"]["dense11"][cls]
        assert cells["9-16"] == [{"kernel": "dense11_wgmma", "config": {"pipe": True}}] + old["9-16"]
        assert cells["17-32"] == [{"kernel": "dense11_wgmma", "config": {"bm": 32}}] + old["17-32"]
        assert cells["1"] == old["1"] and cells["33-64"] == old["33-64"]
    assert got["linear"]["dense11"]["qo"] == target["linear"]["dense11"]["qo"]  # not a class of the step
    assert got["linear"]["fixed12"] == target["linear"]["fixed12"]
    assert got["about"][0].startswith("a test run: linear.dense11 cells of qkv, tall") and got["about"][1:] == target["about"]
    assert {k: v for k, v in got.items() if k not in ("about", "linear")} == \
        {k: v for k, v in target.items() if k not in ("about", "linear")}


def test_refuses_another_gpus_run_and_a_run_without_a_winner(tmp_path):
    name = "NVIDIA_H100_80GB_HBM3.json"
    text = (TABLES / name).read_text(encoding="utf-8")
    out = tmp_path / name
    out.write_text(text, encoding="utf-8")
    for gpu, times in (("NVIDIA H200", {"16": {"dense11": 1.2, "wg bm=64": 1.0}}),
                       (json.loads(text)["gpu"], {"16": {"dense11": 1.0, "wg bm=64": 1.2}})):
        (tmp_path / "step.json").write_text(json.dumps(_step(gpu, times)))
        with pytest.raises(SystemExit, match="dense11_table"):
            dense11_table.main([str(tmp_path / "step.json"), str(out), "--note", "x"])
        assert out.read_text(encoding="utf-8") == text  # nothing half-written


def test_candidate_of_each_column_kind():
    assert dense11_table.candidate("wg bm=16,pipe=1,fixup=1") == {
        "kernel": "dense11_wgmma", "config": {"bm": 16, "pipe": True, "fixup": True}}
    assert dense11_table.candidate("gemv bn=32,bk=128,prefetch=1")["kernel"] == "dense11_v3_gemv"
    assert dense11_table.candidate("long unpack=wg") == {"kernel": "dense11_unpack_cublas", "config": {"unpack": "wg"}}
    assert dense11_table.candidate("long ") == {"kernel": "dense11_unpack_cublas", "config": {}}
    with pytest.raises(ValueError, match="config column"):
        dense11_table.candidate("dense11")


def test_a_long_column_wins_the_long_buckets():
    target = json.loads((TABLES / "NVIDIA_H100_80GB_HBM3.json").read_text(encoding="utf-8"))
    step = _step(target["gpu"], {"192": {"bf16": 1.0, "dense11": 7.9, "long unpack=wg": 3.0},
                                 "1024": {"bf16": 1.0, "dense11": 3.1, "wg bm=256": 3.4, "long unpack=wg": 1.6}})
    got, taken = dense11_table.apply(step, target, "a test run", 0.03)
    want = {"kernel": "dense11_unpack_cublas", "config": {"unpack": "wg"}}
    for cls in ("qkv", "tall"):
        cells = got["linear"]["dense11"][cls]
        assert cells["129-255"][0] == want and cells["512+"][0] == want
    assert [t.split(":")[0] for t in taken] == ["129-255", "512+"]
