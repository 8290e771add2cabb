"""The kernel families' keys were renamed (``gemv`` -> ``fixed12_gemv``, ``tc`` -> ``fixed12_word_dot``,
...) and the H200 table rewritten by ``benchmarks/rename_table_kernels.py``. This proves the rewrite
chooses what the table chose before, for every (layout, shape class, M bucket) and device kind: the
table as it was (``tests/data/kernels/NVIDIA_H200_old_keys.json``, main at 317676e) is read with the
registry as it was (old key -> kernel class, copied from ``registry.KERNELS`` there) and each cell's
choice compared with ``registry.choose`` on the new table (kernel class and every config field).

A one-time proof: it pins the table's values, so it goes (with the old table) once it has passed."""

from __future__ import annotations

import json
from pathlib import Path

from glyd.codec import LAYOUTS
from glyd.kernels import registry as R

from .conftest import needs_triton

pytestmark = needs_triton

OLD_TABLE = Path(__file__).resolve().parents[1] / "data" / "kernels" / "NVIDIA_H200_old_keys.json"

#: registry.KERNELS at 317676e: family key -> kernel class (the classes kept their names when moved).
OLD_KERNELS = {
    "gemv": "GemvKernel", "tc": "TcKernel", "mma": "MmaKernel", "tile": "TileKernel", "gluon": "GluonKernel",
    "wg": "WgKernel", "ws": "WsKernel", "long": "LongKernel", "tiered_gemv": "TieredGemvKernel",
    "tiered_long": "TieredLongKernel", "dense11_gemv": "Dense11GemvKernel", "dense11_long": "Dense11LongKernel",
}

#: (N, K) examples of every shape class: K a multiple of 256, and K not a multiple of 128 where the
#: class allows it (the Gluon families step aside there).
SHAPES = {
    "kv": [(512, 3584), (512, 3648), (1000, 1000), (16, 64)],
    "qo": [(3584, 3584), (3584, 3648), (2048, 4096), (4096, 1100)],
    "qkv": [(4608, 3584), (4600, 3520), (3072, 2048)],
    "gate": [(18944, 3584), (18944, 3648), (14336, 4096)],
    "big": [(37888, 3584), (37888, 3648), (28672, 8192)],
    "tall": [(3584, 18944), (3584, 18880), (4096, 14336)],
    "wide": [(65536, 1024), (65536, 1100), (128256, 512)],
    "wide_big": [(152064, 3584), (152064, 3648), (128256, 4096)],
    "tall_small": [(1024, 8192), (1000, 8256)],
    "tall_tiny": [(256, 8192), (200, 8256)],
    "wide_small": [(65536, 256), (65536, 200)],
    "wide_tiny": [(65536, 64), (65536, 48)],
    "tall_wide": [(65536, 131072), (65536, 131008)],
}


def _devices() -> dict[str, R.Device]:
    def gpu(name, cap, feats):
        return R.Device("cuda", name, cap, 132, False, frozenset(feats))

    return {
        "h200": gpu("NVIDIA H200", (9, 0), {"gluon", "wgmma", "tma"}),
        "h200 no tma": gpu("NVIDIA H200", (9, 0), {"gluon", "wgmma"}),
        "h200 no wgmma": gpu("NVIDIA H200", (9, 0), {"gluon"}),
        "h200 no gluon": gpu("NVIDIA H200", (9, 0), set()),
        "other gpu": gpu("Some Future GPU", (10, 0), {"gluon"}),
        "interpreter": R.Device("cpu", "cpu", interpreting=True),
    }


def _class_of(name: str) -> type:
    for key in R.KERNELS:
        kc = R.kernel_class(key)
        if kc.__name__ == name:
            return kc
    raise AssertionError(f"no kernel class {name}")


def _old_choose(cands: list[dict], problem: R.Problem, device: R.Device):
    """registry.choose of 317676e over one cell's candidates (first that makes a config and runs)."""
    for cand in cands:
        kc = _class_of(OLD_KERNELS[cand["kernel"]])
        try:
            cfg = kc.make_config(dict(cand["config"]), problem)
        except (TypeError, ValueError):
            continue
        if kc.can_implement(problem, device, cfg)[0]:
            return kc, cfg
    return None


def _cells(table: dict) -> set[tuple[str, str, str]]:
    return {(lay, cls, b) for lay, classes in table["linear"].items() for cls, bs in classes.items() for b in bs}


def test_every_cell_chooses_as_before():
    old = json.loads(OLD_TABLE.read_text(encoding="utf-8"))
    new = R.table_for(_devices()["h200"])
    assert _cells(old) == _cells(new) and old["layout"] == new["layout"]
    checked = set()
    for (layout, cls, bucket) in sorted(_cells(old)):
        lo, hi = next((lo, hi) for b, lo, hi in R.M_BUCKETS if b == bucket)
        cands = old["linear"][layout][cls][bucket]
        # the same candidates in the same order, each old key's class under its new key
        assert [(R.kernel_class(c["kernel"]), c["config"]) for c in new["linear"][layout][cls][bucket]] == [
            (_class_of(OLD_KERNELS[c["kernel"]]), c["config"]) for c in cands], (layout, cls, bucket)
        for n, k in SHAPES[cls]:
            assert R.shape_class(n, k) == cls
            kp = LAYOUTS[layout].padded_cols(k)
            for m in sorted({lo, hi or 2 * lo, (lo + (hi or 2 * lo)) // 2}):
                for dname, dev in _devices().items():
                    problem = R.Problem(layout, m, n, k, kp)
                    want = _old_choose(cands, problem, dev)
                    try:
                        got = R.choose(problem, dev)
                    except RuntimeError:
                        got = None
                    assert got == want, (layout, cls, bucket, m, n, k, dname)
                    checked.add((layout, cls, bucket, dname))
    assert {(lay, c, b) for lay, c, b, _ in checked} == _cells(old)


def test_the_rename_script_is_idempotent_and_changes_only_kernel_keys():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "rename_table_kernels.py"
    spec = importlib.util.spec_from_file_location("rename_table_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = OLD_TABLE.read_text(encoding="utf-8")
    once = mod.rewrite(text)
    assert mod.rewrite(once) == once
    assert once == R.table_file("NVIDIA H200").read_text(encoding="utf-8")
    for layout, classes in json.loads(once)["linear"].items():
        for cells in classes.values():
            for cands in cells.values():
                for c in cands:
                    assert c["kernel"].startswith(f"{layout}_") and R.kernel_class(c["kernel"]).layout == layout
