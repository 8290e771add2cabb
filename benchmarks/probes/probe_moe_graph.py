"""Why scale.py warns that a CUDA graph replay of the Qwen3-30B-A3B fixed12 decode step differs from an
eager step (2026-12-04: by 0.64-3.0 of max |logit| 4.5-4.9; bf16 MoE and dense fixed12 do not):
each GlydExperts layer's input, routing and output are copied into buffers (the copies are captured
too), one eager step and one replay, and the first layer where they part is named: a routing flip
after a rounding difference (benign, chaotic with random weights) or a different routing from the
same input (a frozen or wrong routing: a bug). Every other decoder submodule's output is kept too, and
the first (in the order the step runs them) whose replay and eager outputs differ is named.

    PYTHONPATH=src python3 benchmarks/probes/probe_moe_graph.py --size qwen3-30b-a3b --batches 1,8,32
    PYTHONPATH=src python benchmarks/probes/probe_moe_graph.py --size tiny-moe --device cpu    # the probe's own check: two eager steps
"""
from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, "benchmarks")
from scale import _build, _config  # noqa: E402

from glyd.apps.eval_timing import _StepRunner  # noqa: E402
from glyd.nn.experts import GlydExperts  # noqa: E402


def _replayed_step(runner) -> torch.Tensor:
    """One step captured in a CUDA graph (after three eager warm-up steps on a side stream), replayed once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            runner.reset()
            runner.step()
    torch.cuda.current_stream().wait_stream(s)
    runner.reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner.out = runner.step()
    runner.reset()
    graph.replay()
    torch.cuda.synchronize()
    runner.graph = graph  # kept alive with its output
    return runner.out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="qwen3-30b-a3b")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    model = _build(_config(a.size), "fixed12", a.device)
    mods = [m for m in model.modules() if isinstance(m, GlydExperts)]
    bufs: dict[tuple[int, str], torch.Tensor] = {}

    def keep(i, name, t):
        b = bufs.get((i, name))
        if b is None or b.shape != t.shape:
            bufs[(i, name)] = b = torch.empty_like(t)
        b.copy_(t)

    order: list[str] = []  # every decoder submodule's output, in the order the step runs them

    def keep_out(name, out):
        t = out[0] if isinstance(out, tuple) else out
        if isinstance(t, torch.Tensor):
            if name not in order:
                order.append(name)
            keep(name, "all", t)

    for name, sub in model.model.layers.named_modules(prefix="layers"):
        if not isinstance(sub, GlydExperts):
            sub.register_forward_hook(lambda mod, args, out, name=name: keep_out(name, out) and None)
    for i, m in enumerate(mods):
        m.register_forward_pre_hook(lambda mod, args, i=i: (keep(i, "h", args[0]), keep(i, "idx", args[1]),
                                                            keep(i, "w", args[2])) and None)
        m.register_forward_hook(lambda mod, args, out, i=i: keep(i, "out", out) and None)
    with torch.no_grad():
        for b in (int(x) for x in a.batches.split(",")):
            runner = _StepRunner(model, b, 512, a.device)
            runner.fill_cache()
            bufs.clear()
            if a.device == "cuda":
                replayed = _replayed_step(runner)
            else:  # the probe's own check: a warm-up step (the static cache initialises itself), then two eager steps
                runner.step()
                runner.reset()
                replayed = runner.step()
            replay = {k: v.clone() for k, v in bufs.items()}
            logits_r = replayed.float().clone()
            runner.reset()
            logits_e = runner.step().float()
            if a.device == "cuda":
                torch.cuda.synchronize()
            eager = {k: v.clone() for k, v in bufs.items()}
            print(f"batch {b}: max |logit diff| {float((logits_r - logits_e).abs().max()):.4g}")
            parted = 0
            for i in range(len(mods)):
                dh = float((replay[(i, "h")].float() - eager[(i, "h")].float()).abs().max())
                same_idx = torch.equal(replay[(i, "idx")], eager[(i, "idx")])
                dout = float((replay[(i, "out")].float() - eager[(i, "out")].float()).abs().max())
                if dh or not same_idx or dout:
                    print(f"  expert layer {i}: input diff {dh:.3g}, routing equal {same_idx}, output diff {dout:.3g}")
                    parted += 1
                    if parted > 4:
                        break
            if not parted:
                print("  every expert layer equal bit for bit")
            for name in order:  # the first submodule (attention, norms, router, products) that parts
                d = float((replay[(name, "all")].float() - eager[(name, "all")].float()).abs().max())
                if d:
                    print(f"  first submodule that differs: {name} (max diff {d:.3g})")
                    break
            del runner


if __name__ == "__main__":
    main()
