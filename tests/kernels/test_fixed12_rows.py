"""``glyd.kernels.fixed12.rows``: the packed embedding's lookup in one launch, bit for bit (the
interpreter on the CPU, CUDA marked gpu), and ``glyd::rows`` on CUDA through it."""

from __future__ import annotations

import pytest
import torch

import glyd
from tests.kernels.conftest import DEVICES, random_weights


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16).cpu()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n, k, kind", [(50, 130, "wide"), (20, 1100, "wide"), (40, 64, "normal"), (8, 96, "none")])
def test_rows_equal_the_matrix_rows_bit_for_bit(device, n, k, kind):
    # K padded (130 -> 192), two column blocks (1100: 1024 + 76), many exceptions ("wide"), none at all
    from glyd.kernels.fixed12.rows import rows

    torch.manual_seed(n + k)
    if kind == "none":  # two binades: every weight inside the 16-exponent window
        w = ((torch.rand(n, k) + 1) * 0.01 * torch.randn(n, k).sign()).to(torch.bfloat16)
    else:
        w = random_weights(n, k, kind)
    if kind == "wide":
        w[:, -1] = 1e-30  # an exception in the last column of every row (a block's last weight)
    p = glyd.pack(w, "fixed12").to(device)
    assert (int(p.arrays["exc_idx"].numel()) > 0) == (kind != "none")
    ids = torch.tensor([0, n - 1, 3, 3, n // 2, 0], dtype=torch.int64, device=device)
    assert torch.equal(_bits(rows(p, ids)), w[ids.cpu()].view(torch.int16))
    assert rows(p, ids[:0]).shape == (0, k)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_ids_are_refused_by_name(device):
    from glyd.kernels.fixed12.rows import rows

    p = glyd.pack(random_weights(4, 64, "normal"), "fixed12").to(device)
    with pytest.raises(ValueError, match="ids must be a 1-D int64 tensor"):
        rows(p, torch.tensor([[0]], device=device))
    with pytest.raises(ValueError, match="ids must be a 1-D int64 tensor"):
        rows(p, torch.tensor([0], dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="expected a fixed12"):
        rows(glyd.pack(random_weights(4, 64, "normal"), "tiered").to(device), torch.tensor([0], device=device))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_op_on_cuda_takes_the_kernel_and_keeps_its_checks(monkeypatch):
    from glyd.kernels.fixed12 import rows as rows_mod

    w = random_weights(300, 200, "wide")
    p = glyd.pack(w, "fixed12").to("cuda")
    emb = glyd.GlydEmbedding(p)
    calls = []
    real = rows_mod.rows
    monkeypatch.setattr(rows_mod, "rows", lambda *a: calls.append(1) or real(*a))
    ids = torch.tensor([[5, 299], [0, 5]], device="cuda")
    got = glyd.ops.rows(p, ids)
    assert calls and got.shape == (2, 2, 200)
    assert torch.equal(_bits(got), w[ids.cpu()].view(torch.int16))
    fids = torch.tensor([7.0, 256.0, 0.0], dtype=torch.bfloat16, device="cuda")  # whole numbers bf16 holds exactly
    assert torch.equal(_bits(glyd.ops.rows(p, fids)), w[[7, 256, 0]].view(torch.int16))  # taken, as elsewhere
    assert torch.equal(_bits(emb(ids)), w[ids.cpu()].view(torch.int16))  # the module's lookup too
    # an id outside the rows: tests/ops/test_rows_checks.py's subprocess (a device-side assert)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_lookup_captured_before_any_eager_call_is_refused_by_name_on_gpu():
    # the exception index is built on the host once a matrix: inside a capture CUDA said only that a
    # sync is not permitted; the error names the cause and the cure
    from glyd.errors import UnsupportedError
    from glyd.kernels.fixed12.rows import rows

    p = glyd.pack(random_weights(300, 128, "wide"), "fixed12").to("cuda")
    ids = torch.tensor([0, 7, 299], device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(UnsupportedError, match="outside the CUDA graph capture"):
        with torch.cuda.graph(graph):
            rows(p, ids)
    want = rows(p, ids)  # a warm-up call, then the capture works
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rows(p, ids)
    ids.copy_(torch.tensor([5, 5, 1], device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), rows(p, ids).view(torch.int16))
    assert not torch.equal(out.view(torch.int16), want.view(torch.int16))
