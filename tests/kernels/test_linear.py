"""Fused linear kernels against F.linear in float64 on the same bf16 inputs.

Tolerance: the output is bf16, so each element may be off by one bf16 rounding of the exact
result (relative 2**-8; the interpreter truncates where the GPU rounds to nearest, hence 2**-7
here) plus fp32 accumulation noise (an absolute 1e-3 of the largest output). Inputs are fresh
random draws on every run.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import glyd

from .conftest import DEVICES, needs_triton, on_devices, random_weights

pytestmark = needs_triton

RTOL = 2.0**-7
ATOL_FRAC = 1e-3


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    ref = F.linear(x.double().cpu(), w.double().cpu(), None if bias is None else bias.double().cpu())
    # The long-prompt path calls cuBLAS in bf16, which may reduce in reduced precision: allow, on
    # top of our bound, what bf16 F.linear on the same device is off by.
    twin = F.linear(x, w.to(x.device), bias).cpu().double()
    y = y.cpu()
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape
    assert torch.isfinite(y).all()
    err = (y.double() - ref).abs()
    bound = RTOL * ref.abs() + ATOL_FRAC * ref.abs().max() + (twin - ref).abs()
    worst = (err - bound).max().item() if ref.numel() else 0.0
    assert worst <= 0, f"max excess over tolerance {worst:.3g} (max err {err.max().item():.3g})"


N_CASES = 42  # len(_cases()), which imports Triton: kept equal by test_case_count


def test_case_count():
    assert len(_cases()) == N_CASES


def _cases():
    from glyd.kernels import (GemvConfig, LongConfig, MmaConfig, TcConfig, TieredGemvConfig,  # noqa: F401
                              TileConfig)

    # (layout, M, N, K, config or None for the device table's choice)
    return [
        ("fixed12", 1, 37, 200, None),  # the GEMV, odd shape
        ("fixed12", 1, 16, 1100, GemvConfig(bm=1, bn=16, bk=256, split=3)),  # split-K + finalize
        ("fixed12", 2, 20, 1100, GemvConfig(bm=1, bn=16, bk=512)),
        ("fixed12", 2, 64, 128, None),
        ("fixed12", 5, 19, 320, TileConfig(bm=16, bn=16, bk=128, split=2)),
        ("fixed12", 16, 40, 130, None),
        ("fixed12", 17, 33, 256, None),  # M bucket 32
        ("fixed12", 33, 16, 192, None),  # M bucket 64
        ("fixed12", 70, 16, 128, TileConfig(bm=128, bn=16, bk=128)),  # the tile path at long M
        ("fixed12", 300, 24, 100, None),  # long-prompt path: unpack + cuBLAS
        ("tiered", 1, 9, 1100, TieredGemvConfig(bn=16, bb=4, mb=4)),  # fused GEMV, blocks straddle rows
        ("tiered", 3, 5, 1024, TieredGemvConfig(bn=8, bb=1, mb=4, warps=1)),  # fused, one row a program
        ("tiered", 2, 7, 300, None),  # unpack + F.linear (the default)
        ("tiered", 8, 6, 1280, None),  # above the fused M limit: unpack path
        # mma tile kernel (A operand decoded in registers): odd K, split-K with g reduced to fit
        ("fixed12", 1, 37, 200, MmaConfig(bm=16, bn=16, g=1)),
        ("fixed12", 5, 70, 1100, MmaConfig(bm=16, bn=32, g=2, split=3)),
        ("fixed12", 33, 20, 320, MmaConfig(bm=64, bn=16, g=2)),
        ("fixed12", 16, 64, 256, MmaConfig(bm=16, bn=64, g=4, waves=8)),
        # split-K summed by the last program of each tile (no finalize kernel), every kernel
        ("fixed12", 1, 37, 1100, GemvConfig(bm=1, bn=16, bk=256, split=3, fixup=True)),
        ("fixed12", 5, 70, 1100, MmaConfig(bm=16, bn=32, g=2, split=3, fixup=True)),
        ("fixed12", 3, 19, 320, TileConfig(bm=16, bn=16, bk=128, split=2, fixup=True)),
        # the GEMV, 2 or 4 x rows a program on one decoded tile (M not a multiple of them)
        ("fixed12", 3, 37, 1100, GemvConfig(bm=2, bn=16, bk=256, split=2)),
        ("fixed12", 5, 33, 1100, GemvConfig(bm=4, bn=32, bk=512, split=3, fixup=True)),
        ("fixed12", 3, 20, 200, GemvConfig(bm=2, bn=16, bk=256)),
        # the group-major GEMV kernel: EVEN (no masks, rows past N clamped) and register prefetch
        ("fixed12", 1, 37, 1024, GemvConfig(bm=1, bn=16, bk=256, split=2, prefetch=True)),
        ("fixed12", 2, 33, 1100, GemvConfig(bm=1, bn=16, bk=256, split=3, prefetch=True)),
        ("fixed12", 3, 40, 1024, GemvConfig(bm=1, bn=32, bk=512)),
        ("fixed12", 1, 37, 1024, GemvConfig(bm=1, bn=16, bk=128, split=4, fixup=True, prefetch=True)),
        # the same GEMV with several x rows a program (M not a multiple of bm; even and odd K)
        ("fixed12", 3, 37, 1024, GemvConfig(bm=2, bn=16, bk=256, split=2)),
        ("fixed12", 5, 33, 1100, GemvConfig(bm=4, bn=32, bk=128, split=3)),
        ("fixed12", 11, 20, 512, GemvConfig(bm=8, bn=16, bk=128, prefetch=True)),
        ("fixed12", 16, 40, 1024, GemvConfig(bm=16, bn=16, bk=128, split=2, fixup=True)),
        ("fixed12", 3, 20, 200, GemvConfig(bm=2, bn=16, bk=256)),
        ("fixed12", 4, 24, 640, None),  # the defaults of M = 3-4 and 5-8 (small matrix)
        ("fixed12", 7, 24, 640, None),
        # tensor cores fed from register loads (decode to bf16 in registers): even, odd K, split-K
        ("fixed12", 5, 40, 512, TcConfig(bm=16, bn=32, bk=128)),
        ("fixed12", 17, 33, 1100, TcConfig(bm=32, bn=16, bk=256, split=2)),
        ("fixed12", 16, 64, 1024, TcConfig(bm=16, bn=64, bk=256, split=2, fixup=True)),
        # tc with register prefetch: even (the last step re-reads its words), odd K, split-K
        ("fixed12", 9, 32, 1024, TcConfig(bm=16, bn=32, bk=256, stages=1, prefetch=True)),
        ("fixed12", 33, 40, 1100, TcConfig(bm=64, bn=16, bk=128, stages=1, prefetch=True)),
        ("fixed12", 16, 48, 2048, TcConfig(bm=16, bn=16, bk=128, stages=1, prefetch=True, split=4)),
        ("fixed12", 20, 64, 1024, TcConfig(bm=32, bn=32, bk=128, stages=2)),
    ]


@pytest.mark.gpu_sample(every=5)
@pytest.mark.parametrize("case,device", on_devices([(c,) for c in range(N_CASES)], [str(c) for c in range(N_CASES)],
                                                   cpu_marks=[pytest.mark.cpu_sample(every=3)]))
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_reference(case, device, with_bias):
    from glyd import kernels

    layout, m, n, k, cfg = _cases()[case]
    w = random_weights(n, k, "normal" if case % 2 else "wide")
    p = glyd.pack(w, layout).to(device)
    x = torch.randn(m, k).to(torch.bfloat16).to(device)
    bias = torch.randn(n).to(torch.bfloat16).to(device) if with_bias else None
    _check(kernels.linear(x, p, bias, cfg), x, w, bias)


@pytest.mark.parametrize("device", DEVICES)
def test_split_fixup_leaves_counters_zero(device):
    # The last program of each tile resets its counter: the next launch starts from zero, and
    # the result equals the two-kernel split-K (same summation order) bit for bit. Two x rows (bm 1: two
    # tiles a column of weight tiles), three weight tiles (the last ragged), K 1100 in four parts.
    from glyd import kernels
    from glyd.kernels import GemvConfig
    from glyd.kernels._common import counters

    w = random_weights(40, 1100, "normal")
    p = glyd.pack(w, "fixed12").to(device)
    x = torch.randn(2, 1100).to(torch.bfloat16).to(device)
    bias = torch.randn(40).to(torch.bfloat16).to(device)
    cfg = GemvConfig(bm=1, bn=16, bk=256, split=4)
    y0 = kernels.linear(x, p, bias, cfg)
    for _ in range(2):
        y = kernels.linear(x, p, bias, cfg.replace(fixup=True))
        assert int(counters(torch.device(device), 1).abs().sum()) == 0
        assert torch.equal(y.view(torch.int16), y0.view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_long_chunked_equals_whole_unpack(device, with_bias):
    # Chunks of weight rows (exceptions in several chunks, a short last chunk, odd K): each chunk
    # unpacks bit for bit, and the product matches the unchunked one (bit for bit on the CPU; on
    # CUDA cuBLAS may pick another algorithm for a narrower N, so there within the tolerance).
    from glyd import kernels
    from glyd.kernels import LongConfig
    from glyd.kernels.fixed12.exceptions import prepare
    from glyd.kernels.fixed12.unpack import unpack_rows

    n, k = 200, 130
    w = random_weights(n, k, "wide")
    p = glyd.pack(w, "fixed12").to(device)
    rows = (p.arrays["exc_idx"].cpu() // k).unique()
    assert rows.numel() > 3 and int(rows.min()) < 64 <= int(rows.max())  # exceptions in more than one chunk
    x = torch.randn(9, k).to(torch.bfloat16).to(device)
    bias = torch.randn(n).to(torch.bfloat16).to(device) if with_bias else None
    prep = prepare(p)
    for r0, r1 in ((0, 64), (64, 128), (128, 200), (37, 41)):
        out = torch.full((r1 - r0, k), 7.0, dtype=torch.bfloat16, device=device)
        unpack_rows(p, prep, r0, r1, out)
        assert torch.equal(out.view(torch.int16).cpu(), w[r0:r1].view(torch.int16)), (r0, r1)
    whole = kernels.linear(x, p, bias, LongConfig())
    _check(whole, x, w, bias)
    if device == "cpu":  # the same call as F.linear, written into the output linear allocated
        assert torch.equal(whole.view(torch.int16), F.linear(x, w, bias).view(torch.int16))
    from glyd.kernels.fixed12.unpack_cublas import LongKernel

    out = torch.empty(9, n, dtype=torch.bfloat16, device=device)
    assert LongKernel.launch(x, p, bias, LongConfig(), out).data_ptr() == out.data_ptr()
    for chunk in (64, 128):
        y = kernels.linear(x, p, bias, LongConfig(chunk=chunk))
        if device == "cpu":
            assert torch.equal(y.view(torch.int16), whole.view(torch.int16)), chunk
        _check(y, x, w, bias)
        # the unpacks on a second stream (CUDA; the CPU runs the chunks in turn): the same GEMMs, the same bits;
        # 64 rows: four chunks, so the third and fourth reuse the first two's halves of the buffer
        overlapped = kernels.linear(x, p, bias, LongConfig(chunk=chunk, overlap=True))
        assert torch.equal(overlapped.view(torch.int16), y.view(torch.int16)), chunk


def test_config_chunk_validation():
    from glyd.kernels import LongConfig

    with pytest.raises(ValueError, match="chunk"):
        LongConfig(chunk=100)
    with pytest.raises(ValueError, match="chunk"):
        LongConfig(chunk=-64)
    with pytest.raises(ValueError, match="chunk"):
        LongConfig(chunk=True)
    with pytest.raises(ValueError, match="overlap needs chunk"):
        LongConfig(overlap=True)
    with pytest.raises(ValueError, match="overlap must be True or False"):
        LongConfig(chunk=64, overlap=1)


def test_long_overlap_orders_its_streams(monkeypatch):
    # the overlapped plan's stream order, with the streams and events stubbed on the CPU (ops run at once): each
    # chunk's unpack goes to half i % 2 of the buffer on the side stream, after the GEMM that last read that half;
    # the caller's stream waits for the unpack before its GEMM; the product is the serial chunks' bit for bit
    import contextlib

    from glyd import kernels
    from glyd.kernels import LongConfig
    from glyd.kernels.fixed12 import unpack_cublas as U

    log = []

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_stream(self, other):
            log.append((self.name, "wait_stream", other.name))

        def wait_event(self, ev):
            log.append((self.name, "wait_event", ev.name))

    class Event:
        count = 0

        def __init__(self):
            self.name = f"read{Event.count % 2}"
            Event.count += 1

        def record(self, stream):
            log.append((stream.name, "record", self.name))

    main, side, cur = Stream("main"), Stream("side"), ["main"]

    @contextlib.contextmanager
    def on(stream):
        cur.append(stream.name)
        yield
        cur.pop()

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(U, "_side_stream", lambda device: side)
    w = random_weights(200, 130, "wide")
    p = glyd.pack(w, "fixed12")
    x = torch.randn(9, 130).to(torch.bfloat16)
    bias = torch.randn(200).to(torch.bfloat16)
    parts = [(r0, min(200, r0 + 64), U.unpack_launch(p, r0, min(200, r0 + 64))) for r0 in range(0, 200, 64)]
    buf_ptrs = []
    for i, (r0, r1, launch) in enumerate(parts):  # note where and on which stream each unpack writes
        parts[i] = (r0, r1, (lambda launch: lambda w_, *a: (buf_ptrs.append((cur[-1], w_.data_ptr())),
                                                            launch(w_, *a)))(launch))
    out = torch.empty(9, 200, dtype=torch.bfloat16)
    U.overlap_plan(torch.device("cpu"), 130, parts)(x, bias, out, tuple(p.arrays[a] for a in U._codec.ARRAYS))
    serial = kernels.linear(x, p, bias, LongConfig(chunk=64))
    assert torch.equal(out.view(torch.int16), serial.view(torch.int16))
    assert [s for s, _ in buf_ptrs] == ["side"] * 4
    half = 64 * 130 * 2  # bytes of a half
    assert [ptr - buf_ptrs[0][1] for _, ptr in buf_ptrs] == [0, half, 0, half]
    assert log[0] == ("side", "wait_stream", "main")
    assert log[1:] == [("main", "wait_stream", "side"), ("main", "record", "read0"),
                       ("main", "wait_stream", "side"), ("main", "record", "read1"),
                       ("side", "wait_event", "read0"), ("main", "wait_stream", "side"), ("main", "record", "read0"),
                       ("side", "wait_event", "read1"), ("main", "wait_stream", "side"), ("main", "record", "read1")]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m,chunk", [(65, 256), (300, 128)])
def test_long_overlap_in_a_cuda_graph_gpu(m, chunk):
    # a prompt-sized product with the chunks' unpacks on a second stream: the serial chunks' bits, eagerly and
    # replayed from a CUDA graph on new x (the side stream joins the capture and rejoins it before the end)
    from glyd import kernels
    from glyd.kernels import LongConfig

    w = random_weights(1000, 3584, "normal", "cuda")
    p = glyd.pack(w, "fixed12")
    bias = torch.randn(1000, device="cuda").to(torch.bfloat16)
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    serial = kernels.linear(x, p, bias, LongConfig(chunk=chunk))
    _check(serial, x, w, bias)
    cfg = LongConfig(chunk=chunk, overlap=True)
    assert torch.equal(kernels.linear(x, p, bias, cfg).view(torch.int16), serial.view(torch.int16))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kernels.linear(x, p, bias, cfg)
    x.copy_(torch.randn(m, 3584, device="cuda").to(torch.bfloat16))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y.view(torch.int16), kernels.linear(x, p, bias, LongConfig(chunk=chunk)).view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
def test_linear_leading_dims_and_strides(device):
    from glyd import kernels

    w = random_weights(24, 128, "normal")
    p = glyd.pack(w, "fixed12").to(device)
    x = torch.randn(2, 3, 256).to(torch.bfloat16).to(device)[..., ::2]  # non-unit stride along K
    y = kernels.linear(x, p)
    assert y.shape == (2, 3, 24)
    _check(y.reshape(6, 24), x.reshape(6, 128), w, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["fixed12", "tiered"])
@pytest.mark.parametrize("shape", [(0, 5, 64), (3, 0, 64), (3, 5, 0)])
def test_linear_empty(device, layout, shape):
    from glyd import kernels

    m, n, k = shape
    w = random_weights(n, k, "normal")
    p = glyd.pack(w, layout).to(device)
    x = torch.randn(m, k).to(torch.bfloat16).to(device)
    bias = torch.randn(n).to(torch.bfloat16).to(device)
    y = kernels.linear(x, p, bias)
    assert y.shape == (m, n)
    assert torch.equal(y.cpu().view(torch.int16), F.linear(x.cpu(), w, bias.cpu()).view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
def test_linear_rejects_bad_input(device):
    from glyd import kernels

    p = glyd.pack(random_weights(8, 64, "normal"), "fixed12").to(device)
    x = torch.randn(2, 64).to(device)
    with pytest.raises(TypeError, match="x must be bfloat16"):
        kernels.linear(x, p)
    with pytest.raises(ValueError, match="K = 64"):
        kernels.linear(x[:, :10].to(torch.bfloat16), p)
    with pytest.raises(ValueError, match="bias"):
        kernels.linear(x.to(torch.bfloat16), p, torch.zeros(3, device=device))


@pytest.mark.gpu
@pytest.mark.gpu_sample(every=8)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", ["fixed12", "tiered"])
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 32, 64, 512])
@pytest.mark.parametrize("shape", [(512, 3584), (4608, 3584), (3584, 18944), (1000, 777)])
def test_linear_gpu_model_shapes(layout, m, shape):
    from glyd import kernels

    w = random_weights(*shape, "normal", "cuda")
    p = glyd.pack(w, layout)
    x = torch.randn(m, shape[1], device="cuda").to(torch.bfloat16)
    bias = torch.randn(shape[0], device="cuda").to(torch.bfloat16)
    _check(kernels.linear(x, p, bias), x, w, bias)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [3, 8, 16, 32, 64])
def test_linear_gpu_big_matrix_defaults(m):
    # a merged gate_up of a 7B model (37888 x 3584: a "big" matrix, the ws tile from M = 3 on
    # Hopper) through the default config, with bias, and the same bits on a second call
    from glyd import kernels

    w = random_weights(37888, 3584, "normal", "cuda")
    p = glyd.pack(w, "fixed12")
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    bias = torch.randn(37888, device="cuda").to(torch.bfloat16)
    y = kernels.linear(x, p, bias)
    _check(y, x, w, bias)
    assert torch.equal(kernels.linear(x, p, bias).view(torch.int16), y.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout,n,k,m", [("fixed12", 4608, 3584, 4), ("tiered", 4608, 3584, 4),
                                          # the exception pass on a side stream (GEMV; Gluon) and after tc
                                          ("fixed12", 512, 3584, 4), ("fixed12", 3584, 18944, 8),
                                          ("fixed12", 512, 3584, 32)])
def test_linear_cuda_graph_capture(layout, n, k, m):
    # Captured with the default config, replayed on new x: the same bits as an eager call.
    from glyd import kernels

    w = random_weights(n, k, "normal", "cuda")
    p = glyd.pack(w, layout)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    kernels.linear(x, p)  # warm-up: compiles, builds the derived index
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kernels.linear(x, p)
    x.copy_(torch.randn(m, k, device="cuda").to(torch.bfloat16))
    g.replay()
    torch.cuda.synchronize()
    _check(y, x, w, None)
    assert torch.equal(y.view(torch.int16), kernels.linear(x, p).view(torch.int16))


@pytest.mark.parametrize("n,k,m", [(40, 640, 3), (37, 1024, 20)])
def test_exception_pass_adds_each_exceptions_correction(n, k, m):
    # The separate exception pass (GemvConfig.exc_pass and the Gluon kernels') against the corrections computed
    # one by one in float64: part[0] += x[:, c] * (true - window value).
    import torch as t

    from glyd import kernels
    from glyd.kernels.fixed12 import exceptions as f12

    dev = "cuda" if t.cuda.is_available() else "cpu"
    w = random_weights(n, k, "normal", dev)
    p = glyd.pack(w, "fixed12")
    a = p.arrays
    assert a["exc_idx"].numel() > f12.EXC_CHUNK  # several chunks, some rows with more than one
    x = t.randn(m, k, device=dev).to(t.bfloat16)
    part = t.randn(2, m, n, device=dev)
    before = part.clone()
    f12.add_exceptions(part, x, p, f12.prepare(p))
    idx = a["exc_idx"].long()
    r, c = idx // k, idx % k
    th = a["exc_hi"].long()
    lo = a["lo"][r, c].long()
    base = int(a["base"][0])
    window = ((((th & 0x80) | base) << 24) | (lo << 16)).to(t.int32).view(t.float32).double()
    true = w[r, c].double()
    want = before[0].double()
    want.index_add_(1, r, x.double()[:, c] * (true - window)[None, :])
    assert t.equal(part[1], before[1])
    assert ((part[0].double() - want).abs() <= 1e-5 * (1 + want.abs())).all()
    own = t.randn(3, m, n, device=dev)  # add=False: the corrections alone, in a partial of their own
    f12.add_exceptions(own[1:2], x, p, f12.prepare(p), add=False)
    delta = want - before[0].double()
    assert ((own[1].double() - delta).abs() <= 1e-5 * (1 + delta.abs())).all()
    assert (own[1] != 0).sum() <= r.unique().numel() * m  # zeros where a row has no exception
    with pytest.raises(ValueError, match="part must be contiguous float32"):
        f12.add_exceptions(part[:, :, :-1], x, p, f12.prepare(p))


@pytest.mark.parametrize("m,bm", [(3, 16), (20, 16), (40, 64), (70, 128)])
def test_exception_pass_reads_x_transposed_to_the_same_bits(m, bm):
    # exceptions_launch(xt=True): x read as x.t() (a column's rows contiguous; the ws tile's exc_corr), any x rows
    # a program: the same corrections, bit for bit, as the strided pass of 16 rows a program
    import torch as t

    from glyd.kernels.fixed12 import exceptions as f12

    dev = "cuda" if t.cuda.is_available() else "cpu"
    w = random_weights(37, 1024, "normal", dev)
    w.view(-1)[t.randint(0, w.numel(), (200,), generator=t.Generator().manual_seed(5)).to(dev)] = t.tensor(
        1e-30).to(t.bfloat16).to(dev)
    p = glyd.pack(w, "fixed12")
    prep = f12.prepare(p)
    x = t.randn(m, 1024, device=dev).to(t.bfloat16)
    arrays = [p.arrays[a] for a in ("lo", "code", "base", "exc_idx", "exc_hi")]
    want = t.full((1, m, 37), float("nan"), device=dev)
    f12.exceptions_launch(x, p, prep, add=False)(want, x, *arrays)
    got = t.full((1, m, 37), float("nan"), device=dev)
    f12.exceptions_launch(x, p, prep, add=False, xt=True, bm=bm)(got, x.t().contiguous(), *arrays)
    assert t.equal(got.view(t.int32), want.view(t.int32)) and (want != 0).any()
    with pytest.raises(ValueError, match="16-256 x rows"):
        f12.exceptions_launch(x, p, prep, add=False, xt=True, bm=24)


@pytest.mark.parametrize("cfg", [dict(kind="gemv", bm=2, bn=16, bk=128),
                                 dict(kind="tc", bm=16, bn=32, bk=128, stages=1, split=3),
                                 dict(kind="tc", bm=16, bn=16, bk=64, stages=1, prefetch=True, fixup=True)])
# (side is chosen in fixed12/gemv.py launch_word_tiles only for CUDA tensors: elsewhere exc_after=False
# runs the pass after the tile kernel too, the same launches as after=True)
@pytest.mark.parametrize("after", [pytest.param(False, marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="without CUDA exc_after=False runs as exc_after=True (no side stream)")),
    True])
def test_exception_pass_path(cfg, after):
    # GEMV and tc with exceptions in their own pass (exc_pass), beside the tile kernel on a side
    # stream (CUDA) or after it (exc_after): same checks as in-kernel
    from glyd import kernels
    from glyd.kernels import GemvConfig, TcConfig

    cfg = dict(cfg)
    cfg = {"gemv": GemvConfig, "tc": TcConfig}[cfg.pop("kind")](**cfg, exc_pass=True, exc_after=after)
    with pytest.raises(ValueError, match="exc_pass"):
        GemvConfig(exc_after=True)  # exc_after orders a pass: without one it means nothing
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    w = random_weights(45, 640, "normal", dev)
    p = glyd.pack(w, "fixed12")
    assert p.arrays["exc_idx"].numel() > 0
    x = torch.randn(5, 640, device=dev).to(torch.bfloat16)
    bias = torch.randn(45, device=dev).to(torch.bfloat16)
    y = kernels.linear(x, p, bias, cfg)
    if dev == "cuda":
        torch.cuda.synchronize()
    _check(y, x, w, bias)


def test_an_experts_config_is_refused_by_linear_with_its_name():
    # an experts family's config is the config of a fixed12 family too (registry.kernel_for): linear
    # used to launch it with the experts signature and crash inside it ("'NoneType' object has no
    # attribute 'shape'")
    from glyd import kernels
    from glyd.kernels.fixed12.experts import ExpertsGemvConfig
    from glyd.kernels.fixed12.experts_mma import ExpertsMmaConfig

    p = glyd.pack(random_weights(16, 64, "normal"), "fixed12")
    x = torch.randn(2, 64).to(torch.bfloat16)
    for cfg in (ExpertsGemvConfig(), ExpertsMmaConfig()):
        with pytest.raises(TypeError, match=f"{type(cfg).__name__}.*glyd.kernels.experts.linear"):
            kernels.linear(x, p, config=cfg)
    # the flag linear reads is set on every experts family of the layouts
    from glyd.kernels import registry
    from glyd.kernels.experts import ExpertsKernel

    for key in registry.KERNELS:
        kc = registry.kernel_class(key)
        assert kc.experts == issubclass(kc, ExpertsKernel), key
