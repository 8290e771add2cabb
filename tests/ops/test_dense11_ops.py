"""dense11 through the glyd:: ops on the CPU: the pure-torch twins (unpack, linear, rows) and opcheck,
for format version 3 (``glyd.pack``), version 2 and version 1 (``dense11.pack_v2``, ``pack_v1``: old
checkpoints)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import glyd
import glyd.ops as ops
from glyd.codec.dense11 import pack_v1, pack_v2
from glyd.ops.rows import unpack_rows


@pytest.fixture(params=[3, 2, 1], ids=["v3", "v2", "v1"])
def pack(request):
    def pack(w, layout="dense11"):
        p = glyd.pack(w, layout) if request.param == 3 else {2: pack_v2, 1: pack_v1}[request.param](w)
        assert p.version == request.param
        return p

    return pack


def _weights(n: int, k: int, seed: int) -> torch.Tensor:
    # spread exponents: many escapes, table digits and exceptions
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) * torch.exp2(torch.randn(n, k, generator=g) * 6)).to(torch.bfloat16)


def test_twins_are_bit_exact(pack):
    w = _weights(12, 100, 0)
    p = pack(w, "dense11")
    assert p.layout == "dense11" and p.arrays["exc_idx"].numel() > 0
    assert torch.equal(ops.unpack(p).view(torch.int16), w.view(torch.int16))
    x = torch.randn(3, 5, 100).to(torch.bfloat16)
    b = torch.randn(12).to(torch.bfloat16)
    assert torch.equal(ops.linear(x, p, b).view(torch.int16), F.linear(x, w, b).view(torch.int16))


@pytest.mark.parametrize("shape", [(9, 70), (5, 2100), (40, 64), (3, 1)])
def test_rows_match_the_codec(shape, pack):
    w = _weights(*shape, sum(shape))
    p = pack(w, "dense11")
    n = shape[0]
    idx = torch.tensor([[n - 1, 0], [n // 2, n - 1], [0, 0]])
    assert torch.equal(unpack_rows(p, idx).view(torch.int16), w[idx].view(torch.int16))
    every = torch.arange(n).flip(0)
    assert torch.equal(ops.rows(p, every).view(torch.int16), w[every].view(torch.int16))


def test_rows_of_every_pattern(pack):
    w = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(256, 256)
    p = pack(w, "dense11")
    r = torch.tensor([255, 3, 128, 3])
    assert torch.equal(unpack_rows(p, r).view(torch.int16), w[r].view(torch.int16))


@pytest.mark.slow  # about 10 s on the CPU
def test_opcheck():
    p = glyd.pack(_weights(12, 96, 1), "dense11")
    layout, shape, arrays, version = ops._args(p)
    x = torch.randn(3, 96).to(torch.bfloat16)
    bias = torch.randn(12).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.glyd.linear.default, (x, layout, shape, arrays, bias, version))
    torch.library.opcheck(torch.ops.glyd.unpack.default, (layout, shape, arrays, version))
    torch.library.opcheck(torch.ops.glyd.rows.default, (layout, shape, arrays, version, torch.tensor([[3, 0], [11, 3]])))


def test_modules_take_dense11(pack):
    w = _weights(10, 70, 2)
    emb = glyd.GlydEmbedding(pack(w, "dense11"))
    ids = torch.tensor([[9, 0, 4]])
    assert torch.equal(emb(ids).view(torch.int16), w[ids].view(torch.int16))


def test_exact_and_fused_linears_on_the_cpu(pack):
    # exact: bf16 bits of F.linear on the true weights; fused: float64's product within test_linear's tolerance
    w = _weights(24, 1100, 3)
    x = torch.randn(2, 3, 1100).to(torch.bfloat16)
    b = torch.randn(24).to(torch.bfloat16)
    exact = glyd.GlydLinear(pack(w, "dense11"), b, exact=True)
    assert torch.equal(exact(x).view(torch.int16), F.linear(x, w, b).view(torch.int16))
    fused = glyd.GlydLinear(pack(w, "dense11"), b, exact=False)
    ref = F.linear(x.double(), w.double(), b.double())
    assert torch.allclose(fused(x).double(), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max()))


def test_v3_permutations_on_a_device_index_as_before():
    # restore_code and sm_columns index with version 3's permutations, made on the CPU: copied to the arrays' device
    # on every call, a row lookup (an embedding) could not be captured in a CUDA graph ("Cannot copy between CPU and
    # CUDA tensors during CUDA graph capture"): scale.py's dense11 step fell back to eager steps (2026-12-05)
    from glyd.codec import dense11_v3 as V3

    p = glyd.pack(_weights(3, 2100, 7), "dense11")
    want = V3.restore(p.arrays["code"], p.arrays["sm"])[0]
    assert torch.equal(V3.restore_code(p.arrays["code"]), want)
    assert V3.sm_columns(3584, "cpu")[[0, 16, 32, 3072, 3088]].tolist() == [0, 512, 16, 3072, 3328]


@pytest.mark.parametrize("version", [2, 3])
def test_rows_lookup_copies_nothing_from_the_cpu(version):
    # what a CUDA graph cannot capture, seen on the CPU: the matrix on the meta device, and every op of a second
    # lookup (after a warm-up one, which may fill caches) refused if it copies a CPU tensor to another device.
    # The GPU set found version 3's permutations and dense11_v2's nibble shifts copied on every call (2026-12-05)
    from torch.utils._python_dispatch import TorchDispatchMode

    class NoHostCopies(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            flat = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            devices = {a.device.type for a in flat}
            target = kwargs.get("device")
            if "cpu" in devices and (len(devices) > 1 or (target is not None and torch.device(target).type != "cpu")):
                raise AssertionError(f"{func} moves a CPU tensor to another device")
            return func(*args, **kwargs)

    packed = pack_v2(_weights(64, 2100, 8)) if version == 2 else glyd.pack(_weights(64, 2100, 8), "dense11")
    assert packed.version == version
    p = packed.to("meta")
    rows = torch.tensor([5, 0, 63, 5], device="meta")
    unpack_rows(p, rows)  # warm-up
    with NoHostCopies():
        out = unpack_rows(p, rows)
    assert out.shape == (4, 2100) and out.dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_v3_rows_lookup_is_captured_in_a_cuda_graph():
    w = _weights(64, 2100, 8)
    p = glyd.pack(w.cuda(), "dense11")
    rows = torch.tensor([5, 0, 63, 5], device="cuda")
    want = unpack_rows(p, rows)  # eager first, as a model's warm-up step
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = unpack_rows(p, rows)
    rows.copy_(torch.tensor([1, 2, 3, 4]))
    g.replay()
    assert torch.equal(got.view(torch.int16).cpu(), w[[1, 2, 3, 4]].view(torch.int16))
    assert torch.equal(want.view(torch.int16).cpu(), w[[5, 0, 63, 5]].view(torch.int16))
