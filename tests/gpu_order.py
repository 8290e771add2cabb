"""The GPU set's test order (tests/conftest.py applies it on a CUDA machine)."""

# The GPU set's longest tests (dense11's kernel builds, 30-140 s each on an H100, 2026-12-06): pytest-xdist hands each
# worker a contiguous chunk first, so tests of one kind side by side ran in a row in one worker (three M groups of one
# shape, 278 s, the kernels part's wall); moved to the front together they fell into the first chunks (the kernels
# part past its 400 s limit, 2026-12-06); spread evenly, the last started late (2026-12-07). Now each chunk starts
# with its share. dense11_wgmma's product tests: 130-192 s each before their split (history/2026-12-07-h100-33.md).
LONG_GPU_TESTS = ("test_mma_on_the_gpu", "test_large_on_the_gpu", "test_7b_shapes_give_version_2s_bits_on_the_gpu",
                  "test_matches_reference_gpu", "test_ring_gives_the_register_tiles_bits_gpu",
                  "test_ring_of_128_and_256_x_rows_gpu")


def xdist_chunks(n: int, workers: int) -> list[int]:
    """The sizes of pytest-xdist's first hand-out of ``n`` tests to ``workers`` idle workers (worksteal and load both
    send worker i ``pending // workers left`` of the tests still pending, in order)."""
    sizes, left = [], n
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def spread_long_gpu_tests(items: list, workers: int = 1) -> None:
    """Order the ``LONG_GPU_TESTS`` cases among the others, keeping the order within each part. With ``workers``
    (pytest-xdist's) each worker's first hand-out starts with its share of them, round robin: every worker begins
    with a long test, none gets two before all have one (spread evenly instead, the long test at 56% of the order
    started late and ran past the kernels part's limit, 2026-12-07, history/2026-12-07-h100-35.md). Alone, or with
    more long tests a hand-out than it holds, they are spread at even intervals."""
    long = [item for item in items if getattr(item, "originalname", item.name) in LONG_GPU_TESTS]
    if not long:
        return
    rest = [item for item in items if getattr(item, "originalname", item.name) not in LONG_GPU_TESTS]
    sizes = xdist_chunks(len(items), workers) if workers > 1 else []
    shares = [long[w::workers] for w in range(workers)] if sizes else []
    if sizes and all(len(share) <= size for share, size in zip(shares, sizes)):
        ordered, at = [], 0
        for share, size in zip(shares, sizes):
            ordered += share + rest[at:at + size - len(share)]
            at += size - len(share)
        items[:] = ordered
        return
    spread, at = [], 0
    for n, item in enumerate(long):
        cut = n * len(rest) // len(long)
        spread += rest[at:cut] + [item]
        at = cut
    items[:] = spread + rest[at:]
