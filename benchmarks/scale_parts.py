"""The measurements of ``benchmarks/scale.py``: decode step, time to first token (eager or compiled, the
compiled prefill ``ttft_ab.py`` uses too), KV capacity.

Every measurement that can run out of GPU memory returns ``None`` (and the caller writes "OOM") rather
than raise: a 70B model in bf16 fits with little room, and the table says where it did not.
"""

from __future__ import annotations

import gc
import logging
import statistics
import time
from typing import Callable

import torch
from torch import nn

from glyd.apps.eval_timing import _StepRunner, time_decode

log = logging.getLogger("scale")


def free_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def oom_safe(fn: Callable, device: str, what: str):
    """``fn()``, or None when the GPU runs out of memory (logged, memory given back)."""
    try:
        return fn()
    except torch.OutOfMemoryError:
        log.info("%s: out of GPU memory", what)
    free_memory(device)
    return None


def _timed(run: Callable[[], object], device: str, reps: int, warmup: int) -> float:
    """Median ms of ``run()`` (CUDA events on a GPU, the wall clock on the CPU)."""
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(reps):
        if device.startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            run()
            samples.append(1e3 * (time.perf_counter() - t))
    if min(samples) > 0 and max(samples) > 1.2 * min(samples):  # the eager first token varied 1.6x between runs
        log.info("timed samples vary: min %.3f, median %.3f, max %.3f ms (%d)", min(samples),
                 statistics.median(samples), max(samples), len(samples))
    return statistics.median(samples)


def decode_static(model: nn.Module, batches: tuple[int, ...], context: int, replays: int, device: str,
                  graphs: bool = True, kv: str = "bf16") -> tuple[dict[int, float | None], str]:
    """``glyd eval``'s decode step (static cache of ``context``, one CUDA graph a step) at each batch
    size, one at a time so that a batch that runs out of memory leaves the others measured.
    ``kv="lossless"``: against ``GlydStaticCache`` (the static pool of kvf12 pages, fused attention)."""
    out: dict[int, float | None] = {}
    methods = set()
    for b in batches:
        got = oom_safe(lambda b=b: time_decode(model, (b,), context, replays, device, graphs, kv=kv), device,
                       f"decode step at {b} sequences")
        out[b] = None if got is None else got[0][b]
        if got is not None:
            methods.add(got[1])
        free_memory(device)
    return out, "; ".join(sorted(methods))


def _fill_pool(cache, tokens: int, device: str, chunk: int) -> None:
    """Write ``tokens`` random bf16 keys and values (normal, as projected states roughly are) to every
    layer of a ``GlydStaticCache``'s pool, ``chunk`` tokens a call (each a prompt: one kernel a side)."""
    pool = cache.pool
    g = torch.Generator(device=device).manual_seed(11)
    done = 0
    while done < tokens:
        n = min(chunk, tokens - done)
        pool.advance(n)
        for i in range(pool.layers):
            k = torch.randn(pool.batch, pool.heads, n, pool.head_dim, generator=g, device=device).to(torch.bfloat16)
            v = torch.randn(pool.batch, pool.heads, n, pool.v_head_dim, generator=g, device=device).to(torch.bfloat16)
            pool.write(i, k, v)
            del k, v
        done += n


def _pool_step(model: nn.Module, cache, batch: int, position: int, device: str) -> Callable[[], object]:
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (batch, 1), generator=torch.Generator().manual_seed(5)).to(device)
    pos = torch.full((batch, 1), position, dtype=torch.long, device=device)
    mask = torch.zeros((batch, 1, 1, cache.context), dtype=torch.bfloat16, device=device)
    mask[..., position + 1 :] = torch.finfo(torch.bfloat16).min

    def step():
        return model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True).logits

    return step


def _glyd_cache(model: nn.Module, **kw):
    from glyd.kv import GlydStaticCache, enable_fused

    enable_fused(model)
    return GlydStaticCache(model.config, **kw)


@torch.no_grad()
def lossless_ratio(model: nn.Module, batch: int, tokens: int, device: str) -> float | None:
    """Bytes that ``tokens`` random tokens take in ``GlydStaticCache``'s pool against a bf16 cache's."""
    try:
        cache = _glyd_cache(model, max_cache_len=tokens)
        _pool_step(model, cache, batch, 0, device)()  # makes the pool
        cache.reset()
        _fill_pool(cache, tokens, device, chunk=max(64, tokens))
        return cache.nbytes / max(cache.bf16_nbytes, 1)
    except torch.OutOfMemoryError:
        free_memory(device)
        return None


#: ``--compile``'s prefill: torch.compile's CUDA graphs a prompt length on a GPU (inductor without graphs on the CPU).
COMPILE_MODE = "reduce-overhead"
#: What the record says of each prefill mode (``ttft_ab.py``'s footer, ``scale.py``'s JSON and table).
PREFILL_EAGER, PREFILL_COMPILED = "eager", f'torch.compile(mode="{COMPILE_MODE}")'
#: Calls before timing a compiled prefill: the compile, then CUDA graph trees record on the third call.
COMPILE_WARMUP = 3


def prefill(forward: Callable, ids: torch.Tensor, cache=None) -> torch.Tensor:
    """One prefill of ``ids``, logits of the last position only; ``cache`` (a ``GlydStaticCache``)
    emptied first and passed, else transformers makes a fresh DynamicCache."""
    kw = {}
    if cache is not None:
        cache.reset()
        kw["past_key_values"] = cache
    return forward(input_ids=ids, use_cache=True, logits_to_keep=1, **kw).logits


@torch.no_grad()
def compile_prefill(model: nn.Module, prompts: tuple[int, ...], device: str, caches: dict | None = None) -> nn.Module:
    """``torch.compile(model, mode=COMPILE_MODE, dynamic=False)`` after one eager prefill of each prompt
    length (with ``caches[prompt]`` where given): Glyd's per-matrix state (exception indices, launch plans,
    scratch) built on a first call would otherwise be made inside CUDA graph trees' pool ("tensors in the
    cudagraph pool not tracked as outputs", 2026-12-05). The eager ``model`` stays usable as it was."""
    for p in prompts:
        prefill(model, torch.zeros(1, p, dtype=torch.long, device=device), (caches or {}).get(p))
    return torch.compile(model, mode=COMPILE_MODE, dynamic=False)


@torch.no_grad()
def ttft(model: nn.Module, prompt: int, device: str, reps: int, lossless: bool = False, *,
         forward: Callable | None = None, cache=None) -> float | None:
    """Time to first token: one prefill forward of ``prompt`` random tokens, one sequence, logits of
    the last position only (a fresh DynamicCache each time, or with ``lossless`` a GlydStaticCache of
    ``prompt`` tokens, ``cache`` or one made here, emptied before each prefill: its pages are packed by
    the prefill). ``forward``: what to call (``compile_prefill``'s module; warmed up ``COMPILE_WARMUP``
    times), else ``model`` eagerly (one warm-up)."""
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (1, prompt), generator=torch.Generator().manual_seed(3)).to(device)
    if lossless and cache is None:
        cache = _glyd_cache(model, max_cache_len=prompt)
    fn, warmup = (model, 1) if forward is None else (forward, COMPILE_WARMUP)
    return oom_safe(lambda: _timed(lambda: prefill(fn, ids, cache if lossless else None), device, reps, warmup),
                    device, f"prefill of {prompt} tokens")


def graph_breaks() -> int:
    """Graph breaks torch.compile (dynamo) has counted in this process so far."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def ttfts(model: nn.Module, prompts: tuple[int, ...], device: str, reps: int, lossless: bool = False,
          compiled: bool = False) -> dict[str, float | None]:
    """``ttft`` at each prompt length (None: out of memory); ``compiled``: through ``compile_prefill``
    (one compiled module for every length, a GlydStaticCache a length with ``lossless``), whose compiled
    code and CUDA graph pools are given back afterwards (the capacity search measures free memory)."""
    if not compiled:
        return {str(p): ttft(model, p, device, reps, lossless) for p in prompts}
    caches = {p: _glyd_cache(model, max_cache_len=p) for p in prompts} if lossless else {}
    fwd = oom_safe(lambda: compile_prefill(model, prompts, device, caches), device, "the eager prefills")
    try:
        return {str(p): None if fwd is None else ttft(model, p, device, reps, lossless, forward=fwd,
                                                      cache=caches.get(p)) for p in prompts}
    finally:
        del fwd
        caches.clear()
        torch._dynamo.reset()
        if device.startswith("cuda"):  # the graphs' private pools (reset() frees them too in newer torch)
            from torch._inductor.cudagraph_trees import reset_cudagraph_trees

            reset_cudagraph_trees()
        free_memory(device)


def largest(fits: Callable[[int], bool], hi: int, step: int) -> int:
    """The largest multiple of ``step`` in [0, ``hi``] for which ``fits`` holds (``fits`` is monotone:
    true up to some length, false beyond), 0 if none; bisection, about log2(hi / step) calls.

    >>> largest(lambda n: n <= 1000, 4096, 64)
    960
    """
    lo, top = 0, hi // step
    while lo < top:
        mid = (lo + top + 1) // 2
        if fits(mid * step):
            lo = mid
        else:
            top = mid - 1
    return lo * step


@torch.no_grad()
def static_fits(model: nn.Module, batch: int, context: int, device: str) -> bool:
    """Whether a static cache of ``context`` tokens x ``batch`` sequences and one decode step at its
    last position fit in the GPU's memory (the step's activations and attention's temporaries included)."""
    def run() -> bool:
        runner = _StepRunner(model, batch, context, device)
        runner.position = context - 1
        runner.pos.fill_(context - 1)
        runner.mask.zero_()
        runner.reset()
        runner.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return True

    ok = bool(oom_safe(run, device, f"static cache of {context} x {batch}"))
    free_memory(device)
    return ok


@torch.no_grad()
def lossless_capacity(model: nn.Module, batch: int, device: str, chunk: int) -> int:
    """Tokens a sequence that ``GlydStaticCache`` holds with one fused decode step still running: the
    largest pool that a share of the free memory holds (``memory_fraction`` from 0.97 down until the
    rest leaves room for the step), filled with random keys and values to its last position, then one
    decode step there. 0 if none."""
    for fraction in (0.97, 0.95, 0.92, 0.88, 0.84, 0.8, 0.75, 0.7, 0.6, 0.5):
        def filled_and_stepped(fraction=fraction) -> int:
            cache = _glyd_cache(model, batch_size=batch, device=device, memory_fraction=fraction)
            n = cache.context - 1
            _fill_pool(cache, n, device, chunk)
            _pool_step(model, cache, batch, n, device)()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            cache.check()
            return cache.context

        got = oom_safe(filled_and_stepped, device, f"GlydStaticCache of {fraction:.2f} of free memory")
        free_memory(device)
        if got:
            log.info("GlydStaticCache: %d tokens at %.2f of free memory", got, fraction)
            return got
    return 0
