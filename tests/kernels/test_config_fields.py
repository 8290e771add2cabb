"""Kernel configs refuse values of the wrong type on creation, naming the field (glyd.kernels._fields):
``True`` passes ``isinstance(v, int)``, a table's ``"false"`` is truthy, and a float or a bool reached
the kernel and failed there (``numpy data itemsize (32 bits) exceeds dtype primitive_bitwidth``) or
silently turned a variant on."""

from __future__ import annotations

import importlib

import pytest

from .conftest import needs_triton

pytestmark = needs_triton

#: (module, config class, field, a value its checks used to let through)
CASES = [
    ("fixed12.gemv", "GemvConfig", "prefetch", "false"),
    ("fixed12.gemv", "GemvConfig", "exc_pass", 1),
    ("fixed12.gemv", "GemvConfig", "fixup", None),
    ("fixed12.word_dot", "TcConfig", "fixup", "no"),
    ("fixed12.word_dot", "TcConfig", "stages", 2.5),
    ("fixed12.word_dot", "TcConfig", "stages", True),
    ("fixed12.byte_dot", "TileConfig", "fixup", "yes"),
    ("fixed12.byte_dot", "TileConfig", "stages", 2.0),
    ("fixed12.operand_dot", "MmaConfig", "fixup", 0),
    ("fixed12.operand_dot", "MmaConfig", "stages", 3.5),
    ("fixed12.mma_v2", "GluonConfig", "x_ahead", "false"),
    ("fixed12.mma_v2", "GluonConfig", "exc_tile", 1),
    ("fixed12.mma_v2", "GluonConfig", "exc_chunk", 16.0),
    ("fixed12.mma_v2", "GluonConfig", "prefetch_depth", 2.0),
    ("fixed12.mma_v2", "GluonConfig", "maxnreg", 100.5),
    ("fixed12.wgmma", "WgConfig", "pipe", "false"),
    ("fixed12.wgmma", "WgConfig", "maxnreg", True),
    ("fixed12.wgmma_warpspec", "WsConfig", "stages", 2.5),
    ("fixed12.wgmma_warpspec", "WsConfig", "maxnreg", 64.0),
    ("fixed12.wgmma_warpspec", "WsConfig", "exc_chunk", 16.0),
    ("fixed12.experts", "ExpertsGemvConfig", "warps", 4.0),
    ("fixed12.experts", "ExpertsGemvConfig", "warps", True),
    ("fixed12.experts_mma", "ExpertsMmaConfig", "stages", True),
    ("fixed12.unpack", "UnpackConfig", "flat_groups", None),
    ("fixed12.unpack", "UnpackConfig", "flat_groups", False),
    ("tiered.gemv", "TieredGemvConfig", "area_reg_bytes", True),
    ("tiered.gemv", "TieredGemvConfig", "area_reg_bytes", 2.5),
    ("tiered.unpack", "TieredUnpackConfig", "area_reg_bytes", True),
    ("tiered.unpack", "TieredUnpackConfig", "area_reg_bytes", None),
    # the shared fields (_common.KernelConfig, pow2) and the experts configs
    ("fixed12.gemv", "GemvConfig", "bn", True),
    ("fixed12.gemv", "GemvConfig", "bk", 1 << 21),
    ("fixed12.gemv", "GemvConfig", "waves", 2.5),
    ("fixed12.gemv", "GemvConfig", "waves", float("nan")),
    ("fixed12.gemv", "GemvConfig", "waves", True),
    ("fixed12.gemv", "GemvConfig", "warps", 2.0),
    ("fixed12.gemv", "GemvConfig", "warps", True),
    ("fixed12.gemv", "GemvConfig", "split", True),
    ("tiered.gemv", "TieredGemvConfig", "mb", True),
    ("dense11.gemv", "Dense11GemvConfig", "bn", True),
    ("experts", "ExpertsGroupedConfig", "max_scratch_bytes", True),
    ("experts", "ExpertsGroupedConfig", "warps", 2.0),
    ("fixed12.experts_mma", "ExpertsMmaConfig", "max_rows", True),
]


def _config(module: str, name: str):
    try:
        return getattr(importlib.import_module(f"glyd.kernels.{module}"), name)
    except ImportError as exc:  # a Gluon family on a Triton without Gluon
        pytest.skip(f"{module} does not import: {exc}")


@pytest.mark.parametrize("module,name,field,value", CASES, ids=[f"{c[1]}.{c[2]}={c[3]!r}" for c in CASES])
def test_a_value_of_the_wrong_type_is_refused_naming_the_field(module, name, field, value):
    cls = _config(module, name)
    with pytest.raises(ValueError, match=f"{field}"):
        cls(**{field: value})


@pytest.mark.parametrize("module,name,field,value", CASES, ids=[f"{c[1]}.{c[2]}" for c in CASES])
def test_the_defaults_and_their_types_still_pass(module, name, field, value):
    cls = _config(module, name)
    default = getattr(cls(), field)
    assert type(default) in (bool, int), (name, field, default)
    assert getattr(cls(**{field: default}), field) == default
