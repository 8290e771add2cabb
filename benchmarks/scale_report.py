"""Outputs of ``benchmarks/scale.py``: the JSON, a markdown table, a PNG plot (matplotlib, lazily)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger("scale")
GiB = 2**30


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _ms(v, ref=None) -> str:
    if v is None:
        return "OOM"
    return f"{v:.2f} ({v / ref:.2f}x)" if ref else f"{v:.2f}"


def _bf16_of(results: list[dict], size: str) -> dict | None:
    for r in results:
        if r["size"] == size and r["variant"] == "bf16" and r.get("status") == "ok":
            return r
    return None


def _row(r: dict, ref: dict | None, batches: list[str], prompts: list[str]) -> list[str]:
    fit = r.get("fit", {})
    head = [r["size"], f"{r.get('params', 0) / 1e9:.2f}", r["variant"]]
    if r.get("status") != "ok":
        return head + ["-"] * (4 + len(batches) + len(prompts) + 4) + [r.get("status", "?")]
    w, fw = r["weight_bytes"], fit.get("weight_bytes") or 0
    ratio_w = f"{w / ref['weight_bytes']:.3f}" if ref else "-"
    cells = head + [f"{w / GiB:.2f}", ratio_w, f"{fw / GiB:.2f}", f"{w / fw:.4f}" if fw else "-"]
    for b in batches:
        v, base = r.get("decode_ms", {}).get(b, "n/a"), (ref or {}).get("decode_ms", {}).get(b)
        cells.append("-" if v == "n/a" else _ms(v, base if r is not ref else None))
    for p in prompts:
        v, base = r.get("ttft_ms", {}).get(p, "n/a"), (ref or {}).get("ttft_ms", {}).get(p)
        cells.append("-" if v == "n/a" else _ms(v, base if r is not ref else None))
    cap, fcap = r.get("capacity_tokens"), fit.get("max_context")
    ref_cap = (ref or {}).get("capacity_tokens")
    cells += [str(cap) if cap is not None else "-", str(fcap) if fcap is not None else "-",
              f"{cap / fcap:.3f}" if cap and fcap else "-",
              f"{cap / ref_cap:.2f}x" if cap and ref_cap and r is not ref else "-"]
    note = [f"KV {r['kv_ratio']:.3f} of bf16" if r.get("kv_ratio") else "", r.get("prefill_note", ""),
            r.get("capacity_note", "")]
    return cells + ["; ".join(n for n in note if n) or "ok"]


def _prefill_modes(results: list[dict]) -> str:
    """How the first tokens' prefills ran: "eager prefill", or each mode with its variants when they differ
    (runs from before ``--compile-prefill`` were eager)."""
    modes: dict[str, list[str]] = {}
    for r in results:
        if r.get("ttft_ms"):
            variants = modes.setdefault(r.get("prefill", "eager"), [])
            if r["variant"] not in variants:
                variants.append(r["variant"])
    if len(modes) <= 1:
        return f"{next(iter(modes), 'eager')} prefill"
    return "; ".join(f"{m} prefill ({', '.join(v)})" for m, v in modes.items())


def table(report: dict) -> str:
    """Markdown: one row a size and variant; times with their ratio to bf16's of the same size."""
    results = report["results"]
    batches = sorted({b for r in results for b in r.get("decode_ms", {})}, key=int)
    prompts = sorted({p for r in results for p in r.get("ttft_ms", {})}, key=int)
    head = ["size", "params B", "variant", "weights GiB", "x bf16", "fit GiB", "measured / fit"]
    head += [f"step ms @{b}" for b in batches] + [f"first token ms @{p}" for p in prompts]
    head += ["largest context", "fit's", "measured / fit", "x bf16 KV capacity", "notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        lines.append("| " + " | ".join(_row(r, _bf16_of(results, r["size"]), batches, prompts)) + " |")
    env = report.get("environment", {})
    methods = sorted({r["decode_method"] for r in results if r.get("decode_method")})
    lines += ["", f"GPU: {env.get('gpu', 'none (CPU)')}; torch {env.get('torch')}, transformers {env.get('transformers')}, "
              f"triton {env.get('triton', '-')}, glyd {env.get('glyd')}; {env.get('date', '')}",
              "decode step: " + ("; ".join(methods) or "-"),
              f"first token: one sequence, {_prefill_modes(results)}, logits of the last position, median; "
              "largest context: tokens a sequence at the capacity batch (fit: its memory bound, no max_position cap)",
              "weights: random normal(0, 0.02), " + _exc_note(results)]
    return "\n".join(lines)


def _exc_note(results: list[dict]) -> str:
    """The share of weights set outside fixed12's window (``scale.py --exc``): normal weights alone have about
    0.008% there, real checkpoints 0.01-0.13%."""
    shares = sorted({r.get("exc_share", 0.0) or 0.0 for r in results})
    if shares == [0.0]:
        return "about 0.008% of them outside fixed12's window (real checkpoints: 0.01-0.13%; scale.py --exc sets more)"
    return "plus " + " / ".join(f"{100 * s:g}%" for s in shares) + " of them set to 1e-30 (fixed12 exceptions; --exc)"



def draw(report: dict, path: Path) -> bool:
    """Step time (1 sequence and the largest batch) and weight memory against parameters, a line a variant."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plot (%s)", path.name)
        return False
    ok = [r for r in report["results"] if r.get("status") == "ok"]
    if not ok:
        return False
    batches = sorted({b for r in ok for b in r.get("decode_ms", {})}, key=int)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for variant in dict.fromkeys(r["variant"] for r in ok):
        rs = sorted((r for r in ok if r["variant"] == variant), key=lambda r: r["params"])
        x = [r["params"] / 1e9 for r in rs]
        for b, style in ((batches[0], "-o"), (batches[-1], "--s")) if batches else ():
            pts = [(xi, r["decode_ms"].get(b)) for xi, r in zip(x, rs) if r["decode_ms"].get(b) is not None]
            if pts:
                axes[0].plot(*zip(*pts), style, label=f"{variant} @{b}")
        axes[1].plot(x, [r["weight_bytes"] / GiB for r in rs], "-o", label=variant)
    for ax, ylabel in zip(axes, ("decode step, ms", "weight memory, GiB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters, billions")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    gpu = report.get("environment", {}).get("gpu", "CPU")
    fig.suptitle(f"bf16 against Glyd by model size ({gpu})")
    fig.tight_layout()
    tmp = path.with_name("tmp-" + path.name)
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return True


def write_outputs(report: dict, out: Path, plot: bool = False) -> None:
    """scale.json and scale.md in ``out`` (each replaced whole), and scale.png when ``plot``."""
    _atomic(out / "scale.json", json.dumps(report, indent=2))
    _atomic(out / "scale.md", table(report) + "\n")
    if plot:
        try:
            draw(report, out / "scale.png")
        except Exception as exc:  # noqa: BLE001 -- a plot must never cost the measurements
            log.warning("no plot: %s: %s", type(exc).__name__, exc)
