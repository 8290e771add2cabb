"""Where a small model's prefill spends its host time: one prompt through a random model in bf16 and in
a Glyd layout, profiled with torch.profiler (self CPU time by op) and cProfile (Python functions).

Why: Qwen2.5-0.5B's first token at 512 tokens takes about 2x bf16's wall time while its GPU time is
within 15%; probe_host_time.py puts a packed product's host time at ~47 us (bf16's ~14 us), which is
~3 ms over 97 products, not the ~16 ms measured. This probe looks at the whole forward.

    PYTHONPATH=src python3 benchmarks/probes/probe_prefill_profile.py --model qwen2.5-0.5b --prompt 512

The repeated prefill is one length, so every product's launch plan is warm; a user's prompt has a new
length each time. ``--fresh N`` also times N prefills of lengths not seen before in the process, each variant
its own (the first prompt + 1 ... + N, the next from prompt + N + 2).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402

import scale  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _forward(model, ids):
    return model(input_ids=ids, use_cache=True, logits_to_keep=1).logits


def _wall(model, ids, reps: int) -> tuple[float, float]:
    """(median wall ms, median GPU ms) of one prefill."""
    walls, gpus = [], []
    cuda = ids.is_cuda
    for _ in range(reps):
        _sync()
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t = time.perf_counter()
        _forward(model, ids)
        if cuda:
            b.record()
            b.synchronize()
        walls.append(1e3 * (time.perf_counter() - t))
        gpus.append(a.elapsed_time(b) if cuda else float("nan"))
    return sorted(walls)[reps // 2], sorted(gpus)[reps // 2]


def _fresh(model, first: int, vocab: int, device: str, n: int) -> tuple[float, float]:
    """(median wall ms, median GPU ms) of ``n`` prefills of lengths ``first`` .. ``first + n - 1``, none seen
    before in this process (by any variant: torch's attention pays once a length too)."""
    walls, gpus = [], []
    for i in range(n):
        ids = torch.randint(0, vocab, (1, first + i), generator=torch.Generator().manual_seed(4 + i)).to(device)
        w, g = _wall(model, ids, 1)
        walls.append(w)
        gpus.append(g)
    return sorted(walls)[n // 2], sorted(gpus)[n // 2]


#: Leaf modules that run one product (a merged product's parts only slice its output).
_PRODUCTS = ("Linear", "GlydLinear", "GlydTiedLinear")


def _leaf_host_times(model, ids) -> tuple[dict, float, list]:
    """Host us a call by leaf module class during one forward (no sync inside: what the host spends
    issuing the module's work), the forward's host ms, and each product's (module, input) to replay."""
    times: dict[str, list[float]] = {}
    inputs: list = []
    hooks = []

    def pre(mod, args):
        mod._t0 = time.perf_counter()

    def post(mod, args, out):
        times.setdefault(type(mod).__name__, []).append(1e6 * (time.perf_counter() - mod._t0))
        if args and isinstance(args[0], torch.Tensor) and type(mod).__name__ in _PRODUCTS:
            inputs.append((mod, args[0]))

    for m in model.modules():
        if not any(True for _ in m.children()):
            hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    counts = _count_paths()
    _sync()
    t = time.perf_counter()
    _forward(model, ids)
    host = 1e3 * (time.perf_counter() - t)
    _sync()
    counts.undo()
    for h in hooks:
        h.remove()
    times["(paths: " + ", ".join(f"{k} {v}" for k, v in counts.n.items()) + ")"] = [0.0]
    return {k: (len(v), sum(v)) for k, v in times.items()}, host, inputs


class _count_paths:
    """Counts, during one forward, the products that took a kept launch plan, those that missed it,
    and those that went through the dispatcher (``glyd.ops._eager.backend`` said None)."""

    def __init__(self) -> None:
        from glyd.kernels import _plan
        from glyd.ops import _eager

        self.n = {"direct": 0, "through the op": 0, "plan hit": 0, "plan miss": 0}
        self._plan, self._eager = _plan, _eager
        self.run, self.backend = _plan.run, _eager.backend

        def run(*a, **kw):
            y = self.run(*a, **kw)
            self.n["plan hit" if y is not None else "plan miss"] += 1
            return y

        def backend(*a, **kw):
            impl = self.backend(*a, **kw)
            self.n["through the op" if impl is None else "direct"] += 1
            return impl

        _plan.run, _eager.backend = run, backend

    def undo(self) -> None:
        self._plan.run, self._eager.backend = self.run, self.backend


def _alone(inputs, reps: int = 20) -> tuple[int, float]:
    """(products, host us a call) of the same products called alone with the same inputs."""
    for mod, x in inputs:
        mod(x)
    _sync()
    t = time.perf_counter()
    for _ in range(reps):
        for mod, x in inputs:
            mod(x)
    us = 1e6 * (time.perf_counter() - t) / (reps * max(1, len(inputs)))
    _sync()
    return len(inputs), us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--variants", default="bf16,fixed12")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--fresh", type=int, default=9, help="prefills of lengths not seen before (default 9; 0: none)")
    ap.add_argument("--out", default=None, help="a folder for the full profiles")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu only checks this script (--model tiny)")
    args = ap.parse_args()
    cfg = scale._config(args.model)
    rows = []
    for v, variant in enumerate(args.variants.split(",")):
        model = scale._build(cfg, variant, args.device)
        vocab = model.config.get_text_config().vocab_size
        ids = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(3)).to(args.device)
        with torch.inference_mode():
            for _ in range(3):
                _forward(model, ids)
            wall, gpu = _wall(model, ids, 9)
            first = args.prompt + 1 + v * (args.fresh + 1)  # each variant its own new lengths
            fresh = _fresh(model, first, vocab, args.device, args.fresh) if args.fresh > 0 else (float("nan"),) * 2
            leaves, host, inputs = _leaf_host_times(model, ids)
            n_alone, us_alone = _alone(inputs)
            del inputs
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    _forward(model, ids)
                _sync()
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(3):
                _forward(model, ids)
            _sync()
            pr.disable()
        rows.append((variant, wall, gpu, host, us_alone, *fresh))
        print(f"\n== {args.model} {variant} prefill {args.prompt}: wall {wall:.2f} ms, GPU {gpu:.2f} ms; "
              f"{args.fresh} new lengths: wall {fresh[0]:.2f} ms, GPU {fresh[1]:.2f} ms")
        print(f"one forward with hooks: host {host:.2f} ms (issue only, no sync); leaf modules, host us:")
        for name, (calls, total) in sorted(leaves.items(), key=lambda kv: -kv[1][1]):
            print(f"  {name:28s} {calls:5d} calls {total / 1e3:8.2f} ms {total / calls:8.1f} us a call")
        print(f"the {n_alone} linear products alone, same inputs, 20 rounds: {us_alone:.1f} us a call")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(args.top)
        print(s.getvalue())
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(120)
            (Path(args.out) / f"cprofile_{variant}.txt").write_text(s.getvalue())
        del model
        torch.cuda.empty_cache()
    print("\nvariant   wall ms   GPU ms  host ms (hooked)  product alone us  new lengths: wall ms  GPU ms  (profiles above: "
          "3 calls)")
    for v, w, g, h, a, fw, fg in rows:
        print(f"{v:8s} {w:8.2f} {g:8.2f} {h:12.2f} {a:14.1f} {fw:22.2f} {fg:7.2f}")


if __name__ == "__main__":
    main()
