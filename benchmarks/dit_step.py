"""One denoising step of a FLUX.1-dev-shaped transformer (diffusers' ``FluxTransformer2DModel``: 19
double and 38 single blocks, hidden 3072, about 11.9 B weights), bf16 against glyd (``fixed12`` by
default, the default kernels), at 4096 image + 512 text tokens, batch 1: weight memory, peak memory
of the step, median step time and the ratios.

Random weights (normal, std 0.02; norms around 1), made on the device a module at a time: the
model is built on the meta device and each top-level module or block is materialized in turn
(glyd's run packs it right away), so neither the host nor the GPU ever holds more bf16 weights
than one block beyond the model being measured. Both runs get the same weights (seeded by name).
Steps run eagerly (at about 0.1 s a step, launch overhead does not matter), timed with CUDA events
after warm-up steps that compile the kernels.

    python3 benchmarks/dit_step.py                      # on the H200: FLUX.1-dev shapes
    python3 benchmarks/dit_step.py --small              # a tiny config on the CPU (checks the script;
                                                        # also checks exact=True is bit-identical)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import zlib

import torch
from torch import nn

#: FLUX.1-dev's transformer config (black-forest-labs/FLUX.1-dev, transformer/config.json).
FLUX_DEV = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                axes_dims_rope=(16, 56, 56))
SMALL = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16,
             num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=24, guidance_embeds=True,
             axes_dims_rope=(4, 6, 6))


def units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules made one at a time: every block of the block lists, every other top-level module."""
    out = []
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList):
            out += [(f"{name}.{i}", block) for i, block in enumerate(child)]
        else:
            out.append((name, child))
    return out


def materialize(unit: nn.Module, prefix: str, device: torch.device) -> None:
    """Give every meta parameter of ``unit`` random bf16 values on ``device``, seeded by its name."""
    for mname, sub in unit.named_modules(prefix=prefix):
        for pname, p in list(sub._parameters.items()):
            if p is None or not p.is_meta:
                continue
            g = torch.Generator(device=device).manual_seed(zlib.crc32(f"{mname}.{pname}".encode()))
            t = torch.randn(p.shape, generator=g, device=device)
            t = t * 0.02 if p.dim() >= 2 or pname == "bias" else 1.0 + 0.05 * t
            sub._parameters[pname] = nn.Parameter(t.to(torch.bfloat16), requires_grad=False)
            del t


def build(config: dict, device: torch.device, layout: str | None) -> nn.Module:
    """The transformer on ``device``; ``layout``: packed by glyd unit by unit (None: plain bf16)."""
    import glyd
    from accelerate import init_empty_weights
    from diffusers import FluxTransformer2DModel

    with init_empty_weights(include_buffers=False):
        model = FluxTransformer2DModel(**config)
    for name, unit in units(model):
        materialize(unit, name, device)
        if layout is not None and any(type(m) is nn.Linear for m in unit.modules()):
            # packed inside a holder, so that a unit that is itself an nn.Linear (proj_out) is replaced too
            holder = nn.ModuleDict({"unit": unit})
            glyd.compress(holder, layout=layout, merge=False, progress=False)
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, holder["unit"])
    left = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    if layout is not None and left:
        raise SystemExit(f"not packed: {', '.join(left[:3])}")
    return model.to(device).eval()


def inputs(config: dict, img: int, txt: int, device: torch.device) -> dict[str, torch.Tensor]:
    """One step's inputs as FluxPipeline makes them (image ids on a square latent grid)."""
    g = torch.Generator(device=device).manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)

    side = int(img**0.5)
    if side * side != img:
        raise SystemExit(f"--img {img}: image tokens must be a square number (a latent grid)")
    img_ids = torch.zeros(side, side, 3, device=device)
    img_ids[..., 1] = torch.arange(side, device=device)[:, None]
    img_ids[..., 2] = torch.arange(side, device=device)[None, :]
    return dict(hidden_states=r(1, img, config["in_channels"]), encoder_hidden_states=r(1, txt, config["joint_attention_dim"]),
                pooled_projections=r(1, config["pooled_projection_dim"]),
                timestep=torch.full((1,), 0.5, device=device, dtype=torch.bfloat16),
                guidance=torch.full((1,), 3.5, device=device, dtype=torch.bfloat16),
                img_ids=img_ids.reshape(img, 3), txt_ids=torch.zeros(txt, 3, device=device), return_dict=False)


def step_ms(model: nn.Module, x: dict, warmup: int, steps: int) -> tuple[float, torch.Tensor]:
    """Median milliseconds of one forward (CUDA events on a GPU, the wall clock on the CPU)."""
    cuda = x["hidden_states"].is_cuda
    with torch.inference_mode():
        for _ in range(warmup):
            out = model(**x)[0]
        times = []
        for _ in range(steps):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                out = model(**x)[0]
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                out = model(**x)[0]
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every stored tensor: parameters, packed arrays, buffers."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def measure(config: dict, device: torch.device, layout: str | None, args: argparse.Namespace) -> dict:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    model = build(config, device, layout)
    built = time.perf_counter() - t0
    x = inputs(config, args.img, args.txt, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    ms, out = step_ms(model, x, args.warmup, args.steps)
    res = {"variant": layout or "bf16", "weight_bytes": weight_bytes(model), "step_ms": ms, "build_s": built}
    if layout is None:
        res["weights"] = sum(p.numel() for p in model.parameters())
    if device.type == "cuda":
        res["peak_step_bytes"] = torch.cuda.max_memory_allocated(device)
    return {**res, "_model": model, "_out": out, "_x": x}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="a tiny config on the CPU (64 image + 16 text tokens)")
    ap.add_argument("--layout", default="fixed12", choices=["fixed12", "tiered"])
    ap.add_argument("--img", type=int, default=None, help="image tokens (default 4096; --small: 64)")
    ap.add_argument("--txt", type=int, default=None, help="text tokens (default 512; --small: 16)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default=None, help="default: cuda (--small: cpu)")
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    config = SMALL if args.small else FLUX_DEV
    args.img = args.img or (64 if args.small else 4096)
    args.txt = args.txt or (16 if args.small else 512)
    device = torch.device(args.device or ("cpu" if args.small else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: run with --small on the CPU")
    import diffusers
    import glyd
    from glyd.nn.modules import set_exact

    rows = []
    bf16 = measure(config, device, None, args)
    ref, x = bf16.pop("_out").clone(), bf16.pop("_x")
    del bf16["_model"]
    rows.append(bf16)
    packed = measure(config, device, args.layout, args)
    model, out = packed.pop("_model"), packed.pop("_out")
    del packed["_x"]
    packed["max_abs_diff"] = (out.float() - ref.float()).abs().max().item()
    if args.small:  # exact mode must give bf16's output bit for bit
        set_exact(model, True)
        with torch.inference_mode():
            same = torch.equal(model(**x)[0].view(torch.int16), ref.view(torch.int16))
        packed["exact_bit_identical"] = same
        if not same:
            raise SystemExit("exact=True output differs from bf16's: a bug")
    rows.append(packed)
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
            "diffusers": diffusers.__version__, "glyd": glyd.__version__, "config": config, "img_tokens": args.img,
            "txt_tokens": args.txt, "steps": args.steps, "argv": sys.argv[1:]}
    ratio_t = packed["step_ms"] / bf16["step_ms"]
    ratio_m = packed["weight_bytes"] / bf16["weight_bytes"]
    unit, scale = ("MB", 1e6) if args.small else ("GB", 1e9)
    print(f"FluxTransformer2DModel {'(small)' if args.small else 'FLUX.1-dev shape'}: {bf16['weights'] / 1e9:.4f} B weights, "
          f"{args.img} image + {args.txt} text tokens, batch 1, on {meta['device']}")
    print(f"{'variant':>8} {'weights ' + unit:>11} {'peak ' + unit:>8} {'step ms':>9} {'build s':>8}")
    for r in rows:
        peak = f"{r['peak_step_bytes'] / scale:8.2f}" if "peak_step_bytes" in r else f"{'-':>8}"
        print(f"{r['variant']:>8} {r['weight_bytes'] / scale:11.3f} {peak} {r['step_ms']:9.2f} {r['build_s']:8.1f}")
    print(f"ratio {args.layout}/bf16: weight memory {ratio_m:.3f}, step time {ratio_t:.3f}; "
          f"max |glyd - bf16| of the output {packed['max_abs_diff']:.3g}"
          + ("; exact=True bit-identical" if packed.get("exact_bit_identical") else ""))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "rows": rows, "ratio_time": ratio_t, "ratio_weight_memory": ratio_m}, f, indent=2)


if __name__ == "__main__":
    main()
