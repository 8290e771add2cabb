"""``glyd bench``: time the fused kernels against bf16 ``F.linear`` on this machine's GPU.

    glyd bench --shape 18944x3584 --shape 3584x18944 --m 1,16 --layout fixed12,tiered

Each shape gets fresh random weights (std 0.02) in ``--copies`` distinct copies (so the L2 cache
does not hold them), packed on the GPU; the command checks the kernel against float64 F.linear,
then times one CUDA graph over the copies (median of ``--replays`` replays) and prints a table.
The full model-level protocol is ``benchmarks/kernels.py``.
"""

from __future__ import annotations

import argparse

from glyd.apps.layouts import kernel_layouts
from glyd.errors import GlydError
from glyd.timing import cuda_graph_ms


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="time the fused GPU kernels against bf16 F.linear")
    p.add_argument("--shape", action="append", default=None, metavar="NxK",
                   help="matrix shape, repeatable (default: the Qwen2.5-7B linears)")
    p.add_argument("--m", default="1,16", help="comma-separated activation rows (default 1,16)")
    p.add_argument("--layout", default="fixed12,tiered",
                   help=f"comma-separated layouts, of {', '.join(kernel_layouts())} (default fixed12,tiered)")
    p.add_argument("--copies", type=int, default=8, help="distinct weight copies a shape (default 8)")
    p.add_argument("--replays", type=int, default=30, help="graph replays; the median is reported")
    p.set_defaults(func=_bench)


def _parse_shape(text: str) -> tuple[int, int]:
    try:
        n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise GlydError(f"--shape {text!r}: expected NxK, e.g. 4096x4096") from None
    if n <= 0 or k <= 0:
        raise GlydError(f"--shape {text!r}: both sizes must be positive")
    return n, k


def _check_layouts(text: str) -> list[str]:
    """The layouts of ``--layout`` (comma-separated), each one with kernels to time."""
    layouts = [v.strip() for v in text.split(",") if v.strip()]
    for lay in layouts:
        if lay not in kernel_layouts():
            raise GlydError(f"--layout {lay!r}: choose among {', '.join(kernel_layouts())}")
    return layouts


def _bench(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        raise GlydError("glyd bench needs a CUDA GPU")
    import glyd
    from glyd import kernels

    shapes = [_parse_shape(s) for s in (args.shape or ["4608x3584", "512x3584", "3584x3584", "18944x3584",
                                                       "3584x18944"])]
    try:
        ms = [int(v) for v in args.m.split(",")]
    except ValueError:
        raise GlydError(f"--m {args.m!r}: expected comma-separated integers") from None
    layouts = _check_layouts(args.layout)
    if any(m <= 0 for m in ms) or args.copies <= 0 or args.replays <= 0:
        raise GlydError("--m, --copies and --replays must be positive")
    print(f"{torch.cuda.get_device_name()}; median of {args.replays} CUDA-graph replays over {args.copies} copies")
    print("| N x K | M | bf16 us | " + " | ".join(f"{lay} us | ratio" for lay in layouts) + " |")
    print("|---|---|---|" + "---|---|" * len(layouts))
    for n, k in shapes:
        ws = [(torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16) for _ in range(args.copies)]
        packed = {lay: [glyd.pack(w, lay) for w in ws] for lay in layouts}
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref = F.linear(x.double(), ws[0].double())
            for lay in layouts:
                y = kernels.linear(x, packed[lay][0])
                err = ((y.double() - ref).norm() / ref.norm()).item()
                if not err < 5e-3:
                    raise GlydError(f"{lay} {n}x{k} M={m}: relative error {err:.3g} against float64 F.linear")
            t_bf = cuda_graph_ms(lambda: [F.linear(x, w) for w in ws], args.replays) * 1e3 / args.copies
            cells = []
            for lay in layouts:
                t = cuda_graph_ms(lambda: [kernels.linear(x, p) for p in packed[lay]], args.replays) * 1e3 / args.copies
                cells.append(f"{t:.1f} | {t / t_bf:.2f}")
            print(f"| {n}x{k} | {m} | {t_bf:.1f} | " + " | ".join(cells) + " |")
        del ws, packed
        torch.cuda.empty_cache()
    return 0
