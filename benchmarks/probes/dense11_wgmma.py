"""(issue 35, M = 17-64) dense11's decode as wgmma's register A operand: the layout step of the plan in
`benchmarks/notes-kernels.md` ("dense11 at M = 17-64 on wgmma").

A Gluon kernel for format version 3 without escapes (codes 0-6 only): a program is one warpgroup of 64 weight rows
and BT x rows; each 128-column K step loads its code words and sm words in fixed12's word layout (lane (g, c): run c of
rows g and g + 8, `fixed12.wgmma.layouts`), decodes them as `dense11.decode_v2.decode_words` does where no escape is
present (`prmt` table lookups of the 3-bit codes, the sm bytes or'ed in), turns each lane word into two bf16 pairs
and orders the [64, 128] tile as gemv_mma's k map (k = 64 h + 16 q + 8 T + 2 c + j <-> column 32 c + 16 h + 4 q +
2 T + j), so that `convert_layout` to wgmma's A operand should move nothing; x, permuted on the host with the same
map, goes to shared memory as wgmma's B. Escapes, the exceptions and any pipelining are left for later.

    PYTHONPATH=src:. TRITON_INTERPRET=1 python benchmarks/probes/dense11_wgmma.py --sass   # the CPU: sm_90 counts
    PYTHONPATH=src python3 benchmarks/probes/dense11_wgmma.py --gpu                    # a Hopper GPU: bits, time

`--sass` compiles the kernel for sm_90 (no GPU) and prints its registers, local memory and the shared-memory loads and
stores of the K loop (the A operand must not pass through shared memory: only x's stores); `--gpu` checks the product
against bf16 `F.linear` of the unpacked weights at M = 16-64 (escape-free random weights) and times it beside it.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch


def k_to_col() -> torch.Tensor:
    """Column (0-127) of a K step that slot k of the A tile holds: k = 64 h + 16 q + 8 T + 2 c + j."""
    k = torch.arange(128)
    h, q, t, c, j = k >> 6, (k >> 4) & 3, (k >> 3) & 1, (k >> 1) & 3, k & 1
    return 32 * c + 16 * h + 4 * q + 2 * t + j


def permute_x(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] (K a multiple of 128) with each step's columns in slot order."""
    m, k = x.shape
    idx = (torch.arange(0, k, 128)[:, None] + k_to_col()[None, :]).reshape(-1).to(x.device)
    return x[:, idx].contiguous()


def escape_free(n: int, k: int, seed: int = 0, device: str = "cpu") -> torch.Tensor:
    """bf16 [n, k] whose exponents span 7 values (one window: no escapes), random signs and mantissas."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(118, 125, (n, k), generator=g)
    bits = (torch.randint(0, 2, (n, k), generator=g) << 15) | (e << 7) | torch.randint(0, 128, (n, k), generator=g)
    return bits.to(torch.int16).view(torch.bfloat16).to(device)


def _kernel():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    from glyd.kernels._gluon_bits import prmt, split16

    @gluon.jit
    def _lut(t0, t1, sel):
        # prmt with a register selector: byte i = byte (nibble i of sel) of (t1:t0), codes 0-6 (no sign spread)
        return gl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [t0, t1, sel], dtype=gl.uint32,
                                         is_pure=True, pack=1)

    @gluon.jit
    def _half(xa, xb, s4, q, th0, th1, tl0, tl1):
        # [BN, 16] lane words (col 4 c + q: run c, word q = columns 4 q .. 4 q + 3 of the half) -> [BN, 16, j, T] bf16
        # (join adds a minor dimension: element [j, T] is weight 2 T + j of the word)
        x = gl.where(q < 2, xa, xb)
        sel = (x >> ((q & 1) * 16).to(gl.uint32)) & 0x7777
        hi = _lut(th0, th1, sel) | (s4 & 0x80808080)
        lo = _lut(tl0, tl1, sel) | (s4 & 0x7F7F7F7F)
        e0, e1 = split16(prmt(lo, hi, 0x5140))
        e2, e3 = split16(prmt(lo, hi, 0x7362))
        return gl.join(gl.join(e0, e1), gl.join(e2, e3))

    @gluon.jit
    def _step_loads(code_ptr, sm_ptr, x_ptr, c_off, s_off, xoff, st):
        # step st's three code words and two sm words a lane word, and its [BT, 128] x tile
        b = st // 8
        j0 = (st % 8) * 4
        cw = code_ptr + c_off + 96 * b + j0
        sp = sm_ptr + s_off + 256 * b + 4 * j0
        return (gl.load(cw).to(gl.uint32, bitcast=True), gl.load(cw + 32).to(gl.uint32, bitcast=True),
                gl.load(cw + 64).to(gl.uint32, bitcast=True), gl.load(sp).to(gl.uint32, bitcast=True),
                gl.load(sp + 128).to(gl.uint32, bitcast=True), gl.load(x_ptr + xoff + st * 128))

    @gluon.jit
    def d11_wg_kernel(x_ptr, code_ptr, sm_ptr, out_ptr, M, N, KP, TH0, TH1, TL0, TL1, BN: gl.constexpr,
                      BT: gl.constexpr, WL: gl.constexpr, XL: gl.constexpr, ML: gl.constexpr, AL: gl.constexpr,
                      XSL: gl.constexpr, OL: gl.constexpr, PF: gl.constexpr):
        # out [M, N] = x_perm [M, KP] @ W^T for dense11 version 3 without escapes, KP a multiple of 1024 (whole blocks)
        pid_n = gl.program_id(0)
        pid_m = gl.program_id(1)
        col = gl.arange(0, 16, layout=gl.SliceLayout(0, WL))[None, :]
        n = gl.minimum(pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, WL)), N - 1)[:, None]
        runs = KP // 32
        c_off = n * (3 * runs) + col // 4  # run c's code words, the same for its 4 lane words
        s_off = n * (KP // 4) + col  # the sm words of half a: word 4 c + q
        q = (col % 4).to(gl.uint32) + gl.zeros([BN, 16], gl.uint32, WL)
        th0 = gl.zeros([BN, 16], gl.uint32, WL) + TH0
        th1 = gl.zeros([BN, 16], gl.uint32, WL) + TH1
        tl0 = gl.zeros([BN, 16], gl.uint32, WL) + TL0
        tl1 = gl.zeros([BN, 16], gl.uint32, WL) + TL1
        m0 = pid_m * BT
        t = gl.minimum(m0 + gl.arange(0, BT, layout=gl.SliceLayout(1, XL)), M - 1)
        xoff = t[:, None] * KP + gl.arange(0, 128, layout=gl.SliceLayout(0, XL))[None, :]
        xs = gl.allocate_shared_memory(gl.bfloat16, [BT, 128], XSL)
        acc = gl.zeros([BN, BT], gl.float32, ML)
        steps = KP // 128
        c0, c1, c2, s4a, s4b, xv = _step_loads(code_ptr, sm_ptr, x_ptr, c_off, s_off, xoff, 0)
        for st in range(0, steps):
            if PF:  # the next step's words and x in flight while this one decodes (the last step reloads itself)
                nc0, nc1, nc2, ns4a, ns4b, nxv = _step_loads(code_ptr, sm_ptr, x_ptr, c_off, s_off, xoff,
                                                             gl.minimum(st + 1, steps - 1))
            else:
                c0, c1, c2, s4a, s4b, xv = _step_loads(code_ptr, sm_ptr, x_ptr, c_off, s_off, xoff, st)
            d = ((c0 >> 3) & 0x11111111) | ((c1 >> 2) & 0x22222222) | ((c2 >> 1) & 0x44444444)
            wa = _half(c0, c1, s4a, q, th0, th1, tl0, tl1)
            wb = _half(c2, d, s4b, q, th0, th1, tl0, tl1)
            w = gl.reshape(gl.join(wa, wb), [BN, 2, 2, 2, 2, 2, 2, 2])  # [row, c1, c0, q1, q0, j, T, h]
            a = gl.convert_layout(gl.reshape(gl.permute(w, (0, 7, 3, 4, 6, 1, 2, 5)), [BN, 128]), AL)
            xs.store(xv)
            fence_async_shared()
            gl.thread_barrier()
            acc = warpgroup_mma(a, xs.permute((1, 0)), acc, is_async=True)
            acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))
            gl.thread_barrier()  # the MMA has read x before the next step's stores
            if PF:
                c0, c1, c2, s4a, s4b, xv = nc0, nc1, nc2, ns4a, ns4b, nxv
        acc = gl.convert_layout(acc, OL)
        r = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, OL))[:, None]
        mm = m0 + gl.arange(0, BT, layout=gl.SliceLayout(0, OL))[None, :]
        gl.store(out_ptr + mm * N + r, acc.to(gl.bfloat16), mask=(r < N) & (mm < M))

    return d11_wg_kernel


def check_map() -> bool:
    """The kernel's arrangement of the decoded words, mirrored in torch on column numbers (gl.join as torch.stack on
    a new last dimension): slot k of the A tile must hold column k_to_col()[k], the column x's permutation puts at k.
    CPU only."""
    def join(a, b):
        return torch.stack([a, b], -1)

    cq = torch.arange(16)  # lane word 4 c + q
    c, q = cq // 4, cq % 4

    def half(h):  # column 32 c + 16 h + 4 q + i of weight i of the word, as _half's joins hold them
        e = [32 * c + 16 * h + 4 * q + i for i in range(4)]
        return join(join(e[0], e[1]), join(e[2], e[3]))

    w = join(half(0), half(1)).reshape(2, 2, 2, 2, 2, 2, 2)  # the kernel's reshape, less the row
    w = w.permute(6, 2, 3, 5, 0, 1, 4).reshape(128)  # the kernel's permute (0, 7, 3, 4, 6, 1, 2, 5), less the row
    return torch.equal(w, k_to_col())


def _consts(bt: int, pf: bool = False) -> dict:
    from glyd.kernels.fixed12 import wgmma as fw

    words, xl, mma, a_op, xs, out = fw.layouts(64, bt, 4)
    return dict(BN=64, BT=bt, WL=words, XL=xl, ML=mma, AL=a_op, XSL=xs, OL=out, PF=pf)


def sass(bts=(16, 32, 64)) -> None:
    """Compile for sm_90 on this machine and print what the K loop does with shared memory."""
    from tests.kernels.test_gluon import _res_usage, _sass, compile_gluon_sm90
    from tests.kernels.test_ws import _loops

    kern = _kernel()
    for bt, pf in [(bt, pf) for pf in (False, True) for bt in bts]:
        k = compile_gluon_sm90(kern, _consts(bt, pf), {"x_ptr": "*bf16", "code_ptr": "*i32", "sm_ptr": "*i32",
                                                    "out_ptr": "*bf16"})
        s = _sass(k)
        loops = [lp for lp in _loops(s) if any("GMMA" in o for o in lp)]
        for lp in loops:
            ops = [o.split(".")[0] for o in lp]
            print(f"BT {bt}{' prefetch' if pf else ''}: {_res_usage(k)}; K loop {len(lp)} instructions: HGMMA {ops.count('HGMMA')}, "
                  f"STS {ops.count('STS')}, LDS {ops.count('LDS')}, LDG {ops.count('LDG')}, PRMT {ops.count('PRMT')}, "
                  f"SHFL {ops.count('SHFL')}, LDL {ops.count('LDL')}, STL {ops.count('STL')}")


def gpu(ms=(16, 32, 64), shapes=((4096, 4096), (14336, 4096))) -> int:
    """Bits and time on a Hopper GPU: the kernel against bf16 F.linear of the same (unpacked) weights, with the
    registry's fixed12 and dense11 products of the same weights in the same run."""
    import triton

    import glyd
    from glyd import kernels
    from glyd.kernels.dense11.decode_v2 import prepare

    kern = _kernel()
    bad = 0
    print("| N x K | M | err | probe us | bf16 us | probe | fixed12 | dense11 (table) |")
    print("|---|---|---|---|---|---|---|---|")
    for n, k in shapes:
        w = escape_free(n, k, device="cuda")
        p = glyd.pack(w, "dense11")
        p12 = glyd.pack(w, "fixed12")
        prep = prepare(p)
        if p.version != 3 or prep.nescw:
            print(f"weights not escape-free version 3 (version {p.version}, {prep.nescw} escape words)")
            return 1
        assert torch.equal(glyd.unpack(p).view(torch.int16).cpu(), w.view(torch.int16).cpu())
        code = p.arrays["code"].view(torch.int32)
        sm = p.arrays["sm"].view(torch.int32)
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            xp = permute_x(x)
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            bt = max(16, triton.next_power_of_2(m))
            args = (xp, code, sm, out, m, n, k, *prep.lut)

            ref = (x.double() @ w.double().t())
            t_b = triton.testing.do_bench_cudagraph(lambda: torch.nn.functional.linear(x, w))  # noqa: B023
            t_12 = triton.testing.do_bench_cudagraph(lambda: kernels.linear(x, p12, None))  # noqa: B023
            t_11 = triton.testing.do_bench_cudagraph(lambda: kernels.linear(x, p, None))  # noqa: B023
            for pf in (False, True):
                def run():
                    kern[(triton.cdiv(n, 64), triton.cdiv(m, bt))](*args, **_consts(bt, pf), num_warps=4)  # noqa: B023

                out.zero_()
                run()
                torch.cuda.synchronize()
                err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
                ok = err < 2e-2
                bad += not ok
                t_k = triton.testing.do_bench_cudagraph(run)
                print(f"| {n} x {k}{' pf' if pf else ''} | {m} | {err:.1e}{'' if ok else ' WRONG'} | {t_k * 1e3:.1f} | "
                      f"{t_b * 1e3:.1f} | {t_k / t_b:.2f}x | {t_12 / t_b:.2f}x | {t_11 / t_b:.2f}x |", flush=True)
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sass", action="store_true", help="compile for sm_90 here and count the K loop's instructions")
    ap.add_argument("--gpu", action="store_true", help="bits and time on a Hopper GPU")
    a = ap.parse_args(argv)
    if not check_map():
        print("the kernel's slot order and x's permutation differ")
        return 1
    if a.sass:
        if os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("--sass imports the tests' compile helpers: run it with TRITON_INTERPRET=1 PYTHONPATH=src:.")
        sass()
    if a.gpu:
        return gpu()
    return 0


if __name__ == "__main__":
    sys.exit(main())
