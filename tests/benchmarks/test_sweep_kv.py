"""benchmarks/sweep_kv.py: the pool attention's launch configs picked by batch, and the table rows they write."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
NAN = float("nan")


@pytest.fixture(scope="module")
def sk():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("sweep_kv", BENCH / "sweep_kv.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def test_a_batch_picks_the_least_geometric_mean_over_lengths_and_never_a_failed_config(sk):
    times = {(16384, 1): {"sdpa": 10.0, "a": 12.0, "b": 20.0, "c": 5.0},
             (4096, 1): {"sdpa": 10.0, "a": 12.0, "b": 5.0, "c": NAN},  # c failed here: not picked at 1
             (16384, 64): {"sdpa": 100.0, "a": 120.0, "b": 90.0, "c": 95.0},
             (4096, 64): {"sdpa": 100.0, "a": 80.0, "b": 90.0, "c": 95.0}}
    # at 1: a sqrt(1.2 * 1.2) = 1.2, b sqrt(2.0 * 0.5) = 1.0; at 64: a sqrt(1.2 * 0.8) = 0.98 < b 0.9 < c 0.95
    assert sk.picks(times, [1, 64]) == {1: "b", 64: "b"}
    times[(4096, 64)]["a"] = 60.0  # a sqrt(1.2 * 0.6) = 0.85
    assert sk.picks(times, [1, 64]) == {1: "b", 64: "a"}
    assert sk.picks({(16384, 2): {"sdpa": 1.0, "a": NAN}}, [2]) == {}


def test_runs_of_one_pick_become_rows_with_ranges_and_the_first_run_takes_unknown_batches(sk):
    cfg = {"p4": {"programs_per_sm": 4}, "p16": {"programs_per_sm": 16}}
    rows = sk.table_rows({1: "p4", 2: "p4", 4: "p4", 8: "p16", 64: "p16"}, cfg)
    assert rows == [{"kernel": sk.KERNEL, "batches": [1, 4], "config": cfg["p4"]},
                    {"kernel": sk.KERNEL, "batches": [5, sk.MAX_BATCH], "config": cfg["p16"]},
                    {"kernel": sk.KERNEL, "config": cfg["p4"]}]
    rows = sk.table_rows({1: "p16", 2: "p4", 64: "p16"}, cfg)
    assert [r.get("batches") for r in rows] == [[1, 1], [2, 2], [3, sk.MAX_BATCH], None]
    with pytest.raises(ValueError, match="no config ran"):
        sk.table_rows({}, cfg)


def test_the_written_table_serves_each_batch_its_pick_and_keeps_the_rest(sk, tmp_path):
    from glyd.kernels import registry
    from glyd.kv import registry as kvr

    src = registry.table_file(registry.FALLBACK)
    slow = {"num_warps": 4, "sub_tile": 32, "programs_per_sm": 16, "maxnreg": 96, "swar": True, "num_stages": 2}
    fast = {**slow, "programs_per_sm": 4}
    rows = sk.table_rows({1: "fast", 16: "fast", 32: "slow", 64: "slow"}, {"fast": fast, "slow": slow})
    dest = tmp_path / "t.json"
    sk.write_table(src, dest, rows)
    old, new = json.loads(src.read_text()), json.loads(dest.read_text())
    assert new["linear"] == old["linear"] and new["kv"]["kvf12"]["write"] == old["kv"]["kvf12"]["write"]
    assert new["kv"]["kvf12"]["attention"][-1] == {"kernel": "kvf12_attention_torch", "config": {}}
    for batch, want in ((1, fast), (16, fast), (17, slow), (4096, slow), (0, fast)):
        problem = kvr.KVProblem("kvf12", "attention", 64, 128, 128, 7, batch=batch)
        assert kvr._table_candidates(new, problem)[0]["config"] == want, batch
    with pytest.raises(ValueError, match="programs_per_sm"):  # a config the registry would refuse is not written
        sk.write_table(src, tmp_path / "bad.json", [{"kernel": sk.KERNEL, "config": {**slow, "programs_per_sm": 0}}])
    assert not (tmp_path / "bad.json").exists() and list(tmp_path.iterdir()) == [dest]


def test_a_dry_run_checks_every_config_against_sdpa_on_the_cpu(sk, tmp_path, capsys):
    assert sk.main(["--dry-run", "--out", str(tmp_path), "--configs", "4,32,4,96,1,2", "4,32,4,96,1,2,1"]) == 0
    rec = json.loads((tmp_path / "sweep_kv.json").read_text())
    assert rec["failed"] == [] and [(c["tokens"], c["batch"]) for c in rec["times_us"]] == [(128, 1), (128, 2)]
    assert rec["configs"]["w4 s32 p4 r96 swar n2 pdl:combine"]["pdl"] == "combine"  # AttentionConfig.pdl
    assert "| 128 x 2 |" in capsys.readouterr().out
    assert not any(isinstance(v, float) and math.isnan(v) for c in rec["times_us"] for v in c.values())


def test_a_config_whose_output_is_wrong_is_not_timed_and_fails_the_dry_run(sk, tmp_path, monkeypatch):
    import torch

    from glyd.kv import _triton_fixed

    real = _triton_fixed.attention_triton
    monkeypatch.setattr(_triton_fixed, "attention_triton", lambda *a, **kw: torch.zeros_like(real(*a, **kw)))
    assert sk.main(["--dry-run", "--out", str(tmp_path), "--configs", "4,32,4,96,1,2"]) == 1
    rec = json.loads((tmp_path / "sweep_kv.json").read_text())
    assert len(rec["failed"]) == 2 and all("relative error" in f["why"] for f in rec["failed"])
