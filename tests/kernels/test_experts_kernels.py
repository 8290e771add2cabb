"""Expert products (glyd.kernels.experts): the grouped GEMV and the grouped tensor-core product over
packed fixed12 experts, the loop of fused products and the unpack + grouped GEMM, against float64 on
the same bf16 inputs; the choice between them; the one-launch unpack of all experts, bit for bit.

Tolerance as tests/kernels/test_linear.py: one bf16 rounding of the exact result (relative 2**-7
under the interpreter, which truncates) plus fp32 accumulation noise (1e-3 of the largest output).
"""

from __future__ import annotations

import pytest
import torch

from .conftest import DEVICES, needs_triton, on_devices

pytestmark = needs_triton

RTOL = 2.0**-7
ATOL_FRAC = 1e-3


def _experts(e: int, n: int, k: int, device: str) -> torch.Tensor:
    w = torch.randn(e, n, k) * 0.02
    flat = w.view(-1)
    pick = torch.randint(0, flat.numel(), (max(2, flat.numel() // 300),))
    flat[pick] = torch.where(torch.rand(pick.numel()) < 0.5, 4.0, -3.0)  # exceptions that matter if dropped
    return w.to(torch.bfloat16).to(device)


def _check(y: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> None:
    ref = torch.einsum("sk,snk->sn", x.double().cpu(), w.double().cpu()[ids.cpu().long()])
    y = y.cpu()
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape and torch.isfinite(y).all()
    err = (y.double() - ref).abs()
    bound = RTOL * ref.abs() + ATOL_FRAC * ref.abs().max()
    worst = (err - bound).max().item()
    assert worst <= 0, f"max excess over tolerance {worst:.3g} (max err {err.max().item():.3g})"


def _cases():
    from glyd.kernels.experts import ExpertsGroupedConfig, ExpertsLoopConfig
    from glyd.kernels.fixed12.experts import ExpertsGemvConfig
    from glyd.kernels.fixed12.experts_mma import ExpertsMmaConfig as Mma

    # (layout, experts, N, K, rows, config or None: the default choice)
    return [
        ("fixed12", 3, 40, 200, 5, ExpertsGemvConfig()),  # K padded to 256: masked loads
        ("fixed12", 4, 37, 256, 6, ExpertsGemvConfig(bn=32, bk=256)),  # EVEN: whole steps, rows past N clamped
        ("fixed12", 2, 16, 130, 3, ExpertsGemvConfig(bn=16, bk=64, warps=1)),
        ("fixed12", 3, 24, 128, 70, None),  # 70 rows: the grouped tensor-core product
        ("fixed12", 3, 24, 128, 4, None),  # 4 rows: the grouped GEMV
        ("fixed12", 3, 20, 96, 5, ExpertsLoopConfig()),
        ("tiered", 3, 9, 200, 4, None),  # other layouts: the loop
        ("fixed12", 3, 40, 200, 37, Mma()),  # K padded to 256 (masked x), N tail (rows past N clamped)
        ("fixed12", 8, 96, 256, 300, Mma(block_m=32, block_n=32, block_k=256)),  # blocks of 32 rows
        ("fixed12", 5, 16, 64, 20, Mma(block_n=16, block_k=64, warps=1, stages=1)),  # one 64-weight group
        ("fixed12", 4, 64, 192, 24, Mma(block_k=128)),  # padded K 192: steps of one group; ~40 exceptions a tile
        ("fixed12", 6, 80, 128, 40, None),  # 40 rows: the grouped tensor-core product
        ("fixed12", 3, 20, 96, 70, None),  # K padded (96 -> 128): the MMA (the unpack + grouped GEMM refuses it)
        ("fixed12", 6, 16, 64, 3, ExpertsGroupedConfig(groups=2)),  # experts without rows skipped; straddling programs
        ("fixed12", 5, 40, 192, 90, ExpertsGroupedConfig(groups=8, warps=1)),
        ("fixed12", 3, 24, 128, 70, ExpertsGroupedConfig(max_scratch_bytes=1000)),  # not one expert fits: the loop
        ("fixed12", 5, 24, 128, 70, ExpertsGroupedConfig(max_scratch_bytes=2 * 24 * 128 * 2, groups=4)),  # chunks of 2
    ]


N_CASES = 17


def test_case_count():
    assert len(_cases()) == N_CASES


# CPU-slow: cases 3, 11 and 12, the default choice at 40-70 rows (the grouped tensor-core product on a GPU). Triton's
# interpreter chooses the grouped GEMV there, case 4's choice, at a program a row: 10-17 s a case in a 2-core run
# (2026-12-07), 38 s of the grid's 52 s. Their GPU cases stay in the default GPU set.
@pytest.mark.parametrize("case,device", on_devices([(c,) for c in range(N_CASES)], [str(c) for c in range(N_CASES)],
                                                   cpu_slow={3, 11, 12}))
def test_experts_product_against_float64(device, case):
    from glyd.kernels import experts as kernels
    from glyd.ops.experts import pack_experts

    layout, e, n, k, s, cfg = _cases()[case]
    torch.manual_seed(case)
    w = _experts(e, n, k, device)
    p = pack_experts(w, layout)
    x = torch.randn(s, k).to(torch.bfloat16).to(device)
    ids = torch.randint(0, e, (s,), device=device)
    ids[0] = e - 1  # the last expert's rows too
    y = kernels.linear(x, ids, p, cfg)
    _check(y, x, ids, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("routing", ["subset", "one", "bases", "int32"])
def test_the_grouped_mma_on_uneven_routings(device, routing):
    # experts without rows (blocks of -1), one expert with every row (a run of several blocks), experts
    # with different exponent windows (the base loaded at run time), int32 ids
    from glyd.kernels import experts as kernels
    from glyd.kernels.fixed12.experts_mma import ExpertsMmaConfig, prepare
    from glyd.ops.experts import pack_experts

    torch.manual_seed(11)
    e, n, k, s = 6, 48, 128, 120 if routing == "one" else 50
    w = _experts(e, n, k, "cpu")
    if routing == "bases":
        w[1] = w[1] * 4096.0  # a power of two: exact in bf16, its window 6 steps higher
    p = pack_experts(w.to(device), "fixed12")
    assert (prepare(p).base is None) == (routing == "bases")
    x = torch.randn(s, k).to(torch.bfloat16).to(device)
    if routing == "subset":
        ids = torch.tensor([1, 4])[torch.randint(0, 2, (s,))]
    elif routing == "one":
        ids = torch.full((s,), 2)
    else:
        ids = torch.randint(0, e, (s,))
    ids = ids.to(torch.int32 if routing == "int32" else torch.int64).to(device)
    y = kernels.linear(x, ids, p, ExpertsMmaConfig())
    _check(y, x, ids, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("s,e,bm", [(1, 4, 16), (37, 5, 16), (300, 8, 32), (64, 128, 16)])
def test_the_alignment_sorts_rows_by_expert_in_padded_blocks(device, s, e, bm):
    from glyd.kernels.fixed12.experts_mma import align, max_blocks

    torch.manual_seed(s)
    ids = torch.randint(0, max(1, e // 2), (s,)).to(device)  # the upper half of the experts gets no row
    rows, bexp = (t.cpu() for t in align(ids, e, bm))
    ids = ids.cpu()
    nb = max_blocks(s, e, bm)
    assert rows.shape == (nb * bm,) and bexp.shape == (nb,)
    counts = torch.bincount(ids, minlength=e)
    used = int(((counts + bm - 1) // bm).sum())
    assert (bexp[used:] == -1).all() and (bexp[:used] >= 0).all()
    assert torch.equal(bexp[:used], torch.sort(bexp[:used]).values)  # runs in expert order
    blocks = rows[:used * bm].reshape(used, bm)
    real = blocks[blocks < s]
    assert torch.equal(real.long(), torch.argsort(ids, stable=True))  # every row once, stable
    for b in range(used):
        assert (ids[blocks[b][blocks[b] < s].long()] == bexp[b]).all()
        assert (blocks[b][blocks[b] >= s] == s).all()  # padding: the sentinel S


@pytest.mark.parametrize("device", DEVICES)
def test_int32_ids_and_leading_dims(device):
    from glyd.kernels import experts as kernels
    from glyd.kernels.fixed12.experts import ExpertsGemvConfig
    from glyd.ops.experts import pack_experts

    torch.manual_seed(7)
    w = _experts(3, 20, 128, device)
    p = pack_experts(w, "fixed12")
    x = torch.randn(2, 3, 128).to(torch.bfloat16).to(device)
    ids = torch.tensor([[2, 0, 2], [1, 1, 0]], dtype=torch.int32, device=device)
    y = kernels.linear(x, ids, p, ExpertsGemvConfig())
    assert y.shape == (2, 3, 20)
    _check(y.reshape(6, 20), x.reshape(6, 128), ids.reshape(6), w)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_ids_give_the_bits_of_contiguous_ones(device):
    # The GEMV and the MMA's alignment read ids as one contiguous array: a strided view such as
    # top_k_index[:, 0] (the op takes any 1-D ids) gave rows the products of other experts, no error
    from glyd.kernels import experts as kernels
    from glyd.kernels.fixed12.experts import ExpertsGemvConfig
    from glyd.kernels.fixed12.experts_mma import ExpertsMmaConfig
    from glyd.ops.experts import pack_experts

    torch.manual_seed(8)
    w = _experts(6, 64, 64, device)
    p = pack_experts(w, "fixed12")
    # 16 rows (40 before: the GEMV's grid is a program a row, 15.6 s of interpreter; any strided misread still shows)
    x = torch.randn(16, 64).to(torch.bfloat16).to(device)
    ids = torch.randint(0, 6, (16, 2), device=device)[:, 0]  # stride 2
    for cfg in (None, ExpertsGemvConfig(bn=32), ExpertsMmaConfig()):
        want = kernels.linear(x, ids.contiguous(), p, cfg)
        assert torch.equal(kernels.linear(x, ids, p, cfg).view(torch.int16), want.view(torch.int16)), cfg
    _check(kernels.linear(x, ids, p), x, ids, w)
    from glyd.kernels.fixed12 import experts as gemv, experts_mma as mma

    out = torch.empty(16, 64, dtype=torch.bfloat16, device=device)
    for launch, cfg in ((gemv.launch, ExpertsGemvConfig()), (mma.launch, ExpertsMmaConfig())):
        with pytest.raises(ValueError, match="ids must be contiguous"):  # the launchers refuse what they would misread
            launch(x, ids, p, cfg, out)


@pytest.mark.parametrize("device", DEVICES)
def test_the_op_takes_the_kernels_on_their_device(device, monkeypatch):
    # glyd::experts_linear runs the kernels for tensors on a GPU (the interpreter: called directly here)
    from glyd.kernels import experts as kernels
    from glyd.ops import experts as ops

    if device == "cpu":
        pytest.skip("the CUDA implementation of the op needs CUDA tensors")
    calls = []
    real = kernels.linear
    monkeypatch.setattr(kernels, "linear", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    w = _experts(3, 20, 128, device)
    p = ops.pack_experts(w, "fixed12")
    x = torch.randn(4, 128).to(torch.bfloat16).to(device)
    ids = torch.tensor([0, 2, 2, 1], device=device)
    _check(ops.experts_linear(x, ids, p), x, ids, w)
    assert calls


def test_a_linear_config_or_table_entry_is_not_taken_for_experts(monkeypatch, caplog):
    # a linear family's config crashed inside the launch ('Tensor' object has no attribute 'arrays');
    # a linear family in an experts cell was chosen and crashed every product of it; a bad config was
    # skipped with no trace; GLYD_DISABLED_KERNELS was not heard; reset() kept the old choices
    from glyd.kernels import GemvConfig, registry
    from glyd.kernels import experts as kernels
    from glyd.kernels.registry import Device, Problem
    from glyd.ops.experts import pack_experts

    p = pack_experts(_experts(2, 8, 64, "cpu"), "fixed12")
    x = torch.randn(2, 64).to(torch.bfloat16)
    with pytest.raises(TypeError, match="GemvConfig is the config of fixed12_gemv, a family of linears"):
        kernels.linear(x, torch.tensor([0, 1]), p, GemvConfig())
    dev = Device("cuda", "NVIDIA H200", (9, 0), 132)
    prob = Problem("fixed12", 8, 64, 128, 128)
    cell = [{"kernel": "fixed12_gemv", "config": {}}, {"kernel": "fixed12_experts_gemv", "config": {"bogus": 1}},
            {"kernel": "fixed12_experts_mma", "config": {}}]
    real = registry.table_for
    monkeypatch.setattr(registry, "table_for", lambda d: {**real(d), "experts": {"fixed12": {"5-8": cell}}})
    registry.reset()
    try:
        with caplog.at_level("WARNING", logger="glyd.kernels.experts"):
            assert kernels.choose(prob, dev)[0].name == "fixed12_experts_mma"
        assert "skipped fixed12_gemv: a family of linears" in caplog.text
        assert "skipped fixed12_experts_gemv {'bogus': 1}: bad config" in caplog.text
        monkeypatch.setattr(registry, "table_for", real)
        registry.reset()  # the table read again: the default (the GEMV at 8 rows), not the cached MMA
        assert kernels.choose(prob, dev)[0].name == "fixed12_experts_gemv"
        monkeypatch.setattr(registry, "disabled", lambda: frozenset({"fixed12_experts_gemv"}))
        registry.reset()
        assert kernels.choose(prob, dev)[0].name == "fixed12_experts_mma"  # the GEMV disabled: the next one
    finally:
        monkeypatch.undo()
        registry.reset()


def test_the_choice_by_rows_and_capture():
    from glyd.kernels import experts as kernels
    from glyd.kernels.registry import Device, Problem

    dev = Device("cuda", "NVIDIA H200", (9, 0), 132)
    name = lambda m, layout="fixed12", cap=False: kernels.choose(Problem(layout, m, 64, 128, 128), dev, cap)[0].name  # noqa: E731
    assert name(1) == name(16) == name(64) == name(255) == "fixed12_experts_gemv"
    assert name(256) == name(2048) == "fixed12_experts_mma"
    assert name(256, cap=True) == name(512, cap=True) == "fixed12_experts_mma"  # a decode step's capture
    assert name(2049) == name(4097) == "experts_unpack_grouped"  # past the MMA's rows: unpack + grouped GEMM
    assert name(4097, cap=True) == "experts_unpack_grouped"  # no host sync: a CUDA graph capture takes it too
    assert name(8, "tiered") == name(300, "tiered") == "experts_loop"
    with pytest.raises(RuntimeError, match="synchronises with the host"):
        kernels.choose(Problem("tiered", 8, 64, 128, 128), dev, True)


def test_ids_outside_the_experts_are_refused():
    from glyd.kernels import experts as kernels
    from glyd.kernels.experts import ExpertsLoopConfig
    from glyd.ops.experts import pack_experts

    p = pack_experts(_experts(2, 8, 64, "cpu"), "fixed12")
    x = torch.randn(2, 64).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="ids outside the experts"):
        kernels.linear(x, torch.tensor([0, 2]), p)
    with pytest.raises(ValueError, match="one expert a row"):
        kernels.linear(x, torch.tensor([0]), p)
    with pytest.raises(TypeError, match="int32 or int64"):
        kernels.linear(x, torch.tensor([0.0, 1.0]), p, ExpertsLoopConfig())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("s", [8, 256])
def test_a_captured_experts_product_follows_new_ids_on_gpu(s):
    # A CUDA graph of the product must route every replay by the ids it finds then (no routing frozen
    # at capture), and equal the eager product: bit for bit where both take the grouped GEMV (8 rows),
    # within tolerance where they may differ (256 rows: the grouped MMA now; a GPU table may choose others)
    from glyd.kernels import experts as kernels
    from glyd.ops.experts import pack_experts

    torch.manual_seed(s)
    e, n, k = 6, 96, 256
    w = _experts(e, n, k, "cuda")
    p = pack_experts(w, "fixed12")
    x = torch.randn(s, k).to(torch.bfloat16).cuda()
    ids = torch.randint(0, e, (s,), device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernels.linear(x, ids, p)  # warm: compiled, prepared
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = kernels.linear(x, ids, p)
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        ids.copy_(torch.randint(0, e, (s,), generator=g))
        x.copy_(torch.randn(s, k, generator=g).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        _check(y, x, ids, w)
        eager = kernels.linear(x, ids, p)
        if s <= 64:
            assert torch.equal(y.view(torch.int16), eager.view(torch.int16))
        else:
            _check(eager, x, ids, w)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("s", [256, 300, 512])
def test_a_captured_grouped_mma_follows_new_ids_on_gpu(s):
    # a decode step's capture (32-64 sequences at top-8: 256-512 rows) takes the grouped MMA; every
    # replay sorts the rows by the ids it finds then (random, one expert for all, half the experts
    # idle) and equals the eager product bit for bit
    from glyd.kernels import experts as kernels
    from glyd.kernels.registry import Device, Problem
    from glyd.ops.experts import pack_experts

    torch.manual_seed(s)
    e, n, k = 16, 96, 256
    w = _experts(e, n, k, "cuda")
    p = pack_experts(w, "fixed12")
    chosen = kernels.choose(Problem("fixed12", s, n, k, k), Device.of(torch.device("cuda")), True)[0]
    assert chosen.name == "fixed12_experts_mma"
    x = torch.randn(s, k).to(torch.bfloat16).cuda()
    ids = torch.randint(0, e, (s,), device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernels.linear(x, ids, p)  # warm: compiled, prepared
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = kernels.linear(x, ids, p)
    for seed, routing in ((1, "random"), (2, "one"), (3, "half")):
        g = torch.Generator().manual_seed(seed)
        new = torch.randint(0, e, (s,), generator=g)
        if routing == "one":
            new.fill_(e - 1)
        elif routing == "half":
            new = new % (e // 2) * 2  # the odd experts idle
        ids.copy_(new)
        x.copy_(torch.randn(s, k, generator=g).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        _check(y, x, ids, w)
        assert torch.equal(y.view(torch.int16), kernels.linear(x, ids, p).view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
def test_an_eager_loop_call_builds_what_a_captured_gemv_needs(device):
    # the warm-up step before a capture may take the loop, the capture the GEMV or the grouped MMA:
    # their exception index and shared base (built on the host) must exist by then
    from glyd.kernels import _common as C
    from glyd.kernels import experts as kernels
    from glyd.kernels.experts import ExpertsLoopConfig
    from glyd.ops.experts import pack_experts

    torch.manual_seed(3)
    w = _experts(3, 24, 128, device)
    p = pack_experts(w, "fixed12")
    assert id(p.arrays["exc_idx"]) not in C._CACHE and id(p.arrays["base"]) not in C._CACHE
    x = torch.randn(70, 128).to(torch.bfloat16).to(device)
    ids = torch.randint(0, 3, (70,), device=device)
    _check(kernels.linear(x, ids, p, ExpertsLoopConfig()), x, ids, w)
    # what a 70-row capture (the grouped GEMV) needs: its exception index
    assert id(p.arrays["exc_idx"]) in C._CACHE and id(p.arrays["base"]) not in C._CACHE
    x = torch.randn(300, 128).to(torch.bfloat16).to(device)
    ids = torch.randint(0, 3, (300,), device=device)
    _check(kernels.linear(x, ids, p, ExpertsLoopConfig()), x, ids, w)
    # what a 300-row capture (the grouped MMA) needs: the experts' shared base too
    assert id(p.arrays["base"]) in C._CACHE


@pytest.mark.parametrize("device", DEVICES)
def test_an_eager_call_builds_what_a_captured_grouped_product_needs(device, monkeypatch):
    # where the MMA cannot run (past its rows; refused here) a capture of 256+ rows takes the grouped family:
    # its exception tiles (host work) for the config a capture takes; over the scratch bound, the
    # GEMV's exception index (a capture then takes the GEMV)
    from glyd.kernels import _common as C
    from glyd.kernels import experts as kernels
    from glyd.kernels.experts import ExpertsGroupedConfig, ExpertsGroupedKernel, ExpertsLoopConfig
    from glyd.kernels.fixed12 import experts_unpack
    from glyd.kernels.fixed12.experts_mma import ExpertsMmaKernel
    from glyd.ops.experts import pack_experts

    torch.manual_seed(4)
    w = _experts(3, 24, 128, device)
    p = pack_experts(w, "fixed12")
    x = torch.randn(300, 128).to(torch.bfloat16).to(device)  # 256+ rows: the MMA first, then the grouped
    ids = torch.randint(0, 3, (300,), device=device)
    monkeypatch.setattr(ExpertsMmaKernel, "can_implement", classmethod(lambda cls, *a: (False, "refused by the test")))
    kernels._choose.cache_clear()
    try:
        _check(kernels.linear(x, ids, p, ExpertsLoopConfig()), x, ids, w)  # an eager call of another kernel
    finally:
        kernels._choose.cache_clear()  # no choice made without the MMA outlives the test
    tiles = experts_unpack.prepare(p).__dict__["_exception_tiles"]
    assert ("experts", 0, 3, 16 * 64, 9) in tiles  # 3 x 24 x 128 weights: 9 programs of 16 groups
    p2 = pack_experts(w, "fixed12")
    assert id(p2.arrays["exc_idx"]) not in C._CACHE
    ExpertsGroupedKernel.prepare(p2, ExpertsGroupedConfig(max_scratch_bytes=2 * 24 * 128 * 2))
    assert id(p2.arrays["exc_idx"]) in C._CACHE


def test_the_grouped_family_refuses_what_grouped_mm_and_the_unpack_cannot_take():
    from glyd.kernels import experts as kernels
    from glyd.kernels.experts import ExpertsGroupedConfig, ExpertsGroupedKernel as G
    from glyd.kernels.registry import Device, Problem

    h200 = Device("cuda", "NVIDIA H200", (9, 0), 132)
    cfg = ExpertsGroupedConfig()
    assert G.can_implement(Problem("fixed12", 300, 1536, 2048, 2048), h200, cfg) == (True, "")
    why = lambda p, dev=h200: G.can_implement(p, dev, cfg)[1]  # noqa: E731
    assert "multiples of 8" in why(Problem("fixed12", 300, 20, 128, 128))
    assert "multiples of 8" in why(Problem("fixed12", 300, 24, 132, 192))
    assert "K a multiple of 64" in why(Problem("fixed12", 300, 24, 96, 128))
    assert "layout 'tiered'" in why(Problem("tiered", 300, 24, 128, 128))
    assert "sm_80" in why(Problem("fixed12", 300, 24, 128, 128), Device("cuda", "Tesla T4", (7, 5), 40))
    # refused past the MMA's 4096 rows: the next candidate runs (the loop eagerly, the GEMV in a capture)
    name = lambda m, n, k, kp, cap=False: kernels.choose(Problem("fixed12", m, n, k, kp), h200, cap)[0].name  # noqa: E731
    assert name(5000, 24, 128, 128) == "experts_unpack_grouped"
    assert name(5000, 24, 96, 128) == "experts_loop"
    assert name(5000, 20, 128, 128, cap=True) == "fixed12_experts_gemv"
    assert name(300, 24, 96, 128) == "fixed12_experts_mma"  # up to 4096 rows the MMA first
    assert not G.syncs
    with pytest.raises(ValueError, match="power of two"):
        ExpertsGroupedConfig(groups=3)
    with pytest.raises(ValueError, match="max_scratch_bytes"):
        ExpertsGroupedConfig(max_scratch_bytes=-1)


@pytest.mark.parametrize("device", DEVICES)
def test_all_experts_unpack_in_one_launch_bit_for_bit(device):
    from glyd.kernels.fixed12.experts_unpack import unpack_experts
    from glyd.ops.experts import pack_experts

    torch.manual_seed(11)
    e, n, k = 5, 24, 128
    w = _experts(e, n, k, device)
    p = pack_experts(w, "fixed12")
    out = torch.full((e, n, k), float("nan"), dtype=torch.bfloat16, device=device)
    unpack_experts(p, out, groups=4)
    assert torch.equal(out.view(torch.int16), w.view(torch.int16))
    out.fill_(float("nan"))
    offs = torch.tensor([2, 2, 5, 5, 9], dtype=torch.int32, device=device)  # experts 1 and 3 have no rows
    unpack_experts(p, out, offs, groups=4)
    for i in (0, 2, 4):
        assert torch.equal(out[i].view(torch.int16), w[i].view(torch.int16))
    assert out[1].isnan().float().mean() > 0.9 and out[3].isnan().float().mean() > 0.9  # not unpacked
    part = torch.empty(2, n, k, dtype=torch.bfloat16, device=device)  # experts 2 and 3 alone (the chunked path)
    unpack_experts(p, part, first=2, groups=8)
    assert torch.equal(part.view(torch.int16), w[2:4].view(torch.int16))
    with pytest.raises(ValueError, match="of experts 4 .. 4 \\+ C <= 5"):
        unpack_experts(p, part, first=4)
    with pytest.raises(ValueError, match="offs must be a contiguous int32"):
        unpack_experts(p, out, offs.long())
    with pytest.raises(ValueError, match="offs must be a contiguous int32"):  # read as one array: it would skip experts
        unpack_experts(p, out, offs.repeat_interleave(2)[::2])
    with pytest.raises(ValueError, match="out must be a contiguous bf16"):
        unpack_experts(p, out[:, :, :64])


@pytest.mark.parametrize("device", DEVICES)
def test_the_scratch_bound_takes_chunks_of_experts_or_the_loop(device, monkeypatch, caplog):
    from glyd.kernels import experts as kernels
    from glyd.kernels.experts import ExpertsGroupedConfig
    from glyd.ops.experts import pack_experts

    monkeypatch.setattr(kernels, "_LOGGED", set())  # each message once a process: fresh here
    calls = []
    monkeypatch.setattr(kernels.ExpertsLoopKernel, "launch", classmethod(lambda c, *a: calls.append(1) or a[-1]))
    torch.manual_seed(13)
    w = _experts(5, 24, 128, device)
    p = pack_experts(w, "fixed12")
    x = torch.randn(70, 128).to(torch.bfloat16).to(device)
    ids = torch.randint(0, 5, (70,), device=device)
    one = 24 * 128 * 2
    with caplog.at_level("INFO", logger="glyd.kernels.experts"):
        _check(kernels.linear(x, ids, p, ExpertsGroupedConfig(max_scratch_bytes=3 * one)), x, ids, w)
        assert not calls and "chunks of 3 experts" in caplog.text
        kernels.linear(x, ids, p, ExpertsGroupedConfig(max_scratch_bytes=one - 1))
        assert calls == [1] and "the loop runs (not one expert fits)" in caplog.text
        _check(kernels.linear(x, ids, p, ExpertsGroupedConfig(max_scratch_bytes=5 * one)), x, ids, w)
        assert "a 0 MB bf16 scratch for 5 experts of 24 x 128" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("s", [4, 256])  # the grouped GEMV, the grouped MMA
def test_a_capture_before_any_eager_call_is_refused_by_name_on_gpu(s):
    from glyd.errors import UnsupportedError
    from glyd.kernels import experts as kernels
    from glyd.ops.experts import pack_experts

    p = pack_experts(_experts(3, 24, 128, "cuda"), "fixed12")
    x = torch.randn(s, 128).to(torch.bfloat16).cuda()
    ids = torch.zeros(s, dtype=torch.int64, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(UnsupportedError, match="warm-up step"):
        with torch.cuda.graph(graph):
            kernels.linear(x, ids, p)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_grouped_product_captures_in_a_cuda_graph():
    from glyd.kernels import experts as kernels
    from glyd.kernels.experts import ExpertsGroupedConfig
    from glyd.kernels.fixed12.experts import ExpertsGemvConfig
    from glyd.ops.experts import pack_experts

    torch.manual_seed(12)
    w = _experts(8, 64, 128, "cuda")
    p = pack_experts(w, "fixed12")
    x = torch.randn(80, 128, device="cuda").to(torch.bfloat16)  # 80 rows: a decode step of 10 rows, top-8
    ids = torch.randint(0, 6, (80,), device="cuda")  # experts 6 and 7 without rows
    dev = kernels.registry.Device.of(x.device)
    name = lambda m: kernels.choose(kernels.Problem("fixed12", m, 64, 128, 128), dev, True)[0].name  # noqa: E731
    assert name(80) == "fixed12_experts_gemv" and name(5000) == "experts_unpack_grouped"  # past the MMA's rows
    eager = kernels.linear(x, ids, p, ExpertsGroupedConfig())
    _check(eager, x, ids, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.linear(x, ids, p, ExpertsGroupedConfig())  # the family by its config (80 rows: the GEMV's)
    small = ExpertsGroupedConfig(max_scratch_bytes=2 * 64 * 128 * 2)  # chunks eagerly; the GEMV in a capture
    _check(kernels.linear(x, ids, p, small), x, ids, w)
    _check(kernels.linear(x, ids, p, ExpertsGemvConfig()), x, ids, w)  # its per-tensor data before the capture
    graph2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph2):
        out2 = kernels.linear(x, ids, p, small)
    ids.copy_(torch.randint(0, 8, (80,), device="cuda"))  # other routing, same graphs
    graph.replay()
    graph2.replay()
    torch.cuda.synchronize()
    _check(out, x, ids, w)
    _check(out2, x, ids, w)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("s", [8, 256])
def test_a_captured_product_gives_nan_rows_for_ids_outside_the_experts_on_gpu(s):
    # a graph cannot raise: a row routed outside the experts must come out NaN (the kernels clamp its id
    # to read memory safely), never another expert's product; the other rows stay right
    from glyd.kernels import experts as kernels
    from glyd.ops.experts import pack_experts

    torch.manual_seed(s + 1)
    e, n, k = 6, 96, 256
    w = _experts(e, n, k, "cuda")
    p = pack_experts(w, "fixed12")
    x = torch.randn(s, k).to(torch.bfloat16).cuda()
    ids = torch.randint(0, e, (s,), device="cuda")
    kernels.linear(x, ids, p)  # eager first: what the capture needs is built
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = kernels.linear(x, ids, p)
    ids[1], ids[-1] = e, -1
    graph.replay()
    torch.cuda.synchronize()
    bad = torch.zeros(s, dtype=torch.bool)
    bad[1] = bad[-1] = True
    assert torch.isnan(y.cpu()[bad]).all()
    good = ~bad
    _check(y.cpu()[good], x.cpu()[good], ids.cpu()[good], w)


def _column_slice(t: torch.Tensor, width: int, device) -> torch.Tensor:
    """``t`` as the first columns of a ``width``-wide tensor on ``device``: a strided view of the right shape."""
    wide = torch.zeros(t.shape[0], width, dtype=t.dtype, device=device)
    wide[:, : t.shape[1]] = t.to(device)
    return wide[:, : t.shape[1]]


@pytest.mark.parametrize("device", DEVICES)
def test_strided_arrays_and_inf_padding_refused(device):
    # as for a matrix (tests/kernels/test_unpack.py): the experts' kernels read each array as one dense
    # array (a strided view gave other rows' bytes) and their fused products multiply the padding by x's
    # zeros (padding code 7 with lo 0x80 at base 120 is +inf: NaN products); the codec read both right
    from glyd.codec.experts import PackedExperts
    from glyd.codec.experts import unpack_experts as codec_unpack
    from glyd.errors import CorruptError, FormatError
    from glyd.kernels import experts as kernels
    from glyd.kernels.experts import ExpertsGroupedConfig
    from glyd.kernels.fixed12.experts import ExpertsGemvConfig
    from glyd.kernels.fixed12.experts_mma import ExpertsMmaConfig
    from glyd.kernels.fixed12.experts_unpack import unpack_experts
    from glyd.ops.experts import pack_experts

    torch.manual_seed(3)
    w = torch.full((3, 8, 100), 2.0**113).to(torch.bfloat16)  # hi & 0x7F = 120
    p = pack_experts(w, "fixed12")
    strided = _column_slice(p.arrays["lo"], 256, "cpu")  # rows 256 bytes apart, not 128
    codes = torch.zeros(24, 128, dtype=torch.uint8)  # base 120: the weights are code 0
    codes[:, 100:] = 7
    g = codes.view(24, 2, 2, 32)
    pad = dict(code=(g[:, :, 0] | (g[:, :, 1] << 4)).reshape(24, 64), base=torch.full((3,), 120, dtype=torch.uint8),
               lo=torch.where(torch.arange(128) >= 100, 0x80, p.arrays["lo"].long()).to(torch.uint8))
    x = torch.full((4, 100), 1e-30, dtype=torch.bfloat16, device=device)
    ids = torch.tensor([0, 1, 2, 1], device=device)
    for error, match, arrays in ((FormatError, "'lo' must be contiguous", dict(lo=strided[:, :128])),
                                 (CorruptError, "padding", pad)):
        bad = PackedExperts("fixed12", p.shape, dict(p.arrays, **arrays))
        if error is FormatError:
            assert torch.equal(codec_unpack(bad).view(torch.int16), w.view(torch.int16))
        else:
            with pytest.raises(CorruptError, match="padding"):
                codec_unpack(bad)
        bad = bad.to(device)
        if error is FormatError:  # Tensor.to makes a strided view contiguous: the view is made on the device
            bad = PackedExperts("fixed12", p.shape, dict(bad.arrays, lo=_column_slice(p.arrays["lo"], 256, device)))
        for cfg in (ExpertsGemvConfig(), ExpertsMmaConfig(), ExpertsGroupedConfig()):
            with pytest.raises(error, match=match):
                kernels.linear(x, ids, bad, cfg)
    # the one-launch unpack takes K a multiple of 64 (no padding): a strided array only
    p = pack_experts(torch.randn(3, 8, 128).to(torch.bfloat16), "fixed12")
    bad = PackedExperts("fixed12", p.shape, dict(p.to(device).arrays, code=_column_slice(p.arrays["code"], 128, device)))
    with pytest.raises(FormatError, match="'code' must be contiguous"):
        unpack_experts(bad, torch.empty(3, 8, 128, dtype=torch.bfloat16, device=device))
