#!/usr/bin/env python3
"""Issue 35: can a dense (<= 11.25 bits a weight) layout be decoded as fast as fixed12? A
decode-only microbenchmark of four 3-bit code arrangements (``dense_candidates.py``; all four have
dense11's size to the bit) against dense11's kernels, fixed12's and bf16 in the same run.

Variants (``layout/mode[@BNxBK]``): for each candidate ``planes`` (dense11's bytes, a new decode),
``lanes``, ``nibswar``, ``niblut``: ``unpack`` (bf16 out, bit-exact), ``hot`` (code words to
weights, escapes left at their placeholder, XOR-folded: no store), ``fold`` (``hot`` plus the
escape pass), ``gemv1`` (y = x @ W.T at M = 1, escapes and exceptions included), ``gemv1hot``
(``gemv1`` without the escape pass: its cost were escapes free); each in the default tile and a
larger one (``@BNxBK``). References: ``bf16/copy`` (``copy_``), ``bf16/fold`` (a bf16 read,
XOR-folded), ``bf16/gemv1`` (``F.linear``), ``fixed12/unpack`` (``glyd.kernels.unpack``),
``fixed12/fold`` (its unpack's decode, folded), ``fixed12/gemv1`` and ``dense11/gemv1``
(``glyd.kernels.linear``, the registry's choice), ``dense11/unpack`` (``glyd.kernels.unpack``):
``dense11`` is format version 1 (bit planes, its own kernels), ``dense11v2/unpack`` and
``dense11v2/gemv1`` format version 2 (``niblut+wincx`` in ``src/``: the production kernels).
The escape schemes of ``dense_escapes.py`` (step 3: no escape rounds) are variants too:
``niblut+win``, ``nibswar+win``, ``niblut+winc``, ``niblut+wincx`` with the same modes and tiles
(``--variants escapes``: most of those, the references and the rounds scheme they replace), checked
also on a matrix with runs of 12, 20 and 32 escapes (``crowded runs``).

Every variant is checked first on each timed matrix, every candidate also on adversarial ones (all
65,536 bf16 patterns, a NaN/inf matrix whose window base is 249, a normal matrix with exceptions, a
whisper-like one): unpack, hot and fold bit for bit against the reference (``dense_candidates.bits``,
torch on the same device), gemv1 and gemv1hot against float64 (relative error < 1e-2, finite). A
variant that fails is reported and not timed. Timed matrices: ``whisper`` (exponents drawn from
Whisper tiny.en's: 4.4% escapes, the most of the real weights) and ``normal`` (normal(0, 0.02): 2.1%).
Timing: one CUDA graph over ``--copies`` copies (16 x 18944 x 3584: 1.5 GB packed, far past L2),
median of ``--replays`` replays, divided by the copies; GB/s counts the bf16 bytes (2 a weight) and
the packed bytes read.

    PYTHONPATH=src python3 benchmarks/probes/probe_dense_decode.py --out $OUT         # H200
    PYTHONPATH=src python3 benchmarks/probes/probe_dense_decode.py --tiny            # CPU check (interpreter)
    PYTHONPATH=src python3 benchmarks/probes/probe_dense_decode.py --sass            # CPU: static sm_90 SASS
    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \\
        python3 benchmarks/probes/probe_dense_decode.py --ncu-one niblut/gemv1    # with its fixed12 counterpart
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

if "--tiny" in sys.argv:
    import warnings

    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    # the interpreter runs uint32 arithmetic in numpy, whose wrap-around (meant) warns
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import glyd  # noqa: E402
import dense_candidates as DC  # noqa: E402
import dense_decode_kernels as K  # noqa: E402
import dense_escape_kernels as EK  # noqa: E402
import dense_escapes as DE  # noqa: E402

MODES = ("unpack", "hot", "fold", "gemv1", "gemv1hot")
# dense11: format version 1 (bit planes, its own kernels: what the earlier runs timed); dense11v2: format
# version 2 (niblut+wincx) through the production kernels (glyd.kernels.dense11.unpack_v2 / gemv_v2)
REFS = ("bf16/copy", "bf16/fold", "bf16/gemv1", "fixed12/unpack", "fixed12/fold", "fixed12/gemv1", "dense11/unpack",
        "dense11/gemv1", "dense11v2/unpack", "dense11v2/gemv1")
PACKED = ("fixed12", "dense11", "dense11v2")
# each candidate variant in two tile shapes: the default (``K.DEFAULTS``) and a larger step ("@BNxBK",
# 4 warps: ``K.LARGE``)
LARGE = {mode: f"{K.LARGE[m].bn}x{K.LARGE[m].bk}" for mode, m in K.MODES.items()}
# the escape schemes of dense_escapes.py (issue 35, step 3): "arrangement+scheme/mode[@BNxBK]", the same tiles
CANDS = (*DC.LAYOUTS, *DE.LAYOUTS)
VARIANTS = (*REFS, *(f"{lay}/{mode}{sfx}" for lay in CANDS for mode in MODES for sfx in ("", "@" + LARGE[mode])))
#: ``--variants escapes``: the references, the rounds scheme the escape schemes replace, and the escape schemes:
#: ``niblut+win`` in every mode and tile; ``hot`` and ``gemv1hot`` are the same code in every niblut scheme, so
#: ``niblut+winc`` and ``niblut+wincx`` without them; ``nibswar+win`` in the default tiles
SETS = {"escapes": ("bf16/copy", "bf16/fold", "bf16/gemv1", "fixed12/fold", "fixed12/gemv1", "dense11v2/unpack",
                    "dense11v2/gemv1", "niblut/hot",
                    "niblut/fold", "niblut/gemv1", "niblut/gemv1hot", "nibswar/gemv1hot",
                    *(v for v in VARIANTS if v.startswith("niblut+win/")),
                    *(v for v in VARIANTS if v.startswith(("niblut+winc/", "niblut+wincx/")) and "hot" not in v),
                    *(v for v in VARIANTS if v.startswith("nibswar+win/") and "@" not in v))}


def parse(name: str) -> tuple[str, str, K.Cfg | None]:
    """(layout, mode, tile config or None) of a variant name ``layout/mode[@BNxBK]``."""
    lay, rest = name.split("/")
    mode, _, tile = rest.partition("@")
    if lay not in CANDS:
        return lay, mode, None
    if not tile:
        return lay, mode, K.DEFAULTS[K.MODES[mode]]
    bn, bk = (int(v) for v in tile.split("x"))
    return lay, mode, K.Cfg(bn, bk, 4)


# Whisper tiny.en (fp16 rounded to bf16, 37.2 M weights): weights a million at each exponent minus
# its matrix's window base (dense11's choose_base), all matrices together; 4.40% lie outside the
# window 0..6 (dense_candidates.py's table). Measured with benchmarks/realweights.py, 2026-12-04.
WHISPER_PPM = {-121: 5, -116: 1, -14: 1, -13: 4, -12: 9, -11: 19, -10: 36, -9: 71, -8: 144, -7: 284, -6: 580,
               -5: 1127, -4: 2253, -3: 4410, -2: 8739, -1: 17340, 0: 34196, 1: 66257, 2: 125064, 3: 213356,
               4: 276553, 5: 193250, 6: 47313, 7: 7497, 8: 464, 9: 1027}
MATRICES = ("whisper", "normal")  # timed in this order: the realistic escape rate first


@functools.lru_cache(maxsize=4)
def make_matrix(n: int, k: int, dev: str, kind: str = "normal", seed: int = 0) -> torch.Tensor:
    """``normal``: normal(0, 0.02) bf16 (the project's timing matrix; 2.1% escapes), plus 64 weights
    of 1e-30 (exceptions in dense11, fixed12 and the candidates) and 64 of 3e5 (far above the
    window). ``whisper``: exponents drawn independently from Whisper tiny.en's distribution around
    its window (``WHISPER_PPM``, base 121: 4.4% escapes, the most of the real weights measured),
    sign and mantissa uniform. Drawn on ``dev`` (so a GPU and the CPU draw different matrices of the
    same kind); cached: callers must not change it."""
    g = torch.Generator(device=dev).manual_seed(seed)
    if kind == "whisper":
        rel = torch.tensor(list(WHISPER_PPM), dtype=torch.int64, device=dev)
        cdf = torch.tensor(list(WHISPER_PPM.values()), dtype=torch.float64, device=dev).cumsum(0)
        u = torch.rand(n * k, generator=g, dtype=torch.float64, device=dev) * cdf[-1]
        exp = 121 + rel[torch.searchsorted(cdf, u, right=True).clamp_(max=len(WHISPER_PPM) - 1)]
        sm = torch.randint(0, 256, (n * k,), generator=g, dtype=torch.int64, device=dev)
        u = ((sm & 0x80) << 8) | (exp << 7) | (sm & 0x7F)
        return torch.where(u >= 2**15, u - 2**16, u).to(torch.int16).view(torch.bfloat16).view(n, k)
    if kind != "normal":
        raise ValueError(f"unknown matrix {kind!r}; choose one of {', '.join(MATRICES)}")
    w = (torch.randn(n, k, generator=g, device=dev) * 0.02).to(torch.bfloat16)
    idx = torch.randperm(n * k, generator=g, device=dev)[:128]
    w.view(-1)[idx[:64]] = torch.tensor(1e-30, device=dev).bfloat16()
    w.view(-1)[idx[64:]] = torch.tensor(3e5, device=dev).bfloat16()
    return w


def adversarial(dev: str) -> dict[str, torch.Tensor]:
    # K = 1536 and 2048: two escape blocks a row, so these launch the timed matrix's compiled kernels
    pats = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(32, 2048)
    nan = torch.full((32, 1536), float("nan")).bfloat16()
    nan[0, :7] = float("inf")
    nan[1, :300] = 3e38
    nan[2, ::3] = -1e-38
    return {"all 65536 patterns": pats.to(dev), "NaN/inf (base 249)": nan.to(dev),
            "normal + exceptions": with_exceptions(make_matrix(32, 1536, dev, "normal", 1)),
            "whisper-like": make_matrix(32, 1536, dev, "whisper", 1),
            "crowded runs": with_crowded_runs(make_matrix(32, 1536, dev, "normal", 2))}


def with_crowded_runs(w: torch.Tensor) -> torch.Tensor:
    """A copy of ``w`` in which 3 runs of 32 weights hold 12, 20 and 32 escapes (finite, outside the
    window: 2^-20 to 2^-16 and 2^10 to 2^14): the escape schemes' ranks 8 and up (rounds or
    exceptions) in a GEMV."""
    w = w.clone()
    n, k = w.shape
    for r, c, cnt in ((1, 64, 12), (n // 2, k - 32, 20), (n - 1, 320, 32)):
        e = torch.tensor([107 + 30 * (j % 2) + (j % 5) for j in range(cnt)], dtype=torch.int32, device=w.device)
        sign = (torch.arange(cnt, device=w.device) % 3 == 0).to(torch.int32) << 15
        w.view(torch.int16)[r, c:c + cnt] = ((e << 7) | 0x2A | sign).to(torch.int16)
    return w


def with_exceptions(w: torch.Tensor) -> torch.Tensor:
    """A copy of ``w`` with 24 weights of 24 distinct rare exponents (30-53), one each: more than the
    escape table's 15 entries take, so at least 9 are exceptions (digit 15) in every candidate."""
    w = w.clone()
    n, k = w.shape
    pos = (torch.arange(24, device=w.device) * 997) % (n * k)
    u = ((torch.arange(30, 54, device=w.device) << 7) | 0x35).to(torch.int16)
    w.view(torch.int16).view(-1)[pos] = u
    return w


def xor_reduce(t: torch.Tensor) -> torch.Tensor:
    """XOR of the last dimension (int32)."""
    while t.shape[-1] > 1:
        if t.shape[-1] % 2:
            t = torch.cat([t, torch.zeros_like(t[..., :1])], -1)
        t = t[..., 0::2] ^ t[..., 1::2]
    return t[..., 0]


def fold_ref(bits16: torch.Tensor, bn: int) -> torch.Tensor:
    """int32 [N / bn, blocks]: what a HOT/FOLD program folds (its rows' pair words of one block)."""
    n, k = bits16.shape
    nbr = (k + 1023) // 1024
    pairs = torch.zeros(n, nbr * 512, dtype=torch.int32, device=bits16.device)
    pairs[:, : k // 2] = bits16.contiguous().view(torch.int32)
    return xor_reduce(pairs.view(n // bn, bn, nbr, 512).permute(0, 2, 1, 3).reshape(n // bn, nbr, bn * 512))


def fixed12_fold_ref(w: torch.Tensor, p) -> torch.Tensor:
    u = w.view(torch.int16).to(torch.int32) & 0xFFFF
    idx = p.arrays["exc_idx"].to(torch.int64)
    hi = (u.view(-1)[idx] >> 8) & 0x80
    u.view(-1)[idx] = ((hi | int(p.arrays["base"][0])) << 8) | (u.view(-1)[idx] & 0xFF)  # the placeholder
    b16 = torch.where(u >= 2**15, u - 2**16, u).to(torch.int16)
    return xor_reduce(b16.view(torch.int32).view(-1, K.FIXED12_BG * 32))


class Suite:
    """One matrix (``copies`` copies, to exceed L2) in every layout, and the buffers of each variant."""

    def __init__(self, w: torch.Tensor, copies: int, names: list[str]) -> None:
        self.w, self.copies, self.shape = w, copies, tuple(w.shape)
        n, k = self.shape
        dev = w.device
        lays = {v.split("/")[0] for v in names}
        self.ws = [w] + [w.clone() for _ in range(copies - 1)] if "bf16" in lays else [w]
        self.packed = {}
        for lay in lays & set(PACKED):
            p = _pack(w, lay)
            self.packed[lay] = [p] + [glyd.Packed(p.layout, p.shape, {a: t.clone() for a, t in p.arrays.items()},
                                                  p.version) for _ in range(copies - 1)]
            if dev.type == "cuda":
                for q in self.packed[lay]:
                    glyd.kernels.prepare(q)
        self.preps = {}
        for lay in lays & set(DC.LAYOUTS):
            a = DC.pack(w, lay)
            self.preps[lay] = [K.Prepared(a, self.shape, lay)] + [
                K.Prepared({x: t.clone() for x, t in a.items()}, self.shape, lay) for _ in range(copies - 1)]
        for lay in lays & set(DE.LAYOUTS):
            a = DE.pack(w, lay)
            self.preps[lay] = [EK.Prepared(a, self.shape, lay)] + [
                EK.Prepared({x: t.clone() for x, t in a.items()}, self.shape, lay) for _ in range(copies - 1)]
        self.nbytes = {lay: DC.nbytes(ps[0].a) for lay, ps in self.preps.items()}
        self.nbytes.update({lay: ps[0].nbytes for lay, ps in self.packed.items()})
        self.nbytes["bf16"] = 2 * n * k
        self.out = [torch.empty(n, k, dtype=torch.bfloat16, device=dev) for _ in range(copies)] if any(
            parse(v)[1] in ("unpack", "copy") for v in names) else []
        g = torch.Generator(device="cpu").manual_seed(1)
        self.x = torch.randn(1, k, generator=g).to(torch.bfloat16).to(dev)

    def fn(self, name: str):
        """A callable that runs ``name`` over every copy (what the CUDA graph captures) and one
        that runs it on copy 0 and returns its output."""
        lay, mode, _ = parse(name)
        n, k = self.shape
        dev = self.w.device
        if lay == "bf16":
            if mode == "copy":
                one = lambda i: self.out[i].copy_(self.ws[i])  # noqa: E731
            elif mode == "fold":
                bufs = [torch.empty(n * k // (2 * K.BF16_BW), dtype=torch.int32, device=dev) for _ in self.ws]
                one = lambda i: K.bf16_fold(self.ws[i], bufs[i])  # noqa: E731
            else:
                one = lambda i: F.linear(self.x, self.ws[i])  # noqa: E731
        elif lay in PACKED:
            ps = self.packed[lay]
            if mode == "unpack":
                one = lambda i: glyd.kernels.unpack(ps[i], self.out[i])  # noqa: E731
            elif mode == "fold":
                bufs = [torch.empty(n * k // (64 * K.FIXED12_BG), dtype=torch.int32, device=dev) for _ in ps]
                one = lambda i: K.fixed12_fold(ps[i], bufs[i])  # noqa: E731
            else:
                one = lambda i: glyd.kernels.linear(self.x, ps[i])  # noqa: E731
        else:
            ps = self.preps[lay]
            m = K.MODES[mode]
            cfg = parse(name)[2]
            go = EK.launch if lay in DE.LAYOUTS else K.launch
            if mode == "unpack":
                one = lambda i: go(ps[i], m, self.out[i], cfg=cfg)  # noqa: E731
            elif mode.startswith("gemv1"):
                bufs = [torch.empty(n, dtype=torch.bfloat16, device=dev) for _ in ps]
                one = lambda i: go(ps[i], m, bufs[i], self.x[0], cfg)  # noqa: E731
            else:
                bufs = [torch.empty(n // cfg.bn, ps[0].nbr, dtype=torch.int32, device=dev) for _ in ps]
                one = lambda i: go(ps[i], m, bufs[i], cfg=cfg)  # noqa: E731

        def run_all():
            for i in range(self.copies):
                one(i)
        return run_all, lambda: one(0)


def _pack(w: torch.Tensor, lay: str) -> glyd.Packed:
    # a reference layout's packed matrix: dense11 in format version 1 (the GPU pack on CUDA), dense11v2 in 2
    if lay == "dense11":
        from glyd.codec.dense11 import pack_v1
        from glyd.kernels.gpu_pack import pack_dense11_v1

        return pack_dense11_v1(w) if w.is_cuda else pack_v1(w)
    return glyd.pack(w, "dense11" if lay == "dense11v2" else lay)


def check_output(name: str, y: torch.Tensor, w: torch.Tensor, x: torch.Tensor, suite: Suite | None) -> str:
    """'' when the output of ``name`` on matrix ``w`` is right, else what is wrong."""
    lay, mode, _ = parse(name)
    shape = tuple(w.shape)
    if mode in ("unpack", "copy"):
        bad = int((y.view(torch.int16) != w.view(torch.int16)).sum())
        return f"{bad} weights differ" if bad else ""
    if mode.startswith("gemv1"):
        if mode == "gemv1hot":  # the matrix the kernel multiplies: escapes at their placeholder
            w = _bits(suite.preps[lay][0].a, shape, lay, escapes=False).view(torch.bfloat16)
        ref = x.double() @ w.double().T
        err = float((y.reshape(ref.shape).double() - ref).norm() / ref.norm())
        return "" if math.isfinite(err) and err < 1e-2 else f"relative error {err:.3g}"
    if lay == "bf16":
        want = xor_reduce(w.view(torch.int32).view(-1, K.BF16_BW))
    elif lay == "fixed12":
        want = fixed12_fold_ref(w, suite.packed["fixed12"][0])
    else:
        a = suite.preps[lay][0].a
        opts = dict(escapes=False) if mode == "hot" else dict(exceptions=False)
        want = fold_ref(_bits(a, shape, lay, **opts), parse(name)[2].bn)
    bad = int((y.view(-1) != want.view(-1)).sum())
    return f"{bad} of {want.numel()} program folds differ" if bad else ""


def _bits(a: dict[str, torch.Tensor], shape: tuple[int, int], lay: str, **opts) -> torch.Tensor:
    # the reference decode of candidate arrays (an arrangement, or an arrangement with an escape scheme)
    return (DE.bits if lay in DE.LAYOUTS else DC.bits)(a, shape, lay, **opts)


def check(names: list[str], w: torch.Tensor, label: str, finite: bool = True) -> dict[str, str]:
    """Run each variant once on ``w`` (a fresh Suite of one copy) and check it; {name: problem}."""
    s = Suite(w, 1, names)
    res = {}
    for name in names:
        if "/gemv1" in name and not finite:
            continue
        try:
            _, one = s.fn(name)
            K.LAUNCHED.clear()
            EK.LAUNCHED.clear()
            y = one()
            res[name] = check_output(name, y, w, s.x, s)
            cfg = parse(name)[2]
            launched = EK.LAUNCHED if parse(name)[0] in DE.LAYOUTS else K.LAUNCHED
            if cfg is not None and launched != [cfg]:
                res[name] = f"launched with {launched}, not the {cfg} its name says"
        except Exception as exc:  # a variant that fails to compile or run is a finding, reported
            res[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        print(f"check {label:24s} {name:16s} {'ok' if not res[name] else 'FAIL: ' + res[name]}", flush=True)
    return res


def time_variants(s: Suite, names: list[str], replays: int, skip: set[str]) -> dict[str, float]:
    from glyd.timing import cuda_graph_ms

    us = {}
    for name in names:
        if name in skip:
            continue
        t0 = time.perf_counter()
        K.LAUNCHED.clear()
        try:
            run_all, _ = s.fn(name)
            us[name] = cuda_graph_ms(run_all, replays) * 1e3 / s.copies
        except Exception as exc:
            print(f"time {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        print(f"time {name:16s} {us[name]:9.2f} us a matrix ({time.perf_counter() - t0:.1f} s with compile)", flush=True)
    return us


def table(s: Suite, us: dict[str, float]) -> list[dict]:
    n, k = s.shape
    base = {"unpack": "bf16/copy", "copy": "bf16/copy", "hot": "bf16/fold", "fold": "bf16/fold", "gemv1": "bf16/gemv1",
            "gemv1hot": "bf16/gemv1"}
    f12 = {"unpack": "fixed12/unpack", "hot": "fixed12/fold", "fold": "fixed12/fold", "gemv1": "fixed12/gemv1",
           "gemv1hot": "fixed12/gemv1"}
    rows = []
    for name, t in us.items():
        lay, mode, _ = parse(name)
        b, f = us.get(base[mode]), us.get(f12.get(mode, ""))
        rows.append(dict(variant=name, us=t, bf16_gbs=2 * n * k / t / 1e3, packed_gbs=s.nbytes[lay] / t / 1e3,
                         bits=8 * s.nbytes[lay] / (n * k), vs_bf16=t / b if b else float("nan"),
                         vs_fixed12=t / f if f else float("nan")))
    return rows


def ncu_one(name: str, shape: tuple[int, int], kind: str) -> int:
    """``name`` and its fixed12 counterpart (same mode; fold for hot) on one matrix: each run once
    to compile, then once each inside the profiler range (``ncu --profile-from-start off``)."""
    lay, mode, _ = parse(name)
    ref = "fixed12/" + {"hot": "fold", "gemv1hot": "gemv1"}.get(mode, mode)
    names = [name] if lay == "fixed12" or ref not in VARIANTS else [name, ref]
    s = Suite(make_matrix(*shape, "cuda", kind), 1, names)
    ones = [s.fn(n)[1] for n in names]
    for one in ones:
        one()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for one in ones:
        one()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"profiled {', '.join(names)} on {kind} {shape[0]}x{shape[1]}")
    return 0


def print_table(rows: list[dict], title: str) -> None:
    print(f"\n{title}")
    print(f"{'variant':16s} {'bits':>6s} {'us':>9s} {'bf16 GB/s':>10s} {'read GB/s':>10s} {'vs bf16':>8s} {'vs f12':>7s}")
    for r in rows:
        print(f"{r['variant']:16s} {r['bits']:6.2f} {r['us']:9.2f} {r['bf16_gbs']:10.0f} {r['packed_gbs']:10.0f} "
              f"{r['vs_bf16']:8.3f} {r['vs_fixed12']:7.3f}")


def checks(names: list[str], dev: str, shape: tuple[int, int], kinds: list[str], tiny: bool) -> dict[str, str]:
    """Every variant on each timed matrix, the candidates on the adversarial ones (and, on the CPU,
    a real slice): {"timed KIND: variant" or "LABEL: variant": problem}. The interpreter is slow:
    there the adversarial matrices meet the default tiles' unpack, fold and gemv1 (hot and gemv1hot
    are the same code less the escape pass; the larger tiles the same code, with other constants),
    the all-patterns one (every run full of escapes) the larger tiles' unpack and fold."""
    fails = {}
    for kind in kinds:
        w = make_matrix(*shape, dev, kind)
        fails.update({f"timed {kind}: {k}": v for k, v in check(names, w, f"{kind} {shape[0]}x{shape[1]}").items() if v})
    cands = [v for v in names if v.split("/")[0] in CANDS]
    mats = adversarial(dev)
    if tiny:
        real = real_slice()
        if real is not None:
            mats["MiniLM slice 32x1536"] = real
        del mats["whisper-like"]  # the tiny timed matrix is one
    for label, m in mats.items():
        finite = bool(torch.isfinite(m.float()).all())
        sub = cands
        if tiny:
            large = label == "all 65536 patterns"
            sub = [v for v in cands if ("@" in v) == large and parse(v)[1] in (("unpack", "fold") if large else
                                                                               ("unpack", "fold", "gemv1"))]
        fails.update({f"{label}: {k}": v for k, v in check(sub, m, label, finite).items() if v})
    return fails


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="18944x3584")
    ap.add_argument("--matrices", default=",".join(MATRICES), help="timed matrices: whisper, normal or both")
    ap.add_argument("--copies", type=int, default=16)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--variants", default="all", help="comma list of layout/mode, all, or " + ", ".join(SETS))
    ap.add_argument("--tiny", action="store_true", help="CPU check under TRITON_INTERPRET=1 (no timing)")
    ap.add_argument("--sass", action="store_true", help="static sm_90 SASS of each candidate kernel (CPU)")
    ap.add_argument("--ncu-one", default=None, metavar="NAME", help="one launch of NAME for Nsight Compute")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    shape = tuple(int(v) for v in a.shape.split("x"))
    kinds = a.matrices.split(",")
    names = list(VARIANTS) if a.variants == "all" else list(SETS.get(a.variants, a.variants.split(",")))
    unknown = [v for v in names + ([a.ncu_one] if a.ncu_one else []) if v not in VARIANTS]
    if unknown or set(kinds) - set(MATRICES):
        raise SystemExit(f"unknown variants {unknown} or matrices {kinds}; known: {', '.join(VARIANTS)}; "
                         f"{', '.join(MATRICES)}")
    if a.ncu_one:
        return ncu_one(a.ncu_one, shape, kinds[0])
    if a.sass:
        from dense_sass import report

        return report()
    dev = "cpu" if a.tiny else "cuda"
    print(f"glyd {glyd.__version__}, torch {torch.__version__}, triton {__import__('triton').__version__}, "
          f"device {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu (TRITON_INTERPRET=1)'}", flush=True)
    t0 = time.perf_counter()
    if a.tiny:  # the candidates' kernels and the fold references; glyd's own kernels have their tests
        names = [v for v in names if v.split("/")[0] in CANDS or v in ("bf16/fold", "fixed12/fold")]
        shape = (32, 1536)
        # one timed matrix, whisper where asked (the most escapes; before 2026-12-04 this took the last
        # kind, normal, so the whisper-like matrix went unchecked); the adversarial set has a normal one
        kinds = ["whisper"] if "whisper" in kinds else kinds[:1]
    fails = checks(names, dev, shape, kinds, a.tiny)
    print(f"checks: {len(fails)} failures in {time.perf_counter() - t0:.0f} s" + "".join(
        f"\n  {k}: {v}" for k, v in fails.items()), flush=True)
    if a.tiny:
        return 1 if fails else 0
    res = {}
    for kind in kinds:
        s = Suite(make_matrix(*shape, dev, kind), a.copies, names)
        skip = {k.split(": ", 1)[1] for k in fails if not k.startswith("timed ") or k.startswith(f"timed {kind}:")}
        res[kind] = table(s, time_variants(s, names, a.replays, skip))
        print_table(res[kind], f"matrix {kind}")
        del s
        torch.cuda.empty_cache()
        if a.out:  # after each matrix: a call that runs out of time keeps what it measured
            Path(a.out).mkdir(parents=True, exist_ok=True)
            (Path(a.out) / "dense_decode.json").write_text(json.dumps(dict(shape=shape, copies=a.copies, rows=res,
                                                                           failures=fails), indent=1))
    print(f"\nfailures: {len(fails)}" + "".join(f"\n  {k}: {v}" for k, v in fails.items()))
    print(f"total {time.perf_counter() - t0:.0f} s. Each table: {shape[0]}x{shape[1]}, {a.copies} copies in one CUDA "
          f"graph, median of {a.replays} replays, us a matrix; vs bf16: copy_ (unpack), bf16 fold (hot, fold), "
          "F.linear (gemv1, gemv1hot); vs f12: fixed12's unpack, fold (for hot and fold) or GEMV")
    for kind, rows in res.items():
        print_table(rows, f"matrix {kind}")
    return 1 if fails else 0


def real_slice() -> torch.Tensor | None:
    """32 x 1536 real weights (MiniLM-L6's first FFN output matrix), or None when not installed."""
    from realweights import sources

    mats = sources().get("MiniLM-L6 (fp32)", {})
    for w in mats.values():
        if w.shape[1] == 1536:
            return w[:32].contiguous()
    return None


if __name__ == "__main__":
    sys.exit(main())
