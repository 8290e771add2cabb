"""The measurements of ``benchmarks/scale.py``: decode step, time to first token, KV capacity.

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
    return statistics.median(samples)


def decode_static(model: nn.Module, batches: tuple[int, ...], context: int, replays: int, device: str,
                  graphs: bool = True) -> tuple[dict[int, float | None], str]:
    """``glyd eval``'s decode step (static cache of ``context``, one CUDA graph a step) at each batch
    size, one at a time so that a batch that runs out of memory leaves the others measured."""
    out: dict[int, float | None] = {}
    methods = set()
    for b in batches:
        got = oom_safe(lambda b=b: time_decode(model, (b,), context, replays, device, graphs), device,
                       f"decode step at {b} sequences")
        out[b] = None if got is None else got[0][b]
        if got is not None:
            methods.add(got[1])
        free_memory(device)
    return out, "; ".join(sorted(methods))


def _fill_glyd_cache(cache, config, batch: int, tokens: int, device: str, chunk: int) -> None:
    """Append ``tokens`` random bf16 keys and values (normal, as projected states roughly are) to
    every layer of a ``GlydCache``, ``chunk`` tokens at a time, straight into its page stores."""
    text = config.get_text_config(decoder=True)
    kv = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    hd = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    g = torch.Generator(device=device).manual_seed(11)
    done = 0
    while done < tokens:
        n = min(chunk, tokens - done)
        for layer in cache.layers:
            k = torch.randn(batch, kv, n, hd, generator=g, device=device).to(torch.bfloat16)
            v = torch.randn(batch, kv, n, hd, generator=g, device=device).to(torch.bfloat16)
            if not layer.is_initialized:
                layer.lazy_initialization(k, v)
            layer.k_store.append(k)  # not layer.update: that also unpacks the whole layer
            layer.v_store.append(v)
            del k, v
        done += n


def _kv_step(model: nn.Module, cache, batch: int, position: int, device: str) -> Callable[[], object]:
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (batch, 1), generator=torch.Generator().manual_seed(5)).to(device)
    pos = torch.full((batch, 1), position, dtype=torch.long, device=device)

    def step():
        return model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True).logits

    return step


@torch.no_grad()
def decode_lossless(model: nn.Module, batches: tuple[int, ...], context: int, replays: int,
                    device: str) -> tuple[dict[int, float | None], str, float | None]:
    """Decode step over glyd's lossless KV cache (``GlydCache(fused=True)``, the fused decode
    attention), eager steps: the cache holds ``context - 1`` random tokens first and grows by one
    token a step. Returns (ms by batch, method, the cache's bytes / bf16's at the first batch)."""
    from glyd.kv import GlydCache
    from glyd.kv.cache import enable_fused

    enable_fused(model)
    out: dict[int, float | None] = {}
    ratio = None

    def one(b: int) -> float:
        nonlocal ratio
        cache = GlydCache(model.config, fused=True)
        _fill_glyd_cache(cache, model.config, b, context - 1, device, chunk=context)
        ratio = ratio if ratio is not None else cache.nbytes / max(cache.bf16_nbytes, 1)
        return _timed(_kv_step(model, cache, b, context - 1, device), device, replays, warmup=3)

    for b in batches:
        out[b] = oom_safe(lambda b=b: one(b), device, f"lossless-KV decode step at {b} sequences")
        free_memory(device)
    return out, f"eager steps over GlydCache(fused=True) from {context - 1} tokens, one more a step", ratio


@torch.no_grad()
def ttft(model: nn.Module, prompt: int, device: str, reps: int, lossless: bool = False) -> float | None:
    """Time to first token: one prefill forward of ``prompt`` random tokens, one sequence, logits of
    the last position only (a fresh cache each time: DynamicCache, or GlydCache with ``lossless``)."""
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (1, prompt), generator=torch.Generator().manual_seed(3)).to(device)

    def run():
        kw = {}
        if lossless:
            from glyd.kv import GlydCache

            kw["past_key_values"] = GlydCache(model.config, fused=True)
        return model(input_ids=ids, use_cache=True, logits_to_keep=1, **kw).logits

    return oom_safe(lambda: _timed(run, device, reps, warmup=1), device, f"prefill of {prompt} tokens")


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
def lossless_capacity(model: nn.Module, batch: int, device: str, chunk: int, limit: int) -> int:
    """Tokens a sequence that glyd's lossless KV cache holds with one fused decode step still running:
    a ``GlydCache`` is filled with random keys and values ``chunk`` tokens at a time until the GPU runs
    out of memory (or ``limit``); then a fresh cache is filled to one chunk less and a decode step
    run, one chunk less again until the step runs. 0 if none."""
    from glyd.kv import GlydCache

    cache = GlydCache(model.config, fused=True)
    top = 0
    while top + chunk <= limit:
        ok = oom_safe(lambda: _fill_glyd_cache(cache, model.config, batch, chunk, device, chunk) or True, device,
                      f"lossless cache past {top} tokens")
        if not ok:
            break
        top += chunk
    del cache
    free_memory(device)
    n = top - chunk if top + chunk <= limit else top

    def filled_and_stepped(n: int) -> bool:
        c = GlydCache(model.config, fused=True)
        _fill_glyd_cache(c, model.config, batch, n, device, chunk)
        _kv_step(model, c, batch, n, device)()
        return True

    while n > 0:
        ok = oom_safe(lambda: filled_and_stepped(n), device, f"decode step over {n} lossless tokens")
        free_memory(device)
        if ok:
            return n
        n -= chunk
    return 0
