"""The GPU set's test order (tests/conftest.py): the longest GPU tests spread evenly among the others."""
from types import SimpleNamespace

from gpu_order import LONG_GPU_TESTS, spread_long_gpu_tests


def _items(names):
    return [SimpleNamespace(name=f"{n}[{i}]", originalname=n) for i, n in enumerate(names)]


def test_long_tests_are_spread_evenly_and_each_part_keeps_its_order():
    long = LONG_GPU_TESTS[0]
    items = _items([long] * 4 + ["short"] * 12)
    spread_long_gpu_tests(items)
    where = [i for i, item in enumerate(items) if item.originalname == long]
    assert where == [0, 4, 8, 12]  # one in every 16 / 4 places, not four in a row
    assert [item.name for item in items if item.originalname == long] == [f"{long}[{i}]" for i in range(4)]
    assert [item.name for item in items if item.originalname == "short"] == [f"short[{i}]" for i in range(4, 16)]


def test_no_long_tests_and_only_long_tests_are_left_as_they_are():
    for names in (["a", "b", "c"], [LONG_GPU_TESTS[1]] * 3):
        items = _items(names)
        before = [item.name for item in items]
        spread_long_gpu_tests(items)
        assert [item.name for item in items] == before
