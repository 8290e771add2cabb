"""``benchmarks/sweep_shapes.py`` writes its sweep.json and kernel table after every shape (a run cut
short by a time limit keeps what it measured): each write replaces the file whole or not at all."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _sweep():
    pytest.importorskip("triton")
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("sweep_shapes", BENCH / "sweep_shapes.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def test_a_table_write_that_fails_leaves_the_last_table_whole(tmp_path, monkeypatch):
    # the table file was opened (truncated) before the table was built: a failure or a kill there
    # left an empty file where the last shape's table had been
    sweep = _sweep()
    table, out = tmp_path / "NVIDIA_H200.json", tmp_path / "out"
    args = argparse.Namespace(out=str(out), table=str(table), table_keep=3)
    first = {"gpu": "NVIDIA H200", "about": ["first shape"], "linear": {}}
    monkeypatch.setattr(sweep, "build_table", lambda res, keep, ms: first)
    sweep.save(args, {"rows": [1]}, [1])
    assert json.loads(table.read_text()) == first
    assert json.loads((out / "sweep.json").read_text()) == {"rows": [1]}

    def cut_short(res, keep, ms):
        raise KeyboardInterrupt  # what a time limit's signal does mid-build

    monkeypatch.setattr(sweep, "build_table", cut_short)
    with pytest.raises(KeyboardInterrupt):
        sweep.save(args, {"rows": [1, 2]}, [1])
    assert json.loads(table.read_text()) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["NVIDIA_H200.json", "out"]  # no temporary left
    assert [p.name for p in out.iterdir()] == ["sweep.json"]


def test_an_unknown_shape_is_refused_before_anything_runs(capsys):
    sweep = _sweep()
    with pytest.raises(SystemExit) as exc:
        sweep.main(["--shapes", "k/v,nope", "--ms", "1"])
    assert exc.value.code == 2
    assert "unknown shape 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("gpu", ["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
def test_every_round_that_call_sh_runs_builds_its_candidates_on_hopper(gpu, monkeypatch):
    # a round whose candidates raise (a config the families refuse, a name that moved) would end a device call's
    # sweep at its first shape: every round benchmarks/pending/call.sh names builds at every shape and M here, on a
    # Hopper with Gluon, with that GPU's own table, and each candidate is a config, None (the table's) or a tuple
    import dataclasses
    import re

    from glyd.kernels import registry

    sweep = _sweep()
    dev = registry.Device("cuda", gpu, (9, 0), 132, False, frozenset({"gluon", "wgmma", "tma"}))
    monkeypatch.setattr(sweep, "device", lambda: dev)
    rounds = set(re.findall(r"SWEEP_ROUND=(\w+)", (BENCH / "pending" / "call.sh").read_text()))
    assert {"default", "44", "45", "46", "47"} <= rounds
    for rnd in sorted(rounds):
        monkeypatch.setenv("SWEEP_ROUND", rnd)
        for n, k in sweep.SHAPES.values():
            for m in (1, 2, 8, 16, 32, 64, 65, 128, 256, 512, 2048):
                cands = sweep.candidates(m, n, k)
                assert "default" in cands, (rnd, n, k, m)
                for name, cfg in cands.items():
                    assert cfg is None or isinstance(cfg, tuple) or dataclasses.is_dataclass(cfg), (rnd, name, cfg)
