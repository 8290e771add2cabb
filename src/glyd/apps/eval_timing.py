"""Timing one decode step of a whole model (``glyd eval``): a CUDA graph replayed, or eager steps."""

from __future__ import annotations

import gc
import logging
import statistics
import time
from typing import Any, Callable

import torch
from torch import nn

log = logging.getLogger(__name__)


#: ``kv=`` of the decode step: the static cache it runs against.
KV_CACHES = ("bf16", "lossless")


class _StepRunner:
    """One decode step of ``model`` at batch ``b`` against a static cache of ``context`` positions:
    transformers' ``StaticCache`` (``kv="bf16"``) or glyd's ``GlydStaticCache`` (``kv="lossless"``: the
    static pool of kvf12 pages, read by the fused attention)."""

    def __init__(self, model: nn.Module, b: int, context: int, device: str, kv: str = "bf16") -> None:
        if kv not in KV_CACHES:
            raise ValueError(f"kv must be one of {KV_CACHES}, got {kv!r}")
        self.model = model
        self.kv = kv
        if kv == "lossless":
            from glyd.kv import GlydStaticCache, enable_fused

            enable_fused(model)
            self.cache = GlydStaticCache(model.config, max_cache_len=context)
        else:
            from transformers import StaticCache

            self.cache = StaticCache(config=model.config, max_cache_len=context)
        self.position = context // 2
        vocab = model.config.get_text_config().vocab_size
        gen = torch.Generator(device="cpu").manual_seed(1234 + b)
        self.ids = torch.randint(0, vocab, (b, 1), generator=gen).to(device)
        self.pos = torch.full((b, 1), self.position, dtype=torch.long, device=device)
        mask = torch.zeros((b, 1, 1, context), dtype=torch.bfloat16, device=device)
        mask[..., self.position + 1 :] = torch.finfo(torch.bfloat16).min
        self.mask = mask
        self.out: torch.Tensor | None = None
        self._counters: list[tuple[torch.Tensor, torch.Tensor]] = []

    def reset(self) -> None:
        # Every replay must write the same slot: rewind transformers' static layers' position counters,
        # or the pool's lengths and exception counters to where fill_cache left them.
        if self.kv == "lossless":
            pool = self.cache.pool
            if pool is not None and not self._counters:
                pool.lens.fill_(self.position)
            for t, saved in self._counters:
                t.copy_(saved)
            if pool is not None:
                pool.forget()  # lens was rewound (and replays advance it without the pool's host count)
            return
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.fill_(self.position)

    def step(self) -> torch.Tensor:
        out = self.model(
            input_ids=self.ids, attention_mask=self.mask, position_ids=self.pos, past_key_values=self.cache, use_cache=True
        )
        return out.logits

    def fill_cache(self) -> None:
        gen = torch.Generator(device=self.ids.device).manual_seed(7)
        if self.kv == "lossless":  # the pool holds `position` random tokens, packed as a prompt would be
            pool = self.cache.pool
            pool.reset()
            pool.advance(self.position)
            for i in range(pool.layers):
                k, v = (torch.randn(pool.batch, pool.heads, self.position, d, generator=gen, device=self.ids.device)
                        .to(torch.bfloat16) for d in (pool.head_dim, pool.v_head_dim))
                pool.write(i, k, v)
            self._counters = [(t, t.clone()) for t in (pool.lens, *pool.k.used, *pool.v.used)]
            return
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                for t in (layer.keys, layer.values):
                    t.copy_(torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32).to(t.dtype))

    def check(self) -> None:
        """Raise if the lossless cache overflowed while timing (host sync)."""
        if self.kv == "lossless":
            self.cache.check()


@torch.no_grad()
def time_decode(model: nn.Module, batches: tuple[int, ...], context: int, replays: int, device: str, graphs: bool,
                kv: str = "bf16") -> tuple[dict[int, float], str]:
    """Median time (ms) of one decode step at each batch size against a static ``kv`` cache
    (``KV_CACHES``), and how it was measured."""
    times: dict[int, float] = {}
    methods = set()
    attn = getattr(model.config, "_attn_implementation", None)
    for b in batches:
        runner = _StepRunner(model, b, context, device, kv)
        runner.reset()
        runner.step()  # allocates the cache
        runner.fill_cache()
        if device.startswith("cuda"):
            ms, method = _time_cuda(runner, replays, graphs)
        else:
            ms, method = _time_cpu(runner, replays)
        runner.check()
        times[b] = ms
        methods.add(method + (", GlydStaticCache (kvf12 pool, fused attention)" if kv == "lossless" else ""))
        del runner
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    if kv == "lossless" and attn is not None:
        model.set_attn_implementation(attn)  # the fused attention was switched on for the lossless cache
    return times, ", ".join(sorted(methods))


@torch.no_grad()
def time_decode_compiled(model: nn.Module, batches: tuple[int, ...], context: int, replays: int,
                         device: str, kv: str = "bf16") -> tuple[dict[int, float], str]:
    """Median time (ms) of one decode step of ``torch.compile(model, mode="reduce-overhead")`` (CUDA
    graphs made by torch's compiler on a GPU; on the CPU the same mode compiles without graphs)."""
    compiled = torch.compile(model, mode="reduce-overhead")
    cuda = device.startswith("cuda")
    times: dict[int, float] = {}
    for b in batches:
        # An eager step allocates the cache first: transformers marks its tensors as static addresses
        # only outside torch.compile, and a cache made inside the compiled graph is a graph output that
        # the next replay overwrites (the H200 run of 2026-12-02 failed so).
        runner = _StepRunner(model, b, context, device, kv)
        runner.reset()
        runner.step()
        runner.fill_cache()
        runner.model = compiled
        for _ in range(4):  # compiles (and on a GPU records its graphs), then warm replays
            runner.reset()
            torch.compiler.cudagraph_mark_step_begin()
            runner.step()
        _check_compiled(runner, model)
        samples = []
        for _ in range(replays if cuda else max(3, min(replays, 10))):
            runner.reset()
            torch.compiler.cudagraph_mark_step_begin()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                runner.step()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            else:
                t = time.perf_counter()
                runner.step()
                samples.append(1e3 * (time.perf_counter() - t))
        times[b] = statistics.median(samples)
        del runner
        gc.collect()
    where = "median GPU time (events)" if cuda else "CPU wall time"
    return times, f"torch.compile(mode='reduce-overhead') of the model, static cache, {where}"


def _check_compiled(runner: _StepRunner, model: nn.Module) -> None:
    """The compiled step must compute what an eager step computes (inductor may round differently)."""
    compiled = runner.model
    runner.reset()
    torch.compiler.cudagraph_mark_step_begin()
    got = runner.step().float().clone()
    runner.model = model
    runner.reset()
    want = runner.step().float()
    runner.model = compiled
    diff = float((got - want).abs().max())
    if not torch.isfinite(got).all() or diff > 1e-2 * max(float(want.abs().max()), 1.0):
        log.warning("the compiled step differs from an eager step by %.4g (max |logit| %.4g)", diff,
                    float(want.abs().max()))


def _time_cpu(runner: _StepRunner, replays: int) -> tuple[float, str]:
    samples = []
    for _ in range(max(3, min(replays, 10))):
        runner.reset()
        t = time.perf_counter()
        runner.step()
        samples.append(1e3 * (time.perf_counter() - t))
    return statistics.median(samples), "CPU wall time of eager steps (static cache)"


def _time_cuda(runner: _StepRunner, replays: int, graphs: bool) -> tuple[float, str]:
    run: Callable[[], Any]
    method = "CUDA graph of one step (static cache), median GPU time of replays"
    graph = None
    if graphs:
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    runner.reset()
                    runner.step()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            runner.reset()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                runner.out = runner.step()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 -- any capture failure falls back to eager timing
            log.warning("CUDA graph capture failed (%s: %s); timing eager steps", type(exc).__name__, exc)
            graph = None
            torch.cuda.synchronize()
    if graph is not None:
        run = graph.replay
        # The replayed graph must compute what an eager step computes (same inputs, same slot).
        runner.reset()
        graph.replay()
        replayed = runner.out.float().clone()
        runner.reset()
        eager = runner.step().float()
        diff = float((replayed - eager).abs().max())
        if not torch.isfinite(replayed).all() or diff > 1e-2 * max(float(eager.abs().max()), 1.0):
            log.warning("CUDA graph replay differs from an eager step by %.4g (max |logit| %.4g)", diff, float(eager.abs().max()))
        else:
            log.debug("CUDA graph replay matches an eager step (max diff %.3g)", diff)
    else:
        run = runner.step
        method = "eager steps (CUDA graph capture failed), median GPU time (events)"
    for _ in range(3):
        runner.reset()
        run()
    samples = []
    for _ in range(replays):
        runner.reset()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    del graph
    return statistics.median(samples), method
