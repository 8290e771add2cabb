"""The GPU set's test order (tests/conftest.py): the longest GPU tests at the start of each pytest-xdist worker's first
hand-out, or spread evenly among the others."""
from types import SimpleNamespace

from gpu_order import LONG_GPU_TESTS, spread_long_gpu_tests, xdist_chunks


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


def test_each_workers_first_hand_out_starts_with_its_long_tests():
    long = LONG_GPU_TESTS[0]
    items = _items([long] * 5 + ["short"] * 35)
    spread_long_gpu_tests(items, 4)
    assert xdist_chunks(40, 4) == [10, 10, 10, 10]
    chunks = [items[i:i + 10] for i in range(0, 40, 10)]
    assert [sum(item.originalname == long for item in c) for c in chunks] == [2, 1, 1, 1]
    assert all(c[0].originalname == long for c in chunks) and chunks[0][1].originalname == long
    assert [item.name for item in items if item.originalname == long] == [f"{long}[{i}]" for i in (0, 4, 1, 2, 3)]
    assert [item.name for item in items if item.originalname == "short"] == [f"short[{i}]" for i in range(5, 40)]


def test_xdist_chunks_hand_out_every_test_once():
    for n, w in ((641, 16), (7, 3), (2, 4)):
        sizes = xdist_chunks(n, w)
        assert sum(sizes) == n and len(sizes) == w and max(sizes) - min(sizes) <= 1


def test_a_test_a_worker_and_more_long_tests_than_a_hand_out_holds():
    long = LONG_GPU_TESTS[0]
    items = _items([long] * 4 + ["short"] * 12)
    spread_long_gpu_tests(items, 16)  # a test a worker: each long one leads a hand-out of its own
    assert [i for i, item in enumerate(items) if item.originalname == long] == [0, 1, 2, 3]
    items = _items(["short"] + [long] * 9)
    spread_long_gpu_tests(items, 4)  # hand-outs of 2, 2, 3, 3: the first worker's share (3) does not fit
    assert [item.name for item in items] == [f"{long}[{i}]" for i in range(1, 10)] + ["short[0]"]
