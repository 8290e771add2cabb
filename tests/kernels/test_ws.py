"""The warp-specialized fixed12 wgmma kernel (a TMA warp fills a shared-memory ring; Hopper only):
static checks compiled for sm_90 on any machine, x's permutation on the CPU, products on the GPU
against float64."""

from __future__ import annotations

import re

import pytest
import torch

import glyd

from .conftest import cpu_sampled, needs_triton, random_weights
from .test_gluon import _res_usage, _sass, compile_gluon_sm90
from .test_linear import _check

pytestmark = needs_triton


def _ws():
    try:
        from glyd.kernels.fixed12 import wgmma_warpspec as fixed12_ws
    except ImportError as exc:  # a Triton without Gluon's Hopper TMA module
        pytest.skip(f"no Gluon TMA / warp specialization in this Triton: {exc}")
    return fixed12_ws


def _compile_sm90(bn, bt, stages, bias=False, exc=False, maxnreg=128, warps=4, pipe=False, xe=16, xt=False, pre=0,
                  xo=False, hv=False, wp=False, ints=None):
    from glyd.kernels.fixed12 import wgmma as fixed12_wg

    w = _ws()
    *_, (lsl, csl, xsl) = w.layouts(bn, bt, warps)
    cw = 4 if wp else warps  # WsConfig.wg_parts: a consumer partition a warpgroup, of half the rows
    ll, cl, mma, a_op, ol, _ = w.layouts(bn * cw // warps, bt, cw)
    descs = {"lo_desc": f"tensordesc<i32[{bn}, 32],{lsl!r}>", "co_desc": f"tensordesc<i32[{bn}, 16],{csl!r}>",
             "x_desc": f"tensordesc<bf16[{bt}, 64],{xsl!r}>"}
    ptrs = {"x_ptr": "*bf16", "base_ptr": "*u8", "out_ptr": "*bf16", "bias_ptr": "*bf16", "work_ptr": "*fp32",
            "cnt_ptr": "*i32", "rowptr_ptr": "*i32", "eidx_ptr": "*i32", "ehi_ptr": "*u8", "lo8_ptr": "*u8"}
    const = dict(BN=bn, BT=bt, NS=stages, LL=ll, CL=cl, ML=mma, AL=a_op, OL=ol, HAS_BIAS=bias, EXC=exc,
                 EL=fixed12_wg.exc_layout(cw, xt) if exc else None, CS=16, LOADER_REGS=24,
                 NBYTES=w.slot_bytes(bn, bt), PIPE=pipe, XE=xe, XT=xt, PRE=pre, CORR=False, XO=xo, HV=hv,
                 NC=2 if wp else 1, WG_REGS=232)
    const.update(_specialized(w._ws_kernel, ints or {}))
    return compile_gluon_sm90(w._ws_kernel, const, ptrs, descs, num_warps=cw, maxnreg=maxnreg)


def _specialized(kernel, ints: dict) -> dict:
    # the integer arguments a launch with these values makes constexpr (Triton specializes an int equal to 1
    # unless the kernel says do_not_specialize)
    return {q.name: 1 for q in kernel.params if ints.get(q.name) == 1 and not q.do_not_specialize}


def _loops(sass: str) -> list[list[str]]:
    # the opcodes of each backward branch's body (cuobjdump prints branch targets as addresses)
    lines = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln)]  # past 0xffff: 5 digits
    addr = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", ln).group(1), 16) for ln in lines]
    out = []
    for ln, a in zip(lines, addr):
        m = re.search(r"BRA\s+0x([0-9a-f]+)", ln)
        if m and int(m.group(1), 16) < a:
            lo = int(m.group(1), 16)
            body = [b for b, x in zip(lines, addr) if lo <= x <= a and "@!PT" not in b]
            out.append([re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", b).group(1) for b in body])
    return out


@pytest.mark.cpu_sample(every=2)  # compiles for sm_90: half the configs in the default run
@pytest.mark.parametrize("bn,bt,stages,cap,warps", [(64, 8, 4, 128, 4), (64, 16, 4, 128, 4), (64, 32, 4, 128, 4),
                                                (64, 64, 3, 128, 4), (128, 64, 2, 128, 4), (64, 8, 2, 80, 4),
                                                (64, 16, 2, 80, 4), (64, 32, 2, 80, 4), (64, 64, 2, 80, 4),
                                                (128, 16, 3, 80, 8), (128, 64, 2, 80, 8), (128, 256, 2, 255, 8)])
@pytest.mark.parametrize("bias,exc", [(False, False), (True, True)])
def test_ws_loop_is_tma_and_shared_loads_sm90(bn, bt, stages, cap, warps, bias, exc):
    # one warp's loop issues the four TMA copies of a step (lo, code, two x halves) and no other
    # global loads; the warpgroup's loop reads the step's words with 16-byte shared loads (a
    # thread: 8 lo and 4 code words a row pair), issues 8 wgmma a 64 weight rows, and loads
    # nothing from global memory; nothing spills under the register cap (128: 2 programs an SM,
    # 80: 3, the defaults; 8 consumer warps at 80: 2), and the ring fits as many programs in
    # shared memory
    k = _compile_sm90(bn, bt, stages, bias=bias, exc=exc, maxnreg=cap, warps=warps)
    res = _res_usage(k)
    assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0
    assert res["REG"] <= cap
    assert k.metadata.shared <= (227 if bt > 64 else 113 if cap == 128 or warps == 8 else 75) * 1024
    full = _loops(_sass(k))
    loops = [[op.split(".")[0] for op in ops] for ops in full]  # opcodes without modifiers
    # the innermost loops (the partitions' dispatch loops around them hold both): the TMA warp's,
    # and the warpgroup's, up to the arrive that frees the step's ring slot (the tile's finish,
    # past it, runs once a tile part; the exceptions' loop inside it has MMAs too)
    tma_loop = min((ops for ops in loops if "UTMALDG" in ops), key=len)
    i, wg_loop = min(((i, ops) for i, ops in enumerate(full) if "SYNCS.ARRIVE.TRANS64.A1T0" in ops),
                     key=lambda t: len(t[1]))
    body = loops[i][:wg_loop.index("SYNCS.ARRIVE.TRANS64.A1T0")]
    assert tma_loop.count("UTMALDG") == 4 and "LDG" not in tma_loop and "HGMMA" not in tma_loop
    assert body.count("HGMMA") == 8 * bn // (16 * warps)  # an instruction a warpgroup's 64 rows
    assert body.count("LDS") == 6 * bn // (16 * warps)  # 4 lo, 2 code 16-byte loads a thread and 64 rows
    assert "LDG" not in body and "STS" not in body
    assert body.count("LDL") == 0 and body.count("STL") == 0


@pytest.mark.cpu_sample(every=2)  # compiles for sm_90: half the configs in the default run
@pytest.mark.parametrize("bn,bt,stages,cap,warps", [(128, 256, 2, 0, 8), (128, 128, 3, 0, 8), (64, 64, 2, 80, 4)])
def test_ws_pipe_decodes_the_next_step_under_the_mmas_sm90(bn, bt, stages, cap, warps):
    # WsConfig.pipe: after a step's HGMMAs are issued the warpgroup waits for its first half's MMAs
    # and the next ring slot, reads its words from shared memory and decodes them (PRMT) before it
    # waits for the last MMAs (WARPGROUP.DEPBAR); without pipe nothing but the wait follows the last HGMMA. No spills
    # either way, the same MMAs a step; each tile part's finish runs after its pipeline drained
    k = _compile_sm90(bn, bt, stages, maxnreg=cap or None, warps=warps, pipe=True)
    sass = _sass(k)
    # with exceptions and bias too (the tile's finish, where the decoded-ahead half once spilled at bm 256)
    for kk in (k, _compile_sm90(bn, bt, stages, bias=True, exc=True, maxnreg=cap or None, warps=warps, pipe=True)):
        res = _res_usage(kk)
        assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0
        assert "STL" not in _sass(kk) and "LDL" not in _sass(kk)
    for piped in (True, False):
        ops = _loop_ops(sass if piped else _sass(_compile_sm90(bn, bt, stages, maxnreg=cap or None,
                                                                  warps=warps)))
        last = max(i for i, op in enumerate(ops) if op.startswith("HGMMA"))
        wait = next(i for i in range(last, len(ops)) if ops[i].startswith("WARPGROUP.DEPBAR"))
        if piped:  # the wait for all the step's MMAs (the one after the last HGMMA waits for its first half)
            wait = max(i for i in range(last, len(ops)) if ops[i].startswith("WARPGROUP.DEPBAR"))
        between = ops[last:wait]
        assert sum(op.startswith("HGMMA") for op in ops[:wait]) >= 8 * bn // (16 * warps)
        if piped:
            assert any(op.startswith("WARPGROUP.DEPBAR") for op in between)
            assert any(op.startswith("SYNCS.PHASECHK") for op in between)
            assert sum(op.startswith("LDS") for op in between) >= 2 and sum(op == "PRMT" for op in between) >= 8
        else:
            assert not any(op.startswith(("LDS", "PRMT")) for op in between)


@pytest.mark.cpu_sample(every=2)  # compiles for sm_90: half the configs in the default run
@pytest.mark.parametrize("bn,bt,stages,pipe", [(128, 128, 3, False), (128, 256, 2, True)])
def test_ws_x_outer_compile_sm90(bn, bt, stages, pipe):
    # WsConfig.x_outer changes only the tile index's division (the loader's TMA coordinates, the consumer's
    # tile): no spills, and the consumer's step loop the same MMAs and shared-memory loads as x inner's
    ops = {}
    for xo in (False, True):
        k = _compile_sm90(bn, bt, stages, exc=True, maxnreg=None, warps=8, pipe=pipe, xt=True, pre=3, xo=xo)
        res = _res_usage(k)
        assert res.get("LOCAL", 0) == 0
        ops[xo] = _loop_ops(_sass(k))
    for prefix in ("HGMMA", "LDS", "SYNCS"):
        assert sum(o.startswith(prefix) for o in ops[True]) == sum(o.startswith(prefix) for o in ops[False]), prefix


@pytest.mark.cpu_sample(every=2)  # compiles for sm_90: half the configs in the default run
@pytest.mark.parametrize("bn,bt,warps", [(128, 256, 8), (64, 64, 4)])
def test_ws_one_row_launch_compiles_sm90(bn, bt, warps):
    # at M = 1 with x tiles inner (MT = 1) Triton makes M and MT constexpr 1 unless the kernel says not to; with the
    # exceptions by rows (x transposed) that lowering aborted in Triton 3.6 (the H100's GPU set, 2026-12-07): the
    # launch's own specialization compiles
    k = _compile_sm90(bn, bt, 2, bias=True, exc=True, maxnreg=None, warps=warps, xt=True, pre=3,
                      ints={"M": 1, "MT": 1, "S": 28, "W": 28})
    assert k.metadata.shared > 0


@pytest.mark.cpu_sample(every=2)  # compiles for sm_90: half the configs in the default run
@pytest.mark.parametrize("bn,bt,stages,warps,exc", [(128, 256, 2, 8, True), (128, 128, 3, 8, False),
                                                    (64, 64, 2, 4, True)])
@pytest.mark.parametrize("pipe", [False, True])
def test_ws_halves_free_a_slot_by_halves_sm90(bn, bt, stages, warps, exc, pipe):
    # WsConfig.halves: the step waits for its first half (words, first x box), issues its MMAs, waits for the second
    # x box, issues the second's, then frees the first half once its MMAs are done (a DEPBAR before the first
    # arrive) and the second after all of them; the loader waits for each half's mbarrier before its copies (three,
    # then one). Without halves one wait and one arrive a step, four copies after one wait. With pipe (the step's
    # first half decoded the step before) the first half is freed before the wait for the next step's first half.
    # No spills either way. In address order (the waits' retry loops sit out of line: no loop body holds a step)
    kw = dict(exc=exc, maxnreg=None, warps=warps, xt=exc, pre=3 if exc else 0, pipe=pipe)
    h = ["HGMMA"] * (4 * bn // (16 * warps))  # a half's MMAs: 4 k16 a 64-row block
    wait, dep, free = "SYNCS.PHASECHK", "WARPGROUP.DEPBAR", "SYNCS.ARRIVE.TRANS64.A1T0"
    for hv in (False, True):
        k = _compile_sm90(bn, bt, stages, hv=hv, **kw)
        assert _res_usage(k).get("LOCAL", 0) == 0
        ops = [re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", ln).group(1) for ln in _sass(k).splitlines()
               if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln)]
        step = [o.split(".")[0] if o.startswith(("HGMMA", "UTMALDG")) else o for o in ops
                if o.startswith(("HGMMA", dep, wait, free, "UTMALDG"))]
        step = [wait if o.startswith(wait) else dep if o.startswith(dep) else o for o in step]
        if pipe:
            want = h + [wait] + h + [dep, free, wait, dep, free] if hv else h + h + [dep, wait, dep, free]
        else:
            want = [wait] + h + [wait] + h + [dep, free, dep, free] if hv else [wait] + h + h + [dep, free]
        loads = [wait] + ["UTMALDG"] * 3 + [wait, "UTMALDG"] if hv else [wait] + ["UTMALDG"] * 4
        for seq in (want, loads):
            assert any(step[i:i + len(seq)] == seq for i in range(len(step))), (hv, seq)


# compiles for sm_90: the last case (pipe and halves together) in every default run, the other two sampled (by hash
# all three had fallen to the slow set, so the wg_parts path ran in no default run)
@pytest.mark.parametrize("bn,bt,stages,pipe,hv", cpu_sampled([(128, 256, 2, True, False), (128, 256, 2, False, True),
                                                              (128, 128, 3, True, True)], 2, keep={2}))
def test_ws_wg_parts_sync_a_warpgroup_at_a_time_sm90(bn, bt, stages, pipe, hv):
    # WsConfig.wg_parts: each warpgroup its own partition, so the consumers' barriers are a warpgroup's (128 threads,
    # two barrier ids) and none is the 8 warps' (256 threads); each partition's step loop issues its 64 rows' MMAs
    # (4 k16 a half, as each warpgroup of the 8 warps' one consumer) and frees its slot once. With pipe
    # the step loop keeps its registers
    kw = dict(exc=True, maxnreg=None, warps=8, xt=True, pre=3, pipe=pipe, hv=hv)
    for wp in (False, True):
        sass = _sass(_compile_sm90(bn, bt, stages, wp=wp, **kw))
        bars = set(re.findall(r"BAR\.SYNC\.DEFER_BLOCKING (0x[0-9a-f]+), (0x[0-9a-f]+)", sass))
        assert (("0x0", "0x100") in bars) != wp, bars
        if wp:
            assert {n for _, n in bars} == {"0x80"} and len(bars) == 2, bars
        steps = [ops for ops in _loops(sass) if "SYNCS.ARRIVE.TRANS64.A1T0" in ops and any(
            op.startswith("HGMMA") for op in ops)]
        step = min(steps, key=len)
        if not hv:  # (halves' waits split the step loop's body)
            assert sum(op.startswith("HGMMA") for op in step) == 8  # a warpgroup's 64 rows: 4 k16 a half, either way
            assert sum(op == "SYNCS.ARRIVE.TRANS64.A1T0" for op in step) == 1
        if pipe:
            assert sum(op.startswith(("LDL", "STL")) for op in step) <= 2


def test_ws_pipe_step_loop_at_bm256_keeps_its_registers_sm90():
    # pipe at bm 256 (the accumulator 128 registers a thread): a step carries only the next step's
    # first half decoded (its second half's words are read again) and waits for its own first
    # half's MMAs before decoding ahead; the step loop had 120 local loads and stores when it also
    # carried the next step's words and the first half to the step's end
    ops = _loop_ops(_sass(_compile_sm90(256, 128, 2, exc=True, maxnreg=None, warps=8, pipe=True, xt=True)))
    assert sum(op.startswith("HGMMA") for op in ops) == 16
    assert sum(op.startswith(("LDL", "STL")) for op in ops) <= 2


def test_ws_row_exceptions_a_round_ahead_compile_sm90():
    # exc_rows with exc_pre (PRE 4) at bm 128 and 3 stages (the H100's gate_up row at M = 129-255): each round's x
    # columns and values loaded during the round before, with no local loads or stores in the rounds' loops and
    # the same FMAs as the rounds that load their own (PRE 3)
    def rounds(pre):
        sass = _sass(_compile_sm90(128, 128, 3, exc=True, maxnreg=None, warps=8, pre=pre, xt=True))
        return [ops for ops in _loops(sass) if any(o.startswith("FFMA") for o in ops)
                and not any(o.startswith("HGMMA") for o in ops)]

    ahead, own = rounds(4), rounds(3)
    assert ahead and all(not any(o.startswith(("LDL", "STL")) for o in ops) for ops in ahead)
    assert sorted(sum(o.startswith("FFMA") for o in ops) for ops in ahead) == sorted(
        sum(o.startswith("FFMA") for o in ops) for ops in own)
    assert ahead != own


@pytest.mark.cpu_sample(every=2)  # compiles for sm_90: half the configs in the default run
@pytest.mark.parametrize("bn,bt", [(128, 256), (256, 128)])
def test_ws_row_exceptions_at_128_registers_a_thread_compile_sm90(bn, bt):
    # exc_rows where the accumulator takes 128 registers a thread (bm 256 or bn 256, 8 warps): the exception
    # rounds run on each half of the x rows in turn, so a round keeps its x values and the accumulator in
    # registers (all the x rows at once spilled 147 + 76 local loads and stores a round at bm 256, 174 + 36 at
    # bn 256). The rounds' loops: FFMAs, no HGMMA
    sass = _sass(_compile_sm90(bn, bt, 2, exc=True, maxnreg=None, warps=8, pre=3, xt=True))
    rounds = [ops for ops in _loops(sass) if any(o.startswith("FFMA") for o in ops)
              and not any(o.startswith("HGMMA") for o in ops)]
    assert rounds
    assert all(sum(o.startswith(("LDL", "STL")) for o in ops) <= 2 for ops in rounds), [
        sum(o.startswith(("LDL", "STL")) for o in ops) for ops in rounds]


def _loop_ops(sass: str) -> list[str]:
    # the consumer warpgroup's step loop: the smallest loop that frees a ring slot, its opcodes
    loops = [ops for ops in _loops(sass) if "SYNCS.ARRIVE.TRANS64.A1T0" in ops and any(
        op.startswith("HGMMA") for op in ops)]
    return min(loops, key=len)


def test_ws_x_permutation_is_the_wg_slot_order():
    # x permuted by permute_x holds, at slot s of each 128-column step, the column that the
    # decoded tile puts at slot s (fixed12_wg.DECODE_ORDER), for every step
    import numpy as np

    w = _ws()
    k = 384
    x = torch.arange(2 * k, dtype=torch.float32).reshape(2, k)
    xp = w.permute_x(x)
    bits = np.indices([2] * 7)
    g, a, i1, i0, j, h, hh = bits
    col_w = 4 * (16 * g + 8 * hh + 4 * a + 2 * i1 + i0) + 2 * h + j
    from glyd.kernels.fixed12.wgmma import DECODE_ORDER

    slots = col_w.transpose([d - 1 for d in DECODE_ORDER.value[1:]]).reshape(-1)
    for step in range(k // 128):
        for row in range(2):
            assert xp[row, step * 128:(step + 1) * 128].tolist() == x[row, step * 128 + slots].tolist()
    # the two 64-column halves are hh = 0 and 1: half 0 holds only lo words 16 g + 4 a + i
    assert all((c // 4) % 16 < 8 for c in slots[:64]) and all((c // 4) % 16 >= 8 for c in slots[64:])
    with pytest.raises(ValueError, match="multiple of 128"):
        w.permute_x(torch.zeros(2, 200))
    assert torch.equal(w.permute_x_torch(x), xp)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 16, 17, 64, 100])
def test_ws_permute_kernel_matches_torch_gpu(m):
    # the Triton permutation and its torch twin give the same bits (x also as a column slice); with
    # xt the same launch writes x transposed too
    w = _ws()
    x = torch.randn(m, 3584 + 256, device="cuda").to(torch.bfloat16)
    for xs in (x[:, :3584], x[:, 128:3712].contiguous()):
        assert torch.equal(w.permute_x(xs).view(torch.int16), w.permute_x_torch(xs).view(torch.int16))
        xp, xt = torch.empty_like(xs, memory_format=torch.contiguous_format), xs.new_empty(xs.shape[::-1])
        w._permute_launch(m, 3584, xs.stride(0), xt=True)(xs, xp, xt)
        assert torch.equal(xp.view(torch.int16), w.permute_x_torch(xs).view(torch.int16))
        assert torch.equal(xt.view(torch.int16), xs.t().contiguous().view(torch.int16))


@pytest.mark.parametrize("m", [1, 17, 40])
def test_ws_permute_launch_writes_x_transposed_too(m):
    # the ws tile's x permutation with xt (the interpreter): the permuted x, and x transposed ([K, M],
    # the exceptions' x) from the same load, for x with a row stride past K and a ragged last block
    w = _ws()
    x = torch.randn(m, 384 + 128).to(torch.bfloat16)[:, 128:]
    xp, xt = torch.full((m, 384), 7.0, dtype=torch.bfloat16), torch.full((384, m), 7.0, dtype=torch.bfloat16)
    w._permute_launch(m, 384, x.stride(0), xt=True)(x, xp, xt)
    assert torch.equal(xp.view(torch.int16), w.permute_x_torch(x).view(torch.int16))
    assert torch.equal(xt.view(torch.int16), x.t().contiguous().view(torch.int16))
    xp2 = torch.zeros(m, 384, dtype=torch.bfloat16)
    w._permute_launch(m, 384, x.stride(0))(x, xp2)  # without xt: the permutation alone, no third tensor
    assert torch.equal(xp2.view(torch.int16), xp.view(torch.int16))


def test_ws_stream_k_parts_and_slots():
    # the persistent grid's arithmetic, as _ws_kernel / _ws_finish do it, on the CPU for many
    # shapes: program p has steps p W / P .. (p + 1) W / P; _ws_first(g) is the program holding
    # step g; a tile's parts are programs q0..q1, each writes its partial to slot 2 q + (its
    # range starts at or before the tile), and the last to count in reads exactly those slots
    import random

    first = lambda g, P, W: ((g + 1) * P - 1) // W  # noqa: E731  (_ws_first)
    rng = random.Random(0)
    cases = [(1, 1, 1), (3, 28, 264), (296, 28, 396), (16, 28, 300), (5, 3, 7)]
    cases += [(rng.randint(1, 40), rng.randint(1, 30), 0) for _ in range(300)]
    for tiles, S, P in cases:
        W = tiles * S
        P = min(W, P or rng.randint(1, 2 * W))  # launch: at most one program a step
        ranges = [(p * W // P, (p + 1) * W // P) for p in range(P)]
        assert all(a < b for a, b in ranges) and ranges[-1][1] == W
        for g in range(W):
            p = first(g, P, W)
            assert ranges[p][0] <= g < ranges[p][1]
        written = {}
        for t in range(tiles):
            ts = t * S
            q0, q1 = first(ts, P, W), first(ts + S - 1, P, W)
            covering = [p for p, (a, b) in enumerate(ranges) if a < ts + S and b > ts]
            assert covering == list(range(q0, q1 + 1))
            if q0 == q1:
                continue  # one program: the whole tile, no partial
            slots = [2 * q + int(ranges[q][0] <= ts) for q in covering]  # what each part writes
            read = [2 * q + int((q * W) // P <= ts) for q in range(q0, q1 + 1)]  # what the last reads
            assert slots == read
            for q, sl in zip(covering, slots):
                assert sl not in written, (tiles, S, P, t, q)  # no slot holds two parts
                written[sl] = t
        assert all(sl < 2 * P for sl in written)


def test_ws_config_checks():
    from glyd.kernels import WsConfig

    base = dict(bm=16, bn=64, stages=4)
    WsConfig(**base)
    WsConfig(**{**base, "warps": 8, "bn": 128})  # two warpgroups on one ring slot
    WsConfig(**{**base, "warps": 8, "bn": 256})  # ... of 128 rows each
    for bad in (dict(stages=1), dict(stages=9), dict(warps=8, bn=512), dict(warps=8, bn=64), dict(bm=512),
                dict(maxnreg=300)):
        with pytest.raises(ValueError, match="WsConfig"):
            WsConfig(**{**base, **bad})
    WsConfig(**{**base, "pipe": True})
    for bad in (dict(pipe=1), dict(pipe="yes")):
        with pytest.raises(ValueError, match="pipe"):
            WsConfig(**{**base, **bad})
    WsConfig(**{**base, "exc_chunk": 64, "exc_xt": True, "exc_pre": True, "exc_corr": True})
    WsConfig(**{**base, "exc_chunk": 128, "exc_vals": True})
    WsConfig(**{**base, "exc_rows": True})
    for bad in (dict(exc_chunk=8), dict(exc_chunk=48), dict(exc_chunk=256), dict(exc_xt=1), dict(exc_pre="yes"), dict(exc_corr=0),
                dict(exc_vals=1), dict(exc_pre=True, exc_vals=True), dict(exc_rows=1)):
        with pytest.raises(ValueError, match="exc_"):
            WsConfig(**{**base, **bad})
    WsConfig(**{**base, "halves": True, "x_outer": True, "pipe": True})
    for bad in (dict(halves=1), dict(halves="yes")):
        with pytest.raises(ValueError, match="halves"):
            WsConfig(**{**base, **bad})
    WsConfig(**{**base, "warps": 8, "bn": 128, "wg_parts": True, "halves": True, "pipe": True})
    for bad in (dict(wg_parts=True), dict(wg_parts=1, warps=8, bn=128), dict(wg_parts=True, warps=4, bn=128)):
        with pytest.raises(ValueError, match="wg_parts"):
            WsConfig(**{**base, **bad})
    for bad in (dict(consumers=2), dict(bk=256)):  # removed variants, fixed K steps
        with pytest.raises(TypeError):
            WsConfig(**{**base, **bad})


def test_ws_exception_chunk_128_compiles_sm90():
    # WsConfig.exc_chunk 128 (half the rounds of 64) at the 7B's gate_up row past M = 64 (bm 128, bn 128, 8 warps,
    # 2 stages), its values from the prepared list (exc_vals), x transposed: no spill (2026-12-06: 168 registers,
    # 180516 B), and within shared_bytes' bound
    from glyd.kernels import WsConfig

    k = _compile_sm90(128, 128, 2, exc=True, maxnreg=None, warps=8, xe=128, xt=True, pre=2)
    res = _res_usage(k)
    assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, res
    assert k.metadata.shared <= _ws().shared_bytes(WsConfig(bm=128, bn=128, warps=8, stages=2, exc_chunk=128))
    assert _sass(k).count("HGMMA") > _sass(_compile_sm90(128, 128, 2, exc=True, maxnreg=None, warps=8, xe=64, xt=True,
                                                         pre=2)).count("HGMMA")


def test_ws_row_exceptions_compile_sm90():
    # WsConfig.exc_rows at the 7B's gate_up row past M = 64: the accumulator's threads add their rows' exceptions
    # with FMAs (2026-12-06: 168 registers, no spill, 276 instructions a round of 64 FFMA and 34 loads), no one-hot
    # MMA and no shared memory beyond the ring's
    k = _compile_sm90(128, 128, 2, exc=True, maxnreg=None, warps=8, xt=True, pre=3)
    none = _compile_sm90(128, 128, 2, exc=False, maxnreg=None, warps=8)
    res = _res_usage(k)
    assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, res
    assert k.metadata.shared == none.metadata.shared
    sass = _sass(k)
    assert sass.count("HGMMA") == _sass(none).count("HGMMA")  # the K loop's MMAs only
    assert sass.count("FFMA") >= 64  # a round: an FMA an accumulator element
    # ... with x's columns from x itself (no transposed copy: exc_xt off), at a decode row's tile (bm 64, 80 registers):
    # no spill (with a predicate an element, before 2026-12-06, 16 bytes); here 8 bytes at most since the next round's
    # index is loaded a round ahead (64 with a predicate an element; x itself lost to the copy at every M >= 32 on an
    # H100, 2026-12-06: no table row runs it past M = 16)
    for bn, bm, warps, cap, most in ((128, 128, 8, None, 8), (64, 64, 4, 80, 0)):
        direct = _compile_sm90(bn, bm, 2, exc=True, maxnreg=cap, warps=warps, pre=3)
        res = _res_usage(direct)
        assert res.get("STACK", 0) <= most and res.get("LOCAL", 0) == 0, (bn, bm, res)
        assert _sass(direct).count("FFMA") >= bn * bm // (32 * warps)  # an FMA an accumulator element a thread


def test_ws_refuses_a_ring_past_the_shared_memory():
    # a config whose ring and exception step need more shared memory than a Hopper program has is refused by
    # can_implement (the launch would fail with the compiler's out-of-resources error), with the bytes named
    from glyd.kernels import WsConfig, registry
    from glyd.kernels.fixed12 import wgmma_warpspec as W

    dev = registry.Device("cuda", "NVIDIA H200", (9, 0), 132, features=frozenset({"wgmma", "tma", "gluon"}))
    prob = registry.Problem("fixed12", 128, 37888, 3584, 3584)
    fits = WsConfig(bm=128, bn=128, warps=8, stages=2, exc_chunk=128)  # 180516 B compiled for sm_90a
    assert W.shared_bytes(fits) >= 180516 and W.WsKernel.can_implement(prob, dev, fits)[0]
    ok, why = W.WsKernel.can_implement(prob, dev, fits.replace(stages=3))
    assert not ok and "shared memory" in why and str(W.shared_bytes(fits.replace(stages=3))) in why
    for cfg in LONG_M_CONFIGS:  # every config the GPU tests run past M = 64 fits
        bm, bn, warps, stages, chunk = cfg
        assert W.shared_bytes(WsConfig(bm=bm, bn=bn, warps=warps, stages=stages, exc_chunk=chunk)) <= W.SHARED_MAX


def test_ws_needs_a_gpu():
    from glyd import kernels
    from glyd.kernels import WsConfig

    p = glyd.pack(random_weights(64, 256, "normal"), "fixed12")
    if torch.cuda.is_available():
        p = p.to("cuda")
    with pytest.raises(ValueError, match="Hopper|Gluon"):
        kernels.linear(torch.randn(2, 256).to(torch.bfloat16).to(p.device), p, None,
                       WsConfig(bm=16, bn=64, stages=4))


@pytest.mark.gpu
@pytest.mark.gpu_sample(every=24)
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
@pytest.mark.parametrize("bm,bn,stages", [(8, 64, 4), (16, 64, 4), (32, 64, 4), (64, 64, 3), (64, 128, 2), (16, 64, 2),
                                         (64, 64, 2), (16, 128, 3)])
@pytest.mark.parametrize("m", [1, 17, 64, 100])
@pytest.mark.parametrize("progs", [0, 1, 5, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_ws_matches_reference_gpu(bm, bn, stages, m, progs, bias):
    from glyd import kernels
    from glyd.kernels import WsConfig

    # N not a multiple of the tile (TMA's zero fill), K = 28 steps, exceptions present. progs:
    # the persistent grid (0: two an SM); 5 gives programs several whole tiles and parts of
    # others, 300 (more programs than some shapes' steps) parts of one or two steps
    w = random_weights(1000, 3584, "normal", "cuda")
    p = glyd.pack(w, "fixed12")
    assert p.arrays["exc_idx"].numel() > 0
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    b = torch.randn(1000, device="cuda").to(torch.bfloat16) if bias else None
    # a ring of 2 with 64 weight rows: the defaults' 80-register cap (three programs an SM);
    # bn 128 with a ring of 3: two consumer warpgroups (8 warps) on one ring
    cap = 80 if (stages, bn) in ((2, 64), (3, 128)) else 128
    warps = 8 if (stages, bn) == (3, 128) else 4
    cfg = WsConfig(bm=bm, bn=bn, stages=stages, split=progs, waves=3, warps=warps, maxnreg=cap)
    y = kernels.linear(x, p, b, cfg)
    _check(y, x, w, b)
    # the same bits on a second launch (the tile counters were left at zero; the parts are
    # summed in program order whichever program finishes a tile)
    assert torch.equal(kernels.linear(x, p, b, cfg).view(torch.int16), y.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
@pytest.mark.parametrize("bm,bn,stages,warps", [(256, 128, 2, 8), (64, 64, 2, 4)])
def test_ws_one_row_with_row_exceptions_gpu(bm, bn, stages, warps):
    # one x row, x tiles inner (MT = 1), real weights' 0.1% of exceptions by exc_rows from x transposed: within the
    # float64 bound (the launch that failed to compile before MT was left unspecialized)
    from glyd import kernels
    from glyd.kernels import WsConfig

    w = random_weights(1000, 3584, "normal", "cuda")
    w.view(-1)[torch.randint(0, w.numel(), (w.numel() // 1000,), device="cuda")] = torch.tensor(
        1e-30, device="cuda").to(torch.bfloat16)
    p = glyd.pack(w, "fixed12")
    x = torch.randn(1, 3584, device="cuda").to(torch.bfloat16)
    b = torch.randn(1000, device="cuda").to(torch.bfloat16)
    cfg = WsConfig(bm=bm, bn=bn, stages=stages, waves=1, warps=warps, exc_xt=True, exc_rows=True)
    _check(kernels.linear(x, p, b, cfg), x, w, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
@pytest.mark.parametrize("bm,bn,stages,warps,pipe", [(128, 128, 3, 8, False), (256, 128, 2, 8, True),
                                                     (64, 64, 2, 4, False)])
@pytest.mark.parametrize("m,progs", [(100, 0), (300, 0), (300, 7), (600, 300)])
def test_ws_x_outer_gpu(bm, bn, stages, warps, pipe, m, progs):
    # WsConfig.x_outer (weight tiles inner): every tile within the float64 bound, real weights' 0.1% of exceptions
    # by exc_rows, ragged M and N, programs with parts of tiles (progs 7), one step (300); the same bits twice, and
    # x inner's bits where there is one x tile (M <= bm: the same tiles at the same K steps)
    from glyd import kernels
    from glyd.kernels import WsConfig

    w = random_weights(1000, 3584, "normal", "cuda")
    w.view(-1)[torch.randint(0, w.numel(), (w.numel() // 1000,), device="cuda")] = torch.tensor(
        1e-30, device="cuda").to(torch.bfloat16)
    p = glyd.pack(w, "fixed12")
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    cfg = WsConfig(bm=bm, bn=bn, stages=stages, split=progs, waves=1, warps=warps, pipe=pipe, exc_xt=True,
                   exc_rows=True)
    y = kernels.linear(x, p, None, cfg.replace(x_outer=True))
    _check(y, x, w, None)
    assert torch.equal(kernels.linear(x, p, None, cfg.replace(x_outer=True)).view(torch.int16), y.view(torch.int16))
    if m <= bm:
        assert torch.equal(kernels.linear(x, p, None, cfg).view(torch.int16), y.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.gpu_sample(every=4)
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
@pytest.mark.parametrize("bm,bn,stages,warps,cap", [(16, 64, 2, 4, 80), (64, 64, 3, 4, 128), (256, 128, 2, 8, 0),
                                                    (128, 128, 3, 8, 0)])
@pytest.mark.parametrize("m", [1, 100, 300])
@pytest.mark.parametrize("progs", [0, 5, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_ws_pipe_matches_unpiped_bits_gpu(bm, bn, stages, warps, cap, m, progs, bias):
    # WsConfig.pipe issues the same MMAs in the same order (only the decode moves earlier): the
    # same bits as the unpiped tile, within the float64 bound; programs with one step, several
    # whole tiles and parts of tiles (progs), exceptions present, N not a multiple of the tile
    from glyd import kernels
    from glyd.kernels import WsConfig

    w = random_weights(1000, 3584, "normal", "cuda")
    p = glyd.pack(w, "fixed12")
    assert p.arrays["exc_idx"].numel() > 0
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    b = torch.randn(1000, device="cuda").to(torch.bfloat16) if bias else None
    cfg = WsConfig(bm=bm, bn=bn, stages=stages, split=progs, waves=1, warps=warps, maxnreg=cap)
    y = kernels.linear(x, p, b, cfg.replace(pipe=True))
    _check(y, x, w, b)
    assert torch.equal(y.view(torch.int16), kernels.linear(x, p, b, cfg).view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
@pytest.mark.parametrize("bm,bn,stages,warps,xo,pipe", [(256, 128, 2, 8, False, False), (128, 128, 3, 8, True, False),
                                                        (64, 64, 2, 4, False, False), (256, 128, 2, 8, True, True),
                                                        (64, 64, 3, 4, False, True)])
@pytest.mark.parametrize("m,progs", [(1, 0), (300, 0), (300, 5), (600, 300)])
def test_ws_halves_match_whole_slots_bits_gpu(bm, bn, stages, warps, xo, pipe, m, progs):
    # WsConfig.halves frees a slot's halves one at a time and issues the same MMAs in the same order: within the
    # float64 bound and the same bits as whole slots without pipe, twice; real weights' 0.1% of exceptions by
    # exc_rows, a bias, programs with one step (300), parts of tiles (5), N not a multiple of the tile, x tiles outer
    # and pipe too
    from glyd import kernels
    from glyd.kernels import WsConfig

    w = random_weights(1000, 3584, "normal", "cuda")
    w.view(-1)[torch.randint(0, w.numel(), (w.numel() // 1000,), device="cuda")] = torch.tensor(
        1e-30, device="cuda").to(torch.bfloat16)
    p = glyd.pack(w, "fixed12")
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    b = torch.randn(1000, device="cuda").to(torch.bfloat16)
    cfg = WsConfig(bm=bm, bn=bn, stages=stages, split=progs, waves=1, warps=warps, exc_xt=True, exc_rows=True,
                   x_outer=xo)
    y = kernels.linear(x, p, b, cfg.replace(halves=True, pipe=pipe))
    _check(y, x, w, b)
    assert torch.equal(y.view(torch.int16), kernels.linear(x, p, b, cfg).view(torch.int16))
    assert torch.equal(y.view(torch.int16), kernels.linear(x, p, b, cfg.replace(halves=True, pipe=pipe)).view(
        torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
@pytest.mark.parametrize("bm,stages,xo,pipe,hv", [(256, 2, False, False, False), (128, 3, True, False, False),
                                                  (256, 2, True, True, False), (256, 2, False, True, True),
                                                  (128, 3, False, False, True)])
@pytest.mark.parametrize("m,progs", [(1, 0), (300, 0), (300, 5), (600, 300)])
def test_ws_wg_parts_match_one_consumer_bits_gpu(bm, stages, xo, pipe, hv, m, progs):
    # WsConfig.wg_parts (a consumer partition a warpgroup, its own work slots and tile counters) issues each row's
    # MMAs and exception rounds in the same order as the 8 warps' one consumer: within the float64 bound and the
    # same bits, twice (the counters left zeroed); real weights' 0.1% of exceptions by exc_rows, a bias, programs
    # with one step (300), parts of tiles (5), N not a multiple of the tile; x tiles outer, pipe and halves too
    from glyd import kernels
    from glyd.kernels import WsConfig

    w = random_weights(1000, 3584, "normal", "cuda")
    w.view(-1)[torch.randint(0, w.numel(), (w.numel() // 1000,), device="cuda")] = torch.tensor(
        1e-30, device="cuda").to(torch.bfloat16)
    p = glyd.pack(w, "fixed12")
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    b = torch.randn(1000, device="cuda").to(torch.bfloat16)
    cfg = WsConfig(bm=bm, bn=128, stages=stages, split=progs, waves=1, warps=8, exc_xt=True, exc_rows=True,
                   x_outer=xo, pipe=pipe, halves=hv)
    y = kernels.linear(x, p, b, cfg.replace(wg_parts=True))
    _check(y, x, w, b)
    assert torch.equal(y.view(torch.int16), kernels.linear(x, p, b, cfg).view(torch.int16))
    assert torch.equal(y.view(torch.int16), kernels.linear(x, p, b, cfg.replace(wg_parts=True)).view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
def test_ws_strided_x_and_k_384_gpu():
    # x as a column slice (not contiguous rows), K = 3 steps (not a multiple of 256)
    from glyd import kernels
    from glyd.kernels import WsConfig

    w = random_weights(200, 384, "normal", "cuda")
    p = glyd.pack(w, "fixed12")
    x = torch.randn(33, 512, device="cuda").to(torch.bfloat16)[:, 64:448]
    y = kernels.linear(x, p, None, WsConfig(bm=64, bn=64, stages=3))
    _check(y, x, w, None)


#: (bm, bn, warps, stages, exc_chunk) of the ws configs past M = 64 checked on the GPU below; the tables' rows there are
#: among them (test_the_tables_ws_rows_past_64_are_checked_on_the_gpu)
LONG_M_CONFIGS = [(128, 128, 8, 2, 64), (128, 64, 4, 3, 32), (256, 128, 8, 2, 32), (16, 64, 4, 2, 64),
                  (128, 256, 8, 2, 64), (128, 128, 8, 2, 128),
                  (128, 64, 4, 2, 64), (64, 64, 4, 2, 64),  # round 45's "ws bn64 exc rows" and "ws bm64 exc rows" rows
                  (128, 128, 8, 3, 16)]  # round 48's gate_up row at M = 129-255 (the H100's table)


def test_the_tables_ws_rows_past_64_are_checked_on_the_gpu():
    import json
    from pathlib import Path

    from glyd.kernels import registry as R

    first = {b: lo for b, lo, _ in R.M_BUCKETS}
    rows = set()
    for path in Path(R.table_file("x")).parent.glob("*.json"):
        for by_class in json.loads(path.read_text())["linear"].get("fixed12", {}).values():
            for bucket, cands in by_class.items():
                # exc_rows reads no exc_chunk (the GPU test runs exc_rows at each config's own): any chunk there
                rows |= {tuple(c["config"].get(f, d) for f, d in (("bm", 16), ("bn", 64), ("warps", 4), ("stages", 2)))
                         + (None if c["config"].get("exc_rows") else c["config"].get("exc_chunk", 16),)
                         for c in cands if c["kernel"] == "fixed12_wgmma_warpspec" and first[bucket] > 64}
    assert rows <= set(LONG_M_CONFIGS) | {cfg[:4] + (None,) for cfg in LONG_M_CONFIGS}, rows


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
@pytest.mark.parametrize("bm,bn,warps,stages,chunk", LONG_M_CONFIGS)
@pytest.mark.parametrize("m", [9, 100, 200])
def test_ws_exception_steps_gpu(bm, bn, warps, stages, chunk, m):
    # WsConfig.exc_chunk / exc_xt / exc_pre with 0.1% of weights exceptions (real weights' rate), N not a multiple
    # of the tile: within the float64 bound, and the transposed x's reads and the prepared values give the same bits
    from glyd import kernels
    from glyd.kernels import WsConfig

    w = random_weights(1000, 3584, "normal", "cuda")
    w.view(-1)[torch.randint(0, w.numel(), (w.numel() // 1000,), device="cuda")] = torch.tensor(
        1e-30, device="cuda").to(torch.bfloat16)
    p = glyd.pack(w, "fixed12")
    assert p.arrays["exc_idx"].numel() >= w.numel() // 2000
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    cfg = WsConfig(bm=bm, bn=bn, warps=warps, stages=stages, waves=1, exc_chunk=chunk)
    y = kernels.linear(x, p, None, cfg)
    _check(y, x, w, None)
    yt = kernels.linear(x, p, None, cfg.replace(exc_xt=True))
    assert torch.equal(yt.view(torch.int16), y.view(torch.int16))
    # the prepared values, a round ahead (exc_pre): the same products in the same order
    yp = kernels.linear(x, p, None, cfg.replace(exc_xt=True, exc_pre=True))
    assert torch.equal(yp.view(torch.int16), y.view(torch.int16))
    # ... in the round itself (exc_vals)
    yv = kernels.linear(x, p, None, cfg.replace(exc_vals=True))
    assert torch.equal(yv.view(torch.int16), y.view(torch.int16))
    # by the accumulator's own threads, a row's j-th exception at once (exc_rows): fp32 FMAs, another order of the sums
    yr = kernels.linear(x, p, None, cfg.replace(exc_rows=True))
    _check(yr, x, w, None)
    assert torch.equal(kernels.linear(x, p, None, cfg.replace(exc_rows=True)).view(torch.int16), yr.view(torch.int16))
    # ... their x columns from x itself or from a transposed copy (exc_xt): the same FMAs, the same bits
    yrt = kernels.linear(x, p, None, cfg.replace(exc_rows=True, exc_xt=not cfg.exc_xt))
    assert torch.equal(yrt.view(torch.int16), yr.view(torch.int16))
    # ... each round's x columns and values loaded a round ahead (exc_pre), from x or its transposed copy
    for xt in (False, True):
        yra = kernels.linear(x, p, None, cfg.replace(exc_rows=True, exc_pre=True, exc_xt=xt))
        assert torch.equal(yra.view(torch.int16), yr.view(torch.int16))
    # the exceptions by a pass of their own, added where a tile is finished (exc_corr): another order of the sums
    yc = kernels.linear(x, p, None, cfg.replace(exc_corr=True))
    _check(yc, x, w, None)
    assert torch.equal(kernels.linear(x, p, None, cfg.replace(exc_corr=True)).view(torch.int16), yc.view(torch.int16))
