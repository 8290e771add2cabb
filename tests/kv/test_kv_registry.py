"""The KV kernel registry (glyd.kv.registry): kernels chosen from the GPU table's kv section as weight
kernels are, each refusing what it cannot run, the twins where no kernel can; configs validated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from glyd.kernels.registry import Device, table_for
from glyd.kv import registry
from glyd.kv.registry import KV_KERNELS, KVProblem, by_name, candidates, choose, kernel_class

H200 = Device("cuda", "NVIDIA H200", (9, 0), 132, False, frozenset({"gluon", "wgmma", "tma"}))
A100 = Device("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), 108, False, frozenset({"gluon"}))
CPU = Device("cpu", "cpu")
INTERP = Device("cpu", "cpu", interpreting=True)


def problem(code="kvf12", op="attention", page=64, d=128, dv=128, group=7, where="pool", batch=0):
    return KVProblem(code, op, page, d, dv, group, where, batch)


@pytest.mark.parametrize("prob,device,want", [
    (problem(), H200, "kvf12_attention_triton"),
    (problem(op="write", group=1), H200, "kvf12_write_triton"),
    (problem(where="store"), A100, "kvf12_attention_triton"),  # a GPU with no table of its own: the H200's
    (problem(d=16, dv=16), H200, "kvf12_attention_torch"),  # head dims under 32: the twin
    (problem(page=16), H200, "kvf12_attention_torch"),  # 16-token sub-tiles are refused on the GPU
    (problem(code="kvtiered", where="store"), H200, "kvtiered_attention_gluon"),
    (problem(code="kvtiered", where="store", group=17), H200, "kvtiered_attention_triton"),
    (problem(code="kvtiered", where="store", d=64, dv=64), H200, "kvtiered_attention_triton"),
    (problem(code="kvtiered", where="store", d=12, dv=12), H200, "kvtiered_attention_torch"),
    (problem(), CPU, "kvf12_attention_torch"),
    (problem(op="write", group=1), INTERP, "kvf12_write_torch"),  # kernels run on the CPU only when named
])
def test_choice(prob, device, want):
    kc, cfg = choose(prob, device)
    assert kc.name == want and isinstance(cfg, kc.Config)
    assert kc.can_implement(prob, device, cfg) == (True, "")


def test_table_entries_are_configs_the_kernels_take():
    table = json.loads(Path(registry.__file__).resolve().parents[1].joinpath(
        "kernels", "tables", "NVIDIA_H200.json").read_text())
    assert table_for(H200)["kv"] == table["kv"]
    seen = set()
    for code, ops in table["kv"].items():
        for op, cands in ops.items():
            assert cands[-1]["kernel"].endswith("_torch")  # a twin last: every problem runs somewhere
            for c in cands:
                kc = kernel_class(c["kernel"])
                assert (kc.code, kc.op) == (code, op) and kc.Config(**c["config"]) is not None
                seen.add(c["kernel"])
    assert seen == set(KV_KERNELS)


def test_refusals_say_why():
    kc = kernel_class("kvf12_attention_triton")
    ok, why = kc.can_implement(problem(d=48, dv=48), H200, kc.Config())
    assert not ok and "powers of two" in why
    ok, why = kc.can_implement(problem(code="kvtiered"), H200, kc.Config())
    assert not ok and "kvf12 attention" in why
    gluon = kernel_class("kvtiered_attention_gluon")
    turing = Device("cuda", "Tesla T4", (7, 5), 40, False, frozenset({"gluon"}))
    ok, why = gluon.can_implement(problem(code="kvtiered", where="store"), turing, gluon.Config())
    assert not ok and "8.0" in why
    with pytest.raises(RuntimeError, match="cannot run"):
        by_name("kvf12_write_triton", problem(op="write", group=1), CPU)
    with pytest.raises(ValueError, match="unknown KV kernel"):
        kernel_class("kvf12_attention_cuda")
    with pytest.raises(ValueError, match="unknown KV problem"):
        problem(code="fp8")


@pytest.mark.parametrize("name,kw", [("kvf12_attention_triton", dict(num_warps=3)),
                                     ("kvf12_attention_triton", dict(sub_tile=24)),
                                     ("kvf12_attention_triton", dict(maxnreg=300)),
                                     ("kvf12_attention_triton", dict(maxnreg=16)),
                                     ("kvf12_write_triton", dict(num_warps=0)),
                                     ("kvtiered_attention_triton", dict(programs_per_sm=0)),
                                     ("kvtiered_attention_gluon", dict(maxnreg=-1))])
def test_configs_are_validated(name, kw):
    with pytest.raises(ValueError):
        kernel_class(name).Config(**kw)


def test_cpu_ops_take_the_twins(monkeypatch):
    # CPU tensors never reach a kernel on their own (the interpreter runs only what a test names)
    from glyd.kv import decode_attention
    from glyd.kv.fixed import FixedPageStore
    from glyd.kv import pool_twin

    calls = []
    real = pool_twin.attention_torch
    monkeypatch.setattr(pool_twin, "attention_torch", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(1, 1, 40, 32).to(torch.bfloat16)
    st = FixedPageStore.from_bf16(x, page=16)
    decode_attention(torch.ones(1, 2, 32, dtype=torch.bfloat16), st, st)
    assert calls == [1]


def test_registry_reset_forgets_the_kv_choices(tmp_path, monkeypatch):
    # registry.reset() ("forget the tables read and the choices made") left the KV choices cached:
    # after a new GLYD_TABLES table the old KV kernel kept running
    from glyd import _env
    from glyd.kernels import registry as weights

    gpu = Device("cuda", "Retuned GPU", (9, 0), 132, False, frozenset({"gluon", "wgmma", "tma"}))
    path = tmp_path / "Retuned_GPU.json"

    def use(first: str) -> str:
        path.write_text(json.dumps({"linear": {}, "kv": {"kvf12": {"attention": [{"kernel": first, "config": {}}]}}}))
        weights.reset()
        return choose(problem(), gpu)[0].name

    monkeypatch.setenv("GLYD_TABLES", str(tmp_path))
    _env.settings.cache_clear()
    choose.cache_clear()
    try:
        assert use("kvf12_attention_triton") == "kvf12_attention_triton"
        assert use("kvf12_attention_torch") == "kvf12_attention_torch"
    finally:
        monkeypatch.undo()
        _env.settings.cache_clear()
        weights.reset()
        choose.cache_clear()


def test_the_h100s_own_table_runs_its_measured_kv_attention_and_the_h200s_elsewhere():
    # NVIDIA_H100_80GB_HBM3.json lists the kvf12 attention the H100 timed fastest (4 programs an SM, the combine
    # launched early, to 3 sequences; 2-warp programs, 8 an SM, from 4); the writer and the weight products' cells it does not list come from the fallback H200 table
    # (those it lists, e.g. q/o at M = 1 since 2026-12-06, first, then the fallback's)
    from glyd.kernels import registry as weights

    h100 = Device("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 132, False, frozenset({"gluon", "wgmma", "tma"}))
    kc, cfg = choose(problem(), h100)
    assert kc.name == "kvf12_attention_triton" and cfg.programs_per_sm == 4 and cfg.pdl == "combine"
    # by sequences a launch: 2-warp programs, 8 an SM, from 4 (its row's "batches"), 4 programs below and where not
    # known
    assert [(c.num_warps, c.programs_per_sm, c.maxnreg) for c in (choose(problem(batch=b), h100)[1]
                                                                  for b in (1, 3, 4, 16, 64, 0))] == \
        [(4, 4, 96), (4, 4, 96), (2, 8, 128), (2, 8, 128), (2, 8, 128), (4, 4, 96)]
    assert choose(problem(), H200)[1].programs_per_sm == 16 and choose(problem(), H200)[1].pdl == ""
    assert choose(problem(op="write", group=1), h100)[0].name == "kvf12_write_triton"
    lin = weights.Problem("fixed12", 1, 18944, 3584, 3584)  # class gate: no H100 row
    assert weights.candidates(lin, h100) == weights.candidates(lin, H200) != []
    qo = weights.Problem("fixed12", 1, 3584, 3584, 3584)
    own = json.loads((Path(weights.__file__).parent / "tables" / "NVIDIA_H100_80GB_HBM3.json").read_text(
        encoding="utf-8"))["linear"]["fixed12"]["qo"]["1"]  # the H100's own candidates, in its table's order
    assert own and weights.candidates(qo, h100)[:len(own)] == own
    assert weights.candidates(qo, h100)[len(own):] == weights.candidates(qo, H200)
    assert weights.candidates(qo, h100)[0]["kernel"] == "fixed12_gemv"


def test_batches_ranges_choose_by_sequences_and_bad_ones_are_refused(tmp_path, monkeypatch):
    # a kv candidate with "batches": [lo, hi] serves launches of lo..hi sequences only (KVProblem.batch; 0, not
    # known, passes it over); a malformed range is refused when the table loads, naming the cell
    from glyd import _env
    from glyd.kernels import registry as weights

    gpu = Device("cuda", "Ranged GPU", (9, 0), 132, False, frozenset({"gluon", "wgmma", "tma"}))
    path = tmp_path / "Ranged_GPU.json"
    wide = {"kernel": "kvf12_attention_triton", "batches": [8, 8], "config": {"programs_per_sm": 2}}
    cells = [wide, {"kernel": "kvf12_attention_triton", "config": {"programs_per_sm": 5}},
             {"kernel": "kvf12_attention_torch", "config": {}}]
    monkeypatch.setenv("GLYD_TABLES", str(tmp_path))
    _env.settings.cache_clear()
    try:
        path.write_text(json.dumps({"linear": {}, "kv": {"kvf12": {"attention": cells}}}))
        weights.reset()
        assert [choose(problem(batch=b), gpu)[1].programs_per_sm for b in (7, 8, 9, 0)] == [5, 2, 5, 5]
        for bad in ([0, 4], [4, 2], [1], "1-4", [1.0, 4], [True, 4]):
            path.write_text(json.dumps({"linear": {}, "kv": {"kvf12": {"attention": [{**wide, "batches": bad}]}}}))
            weights.reset()
            with pytest.raises(ValueError, match="kv.kvf12.attention: 'batches'"):
                choose(problem(batch=8), gpu)
    finally:
        monkeypatch.undo()
        _env.settings.cache_clear()
        weights.reset()
        choose.cache_clear()
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="batch"):
            problem(batch=bad)
