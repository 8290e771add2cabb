"""The kernel registry and its tables (glyd.kernels.registry).

The H200 table replaced a decision tree in code; ``tests/data/kernels/h200_choices.json`` holds
that tree's choice for 42,320 (M, N, K, availability) cases, recorded before it was removed. The
table must choose the same kernel with the same settings in every one of them, except where a later
measurement changed a cell: fixed12 at M = 65-255 takes unpack + cuBLAS since 2026-12-03 (the tile
kernel measured 4.5-7.5x bf16 there, unpack + cuBLAS 2.1-2.6x)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glyd.codec.fixed12 import padded_cols
from glyd.kernels import registry as R

from .conftest import needs_triton

pytestmark = needs_triton

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "kernels" / "h200_choices.json"

# The removed Config's defaults, and what each kernel family set on it.
OLD_DEFAULTS = dict(bm=16, bn=64, bk=256, dot=True, split=0, warps=4, stages=3, long=False, chunk=0, group_major=False,
                    byte=False, g=4, mma=False, waves=2, fixup=False, prefetch=False, gemv=True, tc=False, gluon=False,
                    exc_pass=False, exc_after=False, ring=1, ring_x=False, exc_tile=False, x_ahead=True, x_rows8=False,
                    maxnreg=0, wg=False, pipe=False, ws=False, consumers=1)
FAMILY_FLAGS = {"fixed12_gemv": dict(dot=False, group_major=True, stages=1), "fixed12_word_dot": dict(tc=True),
                "fixed12_operand_dot": dict(mma=True), "fixed12_byte_dot": {}, "fixed12_mma_v2": dict(gluon=True),
                "fixed12_wgmma": dict(gluon=True, wg=True, bk=128),
                "fixed12_wgmma_warpspec": dict(gluon=True, wg=True, ws=True, bk=128, exc_tile=True),
                "fixed12_unpack_cublas": dict(long=True)}
NEW_ONLY = {"pdl": "", "prefetch_depth": 1}  # fields the old Config did not have (their values then)


def h200(gluon: bool, wg: bool, ws: bool) -> R.Device:
    feats = {name for name, on in (("gluon", gluon), ("wgmma", gluon and wg), ("tma", gluon and wg and ws)) if on}
    return R.Device("cuda", "NVIDIA H200", (9, 0) if wg else (8, 0), 132, False, frozenset(feats))


def as_old(kernel: str, cfg) -> dict:
    d = dict(OLD_DEFAULTS)
    d.update(FAMILY_FLAGS[kernel])
    for name, value in R.config_dict(cfg).items():
        if name in NEW_ONLY:
            assert value == NEW_ONLY[name], (kernel, cfg)
            continue
        assert name in d, f"{kernel}: field {name} has no counterpart"
        d[name] = value
    return d


def test_the_table_chooses_what_the_measured_tree_chose():
    g = json.loads(GOLDEN.read_text())
    ms, ns, ks = g["ms"], g["ns"], g["ks"]
    wrong, n = [], 0
    for a, (gluon, wg, ws) in enumerate(g["avail"]):
        dev = h200(gluon, wg, ws)
        for im, m in enumerate(ms):
            for i_n, nn in enumerate(ns):
                for ik, k in enumerate(ks):
                    want = g["configs"][g["choice"][((a * len(ms) + im) * len(ns) + i_n) * len(ks) + ik]]
                    kc, cfg = R.choose(R.Problem("fixed12", m, nn, k, padded_cols(k)), dev)
                    n += 1
                    if R.m_bucket(m) == "65-255":
                        want = as_old("fixed12_unpack_cublas", R.kernel_class("fixed12_unpack_cublas").Config())
                    if as_old(kc.name, cfg) != want:
                        wrong.append((m, nn, k, (gluon, wg, ws), kc.name))
    assert n == 42320
    assert wrong == [], f"{len(wrong)} differ, e.g. {wrong[:5]}"


def test_shape_classes_and_buckets():
    assert {R.shape_class(n, k) for n, k in [(512, 3584), (3584, 3584), (4608, 3584), (18944, 3584),
                                            (37888, 3584), (3584, 18944), (152064, 3584)]} == {
        "kv", "qo", "qkv", "gate", "big", "tall", "wide_big"}
    assert [R.m_bucket(m) for m in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64, 65, 255, 256, 10**6)] == [
        "1", "2", "3", "4", "5-8", "5-8", "9-16", "9-16", "17-32", "33-64", "33-64", "65-255", "65-255", "256+",
        "256+"]
    with pytest.raises(ValueError):
        R.m_bucket(0)


def test_every_class_and_bucket_has_a_candidate_that_runs_anywhere():
    # the last resort of every entry runs on any device (interpreter included): no product is left
    # without a kernel
    cpu = R.Device("cpu", "cpu", interpreting=True)
    for layout in ("fixed12", "tiered"):
        for cls in R.SHAPE_CLASSES:
            for bucket, lo, _ in R.M_BUCKETS:
                n, k = {"kv": (512, 3584), "tall_tiny": (256, 16384), "wide_tiny": (65536, 64)}.get(cls, (None, None))
                table = R.table_for(cpu)["linear"][layout]
                assert table[cls][bucket], (layout, cls, bucket)
                last = table[cls][bucket][-1]
                kc = R.kernel_class(last["kernel"])
                assert kc.layout == layout
                ok, why = kc.can_implement(R.Problem(layout, lo, 4096, 1024, 1024), cpu,
                                           kc.make_config(dict(last["config"]), R.Problem(layout, lo, 4096, 1024, 1024)))
                assert ok, (layout, cls, bucket, why)


def test_kernels_say_why_they_cannot_run():
    from glyd.kernels.fixed12.mma_v2 import GluonConfig, GluonKernel
    from glyd.kernels.fixed12.wgmma import WgConfig, WgKernel

    p = R.Problem("fixed12", 4, 4096, 4096, 4096)
    ok, why = GluonKernel.can_implement(p, R.Device("cpu", "cpu", interpreting=True), GluonConfig())
    assert not ok and "Gluon" in why
    ok, why = GluonKernel.can_implement(R.Problem("fixed12", 4, 4096, 4000, 4032), h200(True, False, False),
                                        GluonConfig())
    assert not ok and "K a multiple of" in why
    ok, why = WgKernel.can_implement(p, h200(True, False, False), WgConfig())
    assert not ok and "Hopper" in why
    ok, why = GluonKernel.can_implement(R.Problem("tiered", 4, 4096, 4096, 4096), h200(True, True, True), GluonConfig())
    assert not ok and "tiered" in why


def test_a_gpu_without_a_table_uses_the_fallback():
    other = R.Device("cuda", "Some Future GPU", (10, 0), 100, False, frozenset({"gluon"}))
    assert R.table_for(other) is R.table_for(h200(True, True, True))
    kc, _ = R.choose(R.Problem("fixed12", 4, 152064, 3584, 3584), other)
    assert kc.name == "fixed12_mma_v2"  # the H200's wgmma choices step aside off Hopper
    assert R.layout_times("Some Future GPU") is None and R.layout_times("NVIDIA H200")["shapes"]


def test_a_table_of_some_cells_falls_back_to_the_h200_table_for_the_rest(tmp_path, monkeypatch):
    h200_table = R.table_file("NVIDIA H200")
    own = {"linear": {"fixed12": {"kv": {"1": [{"kernel": "fixed12_word_dot", "config": {}}]}}}}
    (tmp_path / "Partial_GPU.json").write_text(json.dumps(own))
    (tmp_path / h200_table.name).write_text(h200_table.read_text())
    monkeypatch.setattr(R, "TABLES", tmp_path)
    R._load_table.cache_clear()
    try:
        gpu = R.Device("cuda", "Partial GPU", (9, 0), 132, False, frozenset({"gluon", "wgmma", "tma"}))
        kv = R.Problem("fixed12", 1, 512, 3584, 3584)
        assert R.candidates(kv, gpu)[0] == {"kernel": "fixed12_word_dot", "config": {}}  # its own cell first
        assert R.candidates(kv, gpu)[1:] == R.candidates(kv, h200(True, True, True))
        big = R.Problem("fixed12", 4, 152064, 3584, 3584)  # a cell the table lacks
        assert R.choose(big, gpu)[0].name == R.choose(big, h200(True, True, True))[0].name
    finally:
        R._load_table.cache_clear()


def test_tables_are_validated(tmp_path, monkeypatch):
    bad = json.loads(R.table_file("NVIDIA H200").read_text())
    bad["linear"]["fixed12"]["kv"]["1"][0]["kernel"] = "warp_drive"
    (tmp_path / "Bad_GPU.json").write_text(json.dumps(bad))
    monkeypatch.setattr(R, "TABLES", tmp_path)
    R._load_table.cache_clear()
    try:
        with pytest.raises(ValueError, match="bad candidate"):
            R.table_for(R.Device("cuda", "Bad GPU"))
    finally:
        R._load_table.cache_clear()
