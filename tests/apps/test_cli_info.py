"""``glyd info`` (:mod:`glyd.apps.cli_store`, :func:`glyd.store.info`): each layout's format versions."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

import glyd
from glyd.cli import main
from glyd.codec import LAYOUTS, dense11
from glyd.store import CheckpointWriter, info, sha256_tensor

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "store_v1"


def _said(stdout: str, label: str) -> str:
    """The value of the summary line ``label`` of glyd info's output."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith(label + "  ")), None)
    assert line is not None, f"no {label!r} line in:\n{stdout}"
    return line[len(label):].strip()


@pytest.mark.parametrize("golden", sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()))
def test_info_names_the_format_version_of_each_layout(golden, capsys):
    # glyd info said "3 packed (3 dense11)", never which version of dense11's arrays a file holds
    folder = GOLDEN / golden
    entries = json.loads((folder / "glyd.json").read_text())["tensors"]
    want = Counter((e["layout"], e["format_version"]) for e in entries.values() if e["kind"] == "packed")
    assert want  # every golden holds packed matrices
    assert main(["info", str(folder)]) == 0
    out = capsys.readouterr().out
    said = ", ".join(f"{lay} v{v}: {n} tensor{'s' if n != 1 else ''}" for (lay, v), n in sorted(want.items()))
    assert _said(out, "format versions") == said
    for name, e in entries.items():  # and each packed row its own
        row = next(ln for ln in out.splitlines() if ln.startswith(name + " ")).split()
        assert row[1:3] == ([e["layout"], f"v{e['format_version']}"] if e["kind"] == "packed" else ["raw", "-"])
    assert _said(out, "tensors").startswith(f"{len(entries)}: {sum(want.values())} packed (")  # as before
    rows, totals = info(folder)
    assert totals["layout_versions"] == want
    assert {r["name"]: r["format_version"] for r in rows} == {
        n: e.get("format_version") if e["kind"] == "packed" else None for n, e in entries.items()}


def test_info_lists_every_version_of_a_mixed_checkpoint(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    w = [(torch.randn(5, 70, generator=g) * 0.02).to(torch.bfloat16) for _ in range(4)]
    with CheckpointWriter(tmp_path / "c", layout="auto") as out:
        out.add_packed("a.weight", dense11.pack_v1(w[0]), sha256_tensor(w[0]))
        out.add_packed("b.weight", glyd.pack(w[1], "dense11"), sha256_tensor(w[1]))
        out.add_packed("c.weight", glyd.pack(w[2], "dense11"), sha256_tensor(w[2]))
        out.add_packed("d.weight", glyd.pack(w[3], "fixed12"), sha256_tensor(w[3]))
        out.add_tensor("norm", torch.ones(4, dtype=torch.bfloat16))
        out.set_config({"model_type": "demo"})
    now = LAYOUTS["dense11"].writes
    assert now != 1  # what glyd.pack writes today is not dense11's first version
    assert main(["info", str(tmp_path / "c"), "--totals"]) == 0
    out = capsys.readouterr().out
    assert _said(out, "format versions") == f"dense11 v1: 1 tensor, dense11 v{now}: 2 tensors, fixed12 v1: 1 tensor"
    assert _said(out, "tensors") == "5: 4 packed (3 dense11, 1 fixed12), 1 kept as is (1 bfloat16)"
    assert "a.weight" not in out  # --totals: no table
    assert info(tmp_path / "c")[1]["layout_versions"] == {("dense11", 1): 1, ("dense11", now): 2, ("fixed12", 1): 1}


def test_info_of_a_checkpoint_with_nothing_packed_says_none(tmp_path, capsys):
    with CheckpointWriter(tmp_path / "c", layout="fixed12") as out:
        out.add_tensor("norm", torch.ones(4, dtype=torch.bfloat16))
        out.set_config({"model_type": "demo"})
    assert main(["info", str(tmp_path / "c"), "--totals"]) == 0
    assert _said(capsys.readouterr().out, "format versions") == "none"
