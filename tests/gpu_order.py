"""The GPU set's test order (tests/conftest.py applies it on a CUDA machine)."""

# The GPU set's longest tests (dense11's kernel builds, 30-140 s each on an H100, 2026-12-06), spread evenly through
# the selected tests: pytest-xdist hands each worker contiguous chunks, so tests of one kind side by side run in a
# row in one worker (three M groups of one shape, 278 s, the kernels part's wall); moved to the front they fell into
# the first chunks together (the kernels part past its 400 s limit, 2026-12-06). dense11_wgmma's product tests: 130-192
# s each before their split (2026-12-07, history/2026-12-07-h100-33.md).
LONG_GPU_TESTS = ("test_mma_on_the_gpu", "test_large_on_the_gpu", "test_7b_shapes_give_version_2s_bits_on_the_gpu",
                  "test_matches_reference_gpu", "test_ring_gives_the_register_tiles_bits_gpu",
                  "test_ring_of_128_and_256_x_rows_gpu")


def spread_long_gpu_tests(items: list) -> None:
    """Place the ``LONG_GPU_TESTS`` cases at even intervals among the others, keeping the order within each part."""
    long = [item for item in items if getattr(item, "originalname", item.name) in LONG_GPU_TESTS]
    if not long:
        return
    rest = [item for item in items if getattr(item, "originalname", item.name) not in LONG_GPU_TESTS]
    spread, at = [], 0
    for n, item in enumerate(long):
        cut = n * len(rest) // len(long)
        spread += rest[at:cut] + [item]
        at = cut
    items[:] = spread + rest[at:]
