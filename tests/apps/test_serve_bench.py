"""``benchmarks/serve.py --tiny``: the serving benchmark's whole pipeline (random model, server, concurrent
streaming clients, JSON and table) on the CPU with tiny shapes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "serve.py"


def test_serve_benchmark_dry_run(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("serve_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--tiny", "--out", str(tmp_path), "--concurrency", "1,3"]) == 0
    report = json.loads((tmp_path / "serve.json").read_text())
    assert [r["weights"] for r in report["results"]] == ["bf16", "fixed12"]
    for res in report["results"]:
        assert [row["concurrency"] for row in res["rows"]] == [1, 3]
        for row in res["rows"]:
            assert row["tokens"] == row["concurrency"] * report["new"]  # no request stopped early
            assert row["tokens_per_s"] > 0 and row["ttft_s"] > 0
    layouts = {res["weights"]: res["info"]["layout"] for res in report["results"]}
    assert layouts == {"bf16": "bf16", "fixed12": "fixed12"}
    bf16, packed = (res["info"]["weight_bytes"] for res in report["results"])
    assert packed < bf16
    table = (tmp_path / "serve.md").read_text()
    assert table.count("\n") == 2 + 4 and "| fixed12 | 3 |" in table and table in capsys.readouterr().out
