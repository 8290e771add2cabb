"""The kernel registry (glyd.kernels.registry): how a table is found, read and chosen from, and what
GLYD_TABLES and GLYD_DISABLED_KERNELS change. What the tables hold is checked in test_tables.py
(their schema and coverage, not their values: a re-tune changes the values)."""

from __future__ import annotations

import json

import pytest

from glyd import _env
from glyd.codec import LAYOUTS
from glyd.kernels import registry as R

from .conftest import needs_triton

pytestmark = needs_triton


def h200(gluon: bool, wg: bool, ws: bool) -> R.Device:
    feats = {name for name, on in (("gluon", gluon), ("wgmma", gluon and wg), ("tma", gluon and wg and ws)) if on}
    return R.Device("cuda", "NVIDIA H200", (9, 0) if wg else (8, 0), 132, False, frozenset(feats))


@pytest.fixture
def environ(monkeypatch):
    """Set glyd's environment variables for one test (settings and the registry's caches read anew)."""

    def set_env(**values):
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        _env.settings.cache_clear()
        R.reset()

    yield set_env
    monkeypatch.undo()
    _env.settings.cache_clear()
    R.reset()


def test_shape_classes_and_buckets():
    assert {R.shape_class(n, k) for n, k in [(512, 3584), (3584, 3584), (4608, 3584), (18944, 3584),
                                            (37888, 3584), (3584, 18944), (152064, 3584)]} == {
        "kv", "qo", "qkv", "gate", "big", "tall", "wide_big"}
    assert [R.m_bucket(m) for m in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64, 65, 128, 129, 255, 256, 511, 512,
                                    10**6)] == [
        "1", "2", "3", "4", "5-8", "5-8", "9-16", "9-16", "17-32", "33-64", "33-64", "65-128", "65-128", "129-255",
        "129-255", "256-511", "256-511", "512+", "512+"]
    with pytest.raises(ValueError):
        R.m_bucket(0)


def test_the_families_are_the_layouts():
    # one list: registry.KERNELS is read from the layouts' entries, each family under its layout's name
    assert dict(R.KERNELS) == {k: ref for lay in LAYOUTS.values() for k, ref in lay.kernels.items()}
    for key in R.KERNELS:
        kc = R.kernel_class(key)
        assert kc.name == key and key.startswith(f"{kc.layout}_") and kc.layout in LAYOUTS
    with pytest.raises(ValueError, match="unknown kernel"):
        R.kernel_class("gemv")


def test_config_classes_come_from_the_layouts_modules():
    import glyd.kernels as K
    from glyd.kernels.dense11.unpack import Dense11UnpackConfig
    from glyd.kernels.fixed12.gemv import GemvConfig

    assert K.GemvConfig is GemvConfig and K.Dense11UnpackConfig is Dense11UnpackConfig
    assert R.kernel_for(GemvConfig()).name == "fixed12_gemv"
    with pytest.raises(AttributeError):
        K.WarpDriveConfig  # noqa: B018


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
    assert kc.layout == "fixed12" and "wgmma" not in kc.name  # the H200's wgmma choices step aside off Hopper
    assert R.layout_times("Some Future GPU") is None and R.layout_times("NVIDIA H200")["shapes"]


@pytest.mark.parametrize("shape", [(512, 3584), (3584, 3584), (18944, 3584), (3584, 18944), (152064, 3584),
                                   (1000, 1100), (65536, 64)])
def test_the_choice_is_cached_per_m_bucket(shape):
    # choose() caches per bucket: every M of a bucket must get what choose_uncached makes for it
    n, k = shape
    for layout, lay in LAYOUTS.items():
        if not lay.kernels:
            continue
        kp = lay.padded_cols(k)
        for dev in (h200(True, True, True), h200(True, False, False), R.Device("cpu", "cpu", interpreting=True)):
            for _, lo, hi in R.M_BUCKETS:
                for m in sorted({lo, hi or 4 * lo, (lo + (hi or 4 * lo)) // 2}):
                    p = R.Problem(layout, m, n, k, kp)
                    assert R.choose(p, dev) == R.choose_uncached(p, dev), (layout, p, dev.features)


def test_glyd_tables_is_read_before_the_package(tmp_path, environ):
    h200_dev = h200(True, True, True)
    kv = R.Problem("fixed12", 1, 512, 3584, 3584)
    shipped = R.candidates(kv, h200_dev)
    own = {"linear": {"fixed12": {"kv": {"1": [{"kernel": "fixed12_word_dot", "config": {"bm": 16}}]}}}}
    (tmp_path / "NVIDIA_H200.json").write_text(json.dumps(own))
    environ(GLYD_TABLES=str(tmp_path))
    assert R.table_file("NVIDIA H200") == tmp_path / "NVIDIA_H200.json"
    assert R.candidates(kv, h200_dev) == own["linear"]["fixed12"]["kv"]["1"]
    assert R.choose(kv, h200_dev)[0].name == "fixed12_word_dot"
    assert R.table_file("Some Future GPU").parent == R.TABLES  # a GPU it has no table for: the package's path
    environ(GLYD_TABLES=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="GLYD_TABLES"):
        R.choose(kv, h200_dev)
    environ(GLYD_TABLES="")
    assert R.candidates(kv, h200_dev) == shipped


def test_a_table_of_the_old_256_plus_bucket_still_loads(tmp_path, environ):
    # before 2026-12-07 the last bucket was 256+: its cells serve 256-511 and 512+, unless the table has its own
    ws = {"kernel": "fixed12_wgmma_warpspec", "config": {"bm": 128}}
    own = {"linear": {"fixed12": {"big": {"256+": [ws], "512+": [{"kernel": "fixed12_unpack_cublas", "config": {}}]},
                                  "tall": {"256+": [ws]}}},
           "experts": {"fixed12": {"256+": [{"kernel": "experts_loop", "config": {}}]}}}
    (tmp_path / "Old_GPU.json").write_text(json.dumps(own))
    environ(GLYD_TABLES=str(tmp_path))
    gpu = R.Device("cuda", "Old GPU", (9, 0), 132, False, frozenset({"gluon", "wgmma", "tma"}))
    assert R.candidates(R.Problem("fixed12", 300, 37888, 3584, 3584), gpu)[0] == ws
    assert R.candidates(R.Problem("fixed12", 600, 37888, 3584, 3584), gpu)[0]["kernel"] == "fixed12_unpack_cublas"
    assert R.candidates(R.Problem("fixed12", 4096, 3584, 18944, 18944), gpu)[0] == ws
    table = R._load_table(tmp_path / "Old_GPU.json")
    assert "256+" not in table["experts"]["fixed12"] and table["experts"]["fixed12"]["512+"][0]["kernel"] == "experts_loop"


def test_a_table_of_some_cells_falls_back_to_the_h200_table_for_the_rest(tmp_path, environ):
    own = {"linear": {"fixed12": {"kv": {"1": [{"kernel": "fixed12_word_dot", "config": {}}]}}}}
    (tmp_path / "Partial_GPU.json").write_text(json.dumps(own))
    environ(GLYD_TABLES=str(tmp_path))
    gpu = R.Device("cuda", "Partial GPU", (9, 0), 132, False, frozenset({"gluon", "wgmma", "tma"}))
    kv = R.Problem("fixed12", 1, 512, 3584, 3584)
    assert R.candidates(kv, gpu)[0] == {"kernel": "fixed12_word_dot", "config": {}}  # its own cell first
    assert R.candidates(kv, gpu)[1:] == R.candidates(kv, h200(True, True, True))
    big = R.Problem("fixed12", 4, 152064, 3584, 3584)  # a cell the table lacks
    assert R.choose(big, gpu)[0].name == R.choose(big, h200(True, True, True))[0].name


def test_disabled_kernels_are_never_chosen(environ):
    h200_dev = h200(True, True, True)
    big = R.Problem("fixed12", 4, 152064, 3584, 3584)
    first = R.choose(big, h200_dev)[0].name
    environ(GLYD_DISABLED_KERNELS=f" {first}, fixed12_mma_v2 ")
    assert R.disabled() == {first, "fixed12_mma_v2"}
    kc, _ = R.choose(big, h200_dev)
    assert kc.name not in (first, "fixed12_mma_v2")
    cands = [c["kernel"] for c in R.candidates(big, h200_dev)]
    assert kc.name == next(c for c in cands if c not in (first, "fixed12_mma_v2"))
    environ(GLYD_DISABLED_KERNELS=",".join(LAYOUTS["tiered"].kernels))
    with pytest.raises(RuntimeError, match="disabled by GLYD_DISABLED_KERNELS"):
        R.choose(R.Problem("tiered", 1, 4096, 4096, 4096), h200_dev)
    environ(GLYD_DISABLED_KERNELS="gemv")  # a key from before the rename
    with pytest.raises(ValueError, match="unknown kernel families gemv"):
        R.choose(big, h200_dev)


def test_tables_are_validated(tmp_path, environ):
    good = json.loads(R.table_file("NVIDIA H200").read_text())
    cases = {
        "warp_drive": ("bad candidate", lambda t: t["linear"]["fixed12"]["kv"]["1"][0].update(kernel="warp_drive")),
        "wrong layout": ("bad candidate", lambda t: t["linear"]["fixed12"]["kv"]["1"][0].update(kernel="tiered_gemv")),
        "class": ("unknown shape class", lambda t: t["linear"]["fixed12"].update(huge={})),
        "bucket": ("unknown M bucket", lambda t: t["linear"]["fixed12"]["kv"].update({"0": []})),
        "layout": ("unknown layout", lambda t: t["linear"].update(fixed13={})),
        "times": ("'layout' must be", lambda t: t["layout"]["shapes"].update({"1x1": "fast"})),
    }
    for i, (match, spoil) in enumerate(cases.values()):
        bad = json.loads(json.dumps(good))
        spoil(bad)
        (tmp_path / f"Bad_GPU_{i}.json").write_text(json.dumps(bad))
    environ(GLYD_TABLES=str(tmp_path))
    for i, (match, _) in enumerate(cases.values()):
        with pytest.raises(ValueError, match=match):
            R.table_for(R.Device("cuda", f"Bad GPU {i}"))


def test_a_table_that_is_not_json_is_refused_naming_its_file(tmp_path, environ):
    (tmp_path / "Cut_GPU.json").write_text('{"linear": {"fixed12": {')  # a write cut short
    environ(GLYD_TABLES=str(tmp_path))
    with pytest.raises(ValueError, match="Cut_GPU.json.*not a JSON table"):
        R.table_for(R.Device("cuda", "Cut GPU"))


def test_the_experts_kv_and_layout_sections_are_validated(tmp_path, environ):
    # they were read unchecked: a list where an object belongs failed deep in a product
    # ("'list' object has no attribute 'get'"), a shape "big" in choose_layout ("invalid literal for int()")
    cand = {"kernel": "fixed12_experts_gemv", "config": {}}
    cases = {
        "experts": {"experts": ["fixed12"]},
        "experts.fixed12": {"experts": {"fixed12": [cand]}},
        "experts.fixed12.1": {"experts": {"fixed12": {"1": cand}}},
        "experts.fixed12.5-8": {"experts": {"fixed12": {"5-8": [{"kernel": "fixed12_experts_gemv"}]}}},
        "experts.fixed12.9-16": {"experts": {"fixed12": {"9-16": []}}},
        "experts.fixed13": {"experts": {"fixed13": {"1": [cand]}}},
        "experts.fixed12.0": {"experts": {"fixed12": {"0": [cand]}}},
        "kv": {"kv": ["kvf12"]},
        "kv.kvf12.attention": {"kv": {"kvf12": {"attention": ["kvf12_attention_torch"]}}},
        "kv.kvf13": {"kv": {"kvf13": {"attention": []}}},
        "kv.kvf12.read": {"kv": {"kvf12": {"read": [{"kernel": "kvf12_attention_torch", "config": {}}]}}},
        "layout.shapes.big": {"layout": {"shapes": {"big": {"fixed12": 1.0}}}},
        "layout.shapes.0x64": {"layout": {"shapes": {"0x64": {"fixed12": 1.0}}}},
        "layout.shapes.64x64": {"layout": {"shapes": {"64x64": {"fixed12": -1.0}}}},
    }
    from glyd.kv import registry as KV

    assert (R.KV_CODES, R.KV_OPS) == (KV.CODES, KV.OPS)
    for i, section in enumerate(cases.values()):
        (tmp_path / f"Bad_GPU_{i}.json").write_text(json.dumps({"linear": {}, **section}))
    environ(GLYD_TABLES=str(tmp_path))
    for i, where in enumerate(cases):
        with pytest.raises(ValueError, match=f"Bad_GPU_{i}.json: {where.replace('.', '[.]')}"):
            R.table_for(R.Device("cuda", f"Bad GPU {i}"))


def test_a_candidate_with_a_bad_config_is_skipped_with_a_warning(tmp_path, environ, caplog):
    # a table's candidate whose config its family refuses was skipped without a trace, and the
    # fallback table's kernel ran instead of the one the table asked for; an experts family in a
    # linear cell was taken, and every product of that cell crashed inside it
    from glyd.kv import registry as KV

    bad = {"kernel": "fixed12_word_dot", "config": {"bm": 16, "stage": 2}}
    kv_bad = {"kernel": "kvf12_attention_torch", "config": {"warps": 4}}
    experts = {"kernel": "fixed12_experts_gemv", "config": {}}  # a fixed12 family, but of expert products
    table = {"linear": {"fixed12": {"kv": {"1": [bad, experts]}}}, "kv": {"kvf12": {"attention": [kv_bad]}}}
    (tmp_path / "Typo_GPU.json").write_text(json.dumps(table))
    environ(GLYD_TABLES=str(tmp_path))
    gpu = R.Device("cuda", "Typo GPU", (9, 0), 132, False, frozenset({"gluon", "wgmma", "tma"}))
    KV.choose.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="glyd"):
            assert R.choose(R.Problem("fixed12", 1, 512, 3584, 3584), gpu)[0].name != "fixed12_word_dot"
            KV.choose(KV.KVProblem("kvf12", "attention", 64, 128, 128, 7, "pool"), gpu)
    finally:
        KV.choose.cache_clear()
    text = caplog.text
    assert "fixed12.kv.1" in text and "fixed12_word_dot" in text and "stage" in text, text
    assert "fixed12_experts_gemv" in text and "expert" in text.split("fixed12_experts_gemv")[1], text
    assert "kv.kvf12.attention" in text and "kvf12_attention_torch" in text and "warps" in text, text


def test_a_k_steps_split_with_a_bad_bk_is_a_bad_config(tmp_path, environ, caplog):
    # "split": "k_steps" divided the padded K by the entry's bk before GemvConfig checked it: bk 0
    # raised ZeroDivisionError out of the choice, for every product of the cell
    cell = [{"kernel": "fixed12_gemv", "config": {"split": "k_steps", "bk": 0}}]
    (tmp_path / "Zero_GPU.json").write_text(json.dumps({"linear": {"fixed12": {"kv": {"1": cell}}}}))
    environ(GLYD_TABLES=str(tmp_path))
    gpu = R.Device("cuda", "Zero GPU", (9, 0), 132, False, frozenset({"gluon", "wgmma", "tma"}))
    with caplog.at_level("WARNING", logger="glyd"):
        kc, _ = R.choose(R.Problem("fixed12", 1, 512, 3584, 3584), gpu)
    assert kc.name == R.choose(R.Problem("fixed12", 1, 512, 3584, 3584), h200(True, True, True))[0].name
    assert "fixed12_gemv" in caplog.text and "bk" in caplog.text, caplog.text
