"""KV kernel configs (the ``kv`` section of a kernel table) refuse values of the wrong type or out of
range on creation, naming the field: a float, a bool or a register cap past 255 reached the launch
(a TypeError about ``<`` or ``&`` where None or a string came, ptxas refusing the cap on the GPU)."""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("triton")

CASES = [
    ("_triton", "TieredTritonConfig", "num_warps", 4.0),
    ("_triton", "TieredTritonConfig", "num_warps", True),
    ("_triton", "TieredTritonConfig", "sub_tile", None),
    ("_triton", "TieredTritonConfig", "programs_per_sm", 2.5),
    ("_triton", "TieredTritonConfig", "programs_per_sm", True),
    ("_triton", "TieredTritonConfig", "maxnreg", 1000),
    ("_triton", "TieredTritonConfig", "maxnreg", "128"),
    ("_gluon", "GluonConfig", "programs_per_sm", None),
    ("_gluon", "GluonConfig", "programs_per_sm", 1.5),
    ("_gluon", "GluonConfig", "maxnreg", 4096),
    ("_gluon", "GluonConfig", "maxnreg", True),
    ("_gluon", "GluonConfig", "prefetch", "false"),
    ("_triton_pool", "WriteConfig", "num_warps", 2.0),
    ("_triton_pool", "WriteConfig", "num_warps", True),
    ("_triton_fixed", "AttentionConfig", "num_warps", 2.0),
    ("_triton_fixed", "AttentionConfig", "num_warps", True),
    ("_triton_fixed", "AttentionConfig", "sub_tile", None),
    ("_triton_fixed", "AttentionConfig", "programs_per_sm", 2.5),
    ("_triton_fixed", "AttentionConfig", "programs_per_sm", True),
    ("_triton_fixed", "AttentionConfig", "maxnreg", True),
    ("_triton_fixed", "AttentionConfig", "swar", "false"),
    ("_triton_fixed", "AttentionConfig", "swar", 1),
    ("_triton_fixed", "AttentionConfig", "num_stages", True),  # == 1: a table's true ran one stage
    ("_triton_fixed", "AttentionConfig", "num_stages", 2.0),
    ("_triton_fixed", "AttentionConfig", "num_stages", None),
    ("_triton_fixed", "AttentionConfig", "pdl", True),
    ("_triton_fixed", "AttentionConfig", "pdl", "reduce"),  # the linear kernels' mode, not the attention's
    ("_triton_fixed", "AttentionConfig", "pdl", None),
]


def _config(module: str, name: str):
    try:
        return getattr(importlib.import_module(f"glyd.kv.{module}"), name)
    except ImportError as exc:  # the Gluon kernel on a Triton without Gluon
        pytest.skip(f"{module} does not import: {exc}")


@pytest.mark.parametrize("module,name,field,value", CASES, ids=[f"{c[1]}.{c[2]}={c[3]!r}" for c in CASES])
def test_a_kv_config_value_of_the_wrong_type_is_refused_naming_the_field(module, name, field, value):
    cls = _config(module, name)
    with pytest.raises(ValueError, match=field):
        cls(**{field: value})


def test_the_kv_configs_of_the_shipped_table_still_pass():
    import json

    from glyd.kernels import registry as R
    from glyd.kv import registry as KV

    table = json.loads(R.table_file(R.FALLBACK).read_text())
    for code, ops in table["kv"].items():
        for op, cands in ops.items():
            for c in cands:
                kc = KV.kernel_class(c["kernel"])
                if hasattr(kc, "Config"):  # (a stand-in where the family does not import)
                    kc.Config(**c["config"])
    for prefetch in (None, True, False):
        _config("_gluon", "GluonConfig")(prefetch=prefetch)
