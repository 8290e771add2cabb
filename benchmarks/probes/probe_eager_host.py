"""Why eager decode (transformers' continuous batching, generate without a CUDA graph) is slower packed:
the top ops by self CPU time in a profiled eager generate, bf16 against fixed12, and the host time of
one product call (issue 39's serve table: fixed12 10.5 tokens/s against bf16's 27.4 at one request).
``--prefill N``: the same split for one eager N-token prefill (issue 38 item 2: the 0.5B first token).

    python3 benchmarks/probes/probe_eager_host.py --model qwen2.5-0.5b --prefill 512
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, "benchmarks")
from serve import build_model  # noqa: E402


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def host_us(fn, n=200):
    fn()
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    sync()
    return host


def prefill(a) -> None:
    """--prefill N: one eager forward of an N-token prompt (the first token's work), bf16 against fixed12:
    wall ms (median of 5), the host ms to issue it (no sync inside), the GPU kernels' summed time and the
    top ops by self CPU time, so the extra first-token time splits into host and GPU."""
    dev = a.device
    for weights in ("bf16", "fixed12"):
        model = build_model(a.model, weights, dev)
        ids = torch.randint(10, min(1000, model.config.vocab_size), (1, a.prefill), device=dev)
        fwd = lambda: model(ids, use_cache=False, logits_to_keep=1)  # noqa: E731
        with torch.no_grad():
            walls, hosts = [], []
            for _ in range(6):
                sync()
                t = time.perf_counter()
                fwd()
                hosts.append(time.perf_counter() - t)
                sync()
                walls.append(time.perf_counter() - t)
            acts = [torch.profiler.ProfilerActivity.CPU]
            acts += [torch.profiler.ProfilerActivity.CUDA] if dev == "cuda" else []
            with torch.profiler.profile(activities=acts) as prof:
                fwd()
                sync()
        gpu_ms = sum(e.self_device_time_total for e in prof.key_averages()) / 1e3
        med = lambda v: sorted(v[1:])[len(v[1:]) // 2] * 1e3  # noqa: E731
        print(f"{weights}: prefill {a.prefill} tokens: wall {med(walls):.2f} ms, host issue {med(hosts):.2f} ms, "
              f"GPU kernels {gpu_ms:.2f} ms (profiled run)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
        # cProfile (not torch's profiler, which sends glyd::linear through the dispatcher): where the host goes
        pr = cProfile.Profile()
        with torch.no_grad():
            pr.enable()
            fwd()
            pr.disable()
            sync()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(30)
        print(f"{weights}: cProfile of one prefill (top 30 by own time)\n" + buf.getvalue()[-6000:])
        del model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-7b")
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--prefill", type=int, default=0, help="time one N-token prefill instead of generate")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    if a.prefill:
        return prefill(a)
    dev = a.device
    for weights in ("bf16", "fixed12"):
        model = build_model(a.model, weights, dev)
        ids = torch.randint(10, min(1000, model.config.vocab_size), (1, 64), device=dev)
        kw = dict(max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False, disable_compile=True)
        model.generate(ids, **kw)
        sync()
        t = time.perf_counter()
        model.generate(ids, **kw)
        sync()
        print(f"{weights}: eager generate {a.new} tokens {(time.perf_counter() - t) / a.new * 1e3:.2f} ms a token")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]
                                    + ([torch.profiler.ProfilerActivity.CUDA] if dev == "cuda" else [])) as prof:
            model.generate(ids, **kw)
            sync()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))
        lin = model.model.layers[0].mlp.down_proj
        x = torch.randn(1, model.config.intermediate_size, device=dev, dtype=torch.bfloat16)
        print(f"{weights}: {type(lin).__name__} host {host_us(lambda: lin(x)):.1f} us a call")
        if weights == "bf16":
            print(f"F.linear host {host_us(lambda: F.linear(x, lin.weight)):.1f} us a call")
        del model


if __name__ == "__main__":
    main()
