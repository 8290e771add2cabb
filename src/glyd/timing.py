"""GPU timing shared by the benchmarks and ``glyd bench``: one CUDA graph, median of its replays.

>>> from glyd.timing import cuda_graph_ms                          # doctest: +SKIP
>>> cuda_graph_ms(lambda: torch.mm(a, b), replays=30)             # doctest: +SKIP
0.41
"""

from __future__ import annotations

import statistics
from collections.abc import Callable


def cuda_graph_ms(fn: Callable[[], object], replays: int = 30, *, warmup: int = 3, slow_ms: float | None = 100.0) -> float:
    """Median milliseconds of replaying a CUDA graph of ``fn``.

    ``fn`` runs eagerly once (compiles kernels), then ``warmup`` times on a side stream, as CUDA
    graph capture requires, then is captured once and replayed ``warmup`` times before timing with
    CUDA events. When a replay takes longer than ``slow_ms``, at most 20 replays are timed (the
    benchmark protocol's minimum) to keep slow variants affordable.
    """
    import torch

    fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times: list[float] = []
    for i in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        if i == 0 and slow_ms is not None and times[0] > slow_ms:
            replays = min(replays, 20)
    del graph
    return statistics.median(times)
