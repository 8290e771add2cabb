"""The kernel tables (``src/glyd/kernels/tables/*.json``, ``tables/README.md``): their schema and
coverage, not their values, so that a re-tune changes the tables (and the docs' table of what they
choose, checked here against them) without breaking a test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from glyd.codec import LAYOUTS
from glyd.kernels import registry as R

from .conftest import needs_triton
from .test_registry import h200

pytestmark = needs_triton

DOCS = Path(__file__).resolve().parents[2] / "docs" / "kernels.md"
TABLES = sorted(Path(R.__file__).with_name("tables").glob("*.json"))

#: (N, K) examples of every shape class (K not a multiple of 128 too, where the class allows it).
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
KERNEL_LAYOUTS = [name for name, lay in LAYOUTS.items() if lay.kernels]
CPU = R.Device("cpu", "cpu", interpreting=True)


def test_the_examples_cover_every_shape_class():
    assert set(SHAPES) == set(R.SHAPE_CLASSES)
    assert all(R.shape_class(n, k) == cls for cls, shapes in SHAPES.items() for n, k in shapes)


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name)
def test_every_table_has_the_schema_and_its_configs_make(path):
    table = R._load_table(path)  # checks the schema (registry.check_table)
    assert isinstance(table.get("gpu"), str) and R.table_file(table["gpu"]).name == path.name
    assert isinstance(table.get("about"), list) and all(isinstance(a, str) for a in table["about"])
    for layout, classes in table["linear"].items():
        for cls, cells in classes.items():
            for bucket, cands in cells.items():
                lo = next(lo for b, lo, _ in R.M_BUCKETS if b == bucket)
                for n, k in SHAPES[cls]:
                    problem = R.Problem(layout, lo, n, k, LAYOUTS[layout].padded_cols(k))
                    for c in cands:
                        R.kernel_class(c["kernel"]).make_config(dict(c["config"]), problem)  # raises if bad


@pytest.mark.parametrize("layout", KERNEL_LAYOUTS)
def test_the_fallback_table_covers_every_cell_and_ends_in_a_kernel_that_runs_anywhere(layout):
    # a GPU without a table of its own, and the interpreter, still get a kernel for every product
    table = R.table_for(R.Device("cuda", "Some Future GPU"))["linear"][layout]
    for cls in R.SHAPE_CLASSES:
        for bucket, lo, _ in R.M_BUCKETS:
            cands = table.get(cls, {}).get(bucket)
            assert cands, (layout, cls, bucket)
            last = R.kernel_class(cands[-1]["kernel"])
            for n, k in SHAPES[cls]:
                problem = R.Problem(layout, lo, n, k, LAYOUTS[layout].padded_cols(k))
                ok, why = last.can_implement(problem, CPU, last.make_config(dict(cands[-1]["config"]), problem))
                assert ok, (layout, cls, bucket, n, k, why)
                assert R.choose(problem, CPU)[0].layout == layout


def test_the_layout_times_name_shapes_and_layouts():
    for path in TABLES:
        times = R._load_table(path).get("layout", {}).get("shapes", {})
        for shape, row in times.items():
            assert re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", shape), (path.name, shape)
            assert set(row) <= {"bf16", *LAYOUTS} and all(v > 0 for v in row.values()), (path.name, shape)


# The docs' table of the H200 table's choices for a Qwen2.5-7B model (docs/kernels.md): each column
# and the shapes it stands for; a cell is the choice on the H200 and, in brackets where it differs,
# where no Gluon kernel runs. Family keys lose their layout's prefix there.
COLUMNS = {"k, v": [(512, 3584)], "q, o, merged qkv": [(3584, 3584), (4608, 3584)], "gate, up": [(18944, 3584)],
           "merged gate_up": [(37888, 3584)], "down": [(3584, 18944)], "lm_head": [(152064, 3584)]}


def _name(layout: str, problem: R.Problem, device: R.Device) -> str:
    return R.choose(problem, device)[0].name.removeprefix(f"{layout}_")


def _cell(layout: str, shapes: list[tuple[int, int]], m: int) -> str:
    names = set()
    for n, k in shapes:
        p = R.Problem(layout, m, n, k, LAYOUTS[layout].padded_cols(k), LAYOUTS[layout].writes)  # as glyd.pack writes
        best, plain = _name(layout, p, h200(True, True, True)), _name(layout, p, h200(False, False, False))
        names.add(best if best == plain else f"{best} ({plain})")
    assert len(names) == 1, f"the docs' column of {shapes} holds shapes the table treats apart: {names}"
    return names.pop()


def _docs_rows(first: str) -> list[str]:
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_docs_table_is_what_the_h200_table_chooses():
    want = ["| M | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for bucket, lo, _ in R.M_BUCKETS:
        want.append(f"| {bucket} | " + " | ".join(_cell("fixed12", s, lo) for s in COLUMNS.values()) + " |")
    assert _docs_rows("| M | k, v |") == want, "docs/kernels.md's table, as the table now chooses:\n" + "\n".join(want)


def test_the_docs_table_of_the_other_layouts_is_what_the_h200_table_chooses():
    others = [lay for lay in KERNEL_LAYOUTS if lay != "fixed12"]
    every = [s for shapes in COLUMNS.values() for s in shapes]
    want = ["| M | " + " | ".join(others) + " |", "|---" * (len(others) + 1) + "|"]
    for bucket, lo, _ in R.M_BUCKETS:
        want.append(f"| {bucket} | " + " | ".join(_cell(lay, every, lo) for lay in others) + " |")
    assert _docs_rows("| M | " + others[0]) == want, "docs/kernels.md's table, as the table now chooses:\n" + \
        "\n".join(want)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU answer")
def test_gluon_not_available_off_a_gpu():
    import torch

    assert "gluon" not in R.Device.of(torch.device("cpu")).features
