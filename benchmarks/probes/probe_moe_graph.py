"""Why scale.py warns that a CUDA graph replay of the Qwen3-30B-A3B fixed12 decode step differs from an
eager step (2026-12-04: by 0.64-3.0 of max |logit| 4.5-4.9; bf16 MoE and dense fixed12 do not):
each GlydExperts layer's input, routing and output are copied into buffers (the copies are captured
too), one eager step and one replay, and the first layer where they part is named: a routing flip
after a rounding difference (benign, chaotic with random weights) or a different routing from the
same input (a frozen or wrong routing: a bug).

    PYTHONPATH=src python3 benchmarks/probes/probe_moe_graph.py --size qwen3-30b-a3b --batches 1,8,32
"""
from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, "benchmarks")
from scale import _build, _config  # noqa: E402

from glyd.apps.eval_timing import _StepRunner  # noqa: E402
from glyd.nn.experts import GlydExperts  # noqa: E402


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

    for i, m in enumerate(mods):
        m.register_forward_pre_hook(lambda mod, args, i=i: (keep(i, "h", args[0]), keep(i, "idx", args[1]),
                                                            keep(i, "w", args[2])) and None)
        m.register_forward_hook(lambda mod, args, out, i=i: keep(i, "out", out) and None)
    with torch.no_grad():
        for b in (int(x) for x in a.batches.split(",")):
            runner = _StepRunner(model, b, 512, a.device)
            runner.fill_cache()
            bufs.clear()
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
            replay = {k: v.clone() for k, v in bufs.items()}
            logits_r = runner.out.float().clone()
            runner.reset()
            logits_e = runner.step().float()
            torch.cuda.synchronize()
            eager = {k: v.clone() for k, v in bufs.items()}
            print(f"batch {b}: max |logit diff| {float((logits_r - logits_e).abs().max()):.4g}")
            for i in range(len(mods)):
                dh = float((replay[(i, "h")].float() - eager[(i, "h")].float()).abs().max())
                same_idx = torch.equal(replay[(i, "idx")], eager[(i, "idx")])
                dout = float((replay[(i, "out")].float() - eager[(i, "out")].float()).abs().max())
                if dh or not same_idx or dout:
                    print(f"  layer {i}: input diff {dh:.3g}, routing equal {same_idx}, output diff {dout:.3g}")
                    if i > 3:
                        break
            else:
                print("  every layer equal bit for bit")
            del runner, graph


if __name__ == "__main__":
    main()
