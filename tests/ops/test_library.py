"""The glyd:: torch.library ops: schemas, fake implementations, autograd, torch.compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import glyd
import glyd.ops as ops

from .conftest import random_weights


def _args(p):
    return ops._args(p)


@pytest.mark.parametrize("layout", ["fixed12", "tiered"])
def test_ops_pass_opcheck(layout):
    # schema, fake (meta) implementation, autograd registration and dispatch agree
    p = glyd.pack(random_weights(12, 96), layout)
    layout_, shape, arrays, version = _args(p)
    x = torch.randn(3, 96).to(torch.bfloat16)
    bias = torch.randn(12).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.glyd.linear.default, (x, layout_, shape, arrays, bias, version))
    torch.library.opcheck(torch.ops.glyd.linear.default, (x, layout_, shape, arrays, None, version))
    torch.library.opcheck(torch.ops.glyd.unpack.default, (layout_, shape, arrays, version))
    torch.library.opcheck(torch.ops.glyd.rows.default, (layout_, shape, arrays, version, torch.tensor([[3, 0], [11, 3]])))


def test_fake_shapes_follow_the_inputs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    p = glyd.pack(random_weights(12, 96), "fixed12")
    layout, shape, arrays, version = _args(p)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        x = mode.from_tensor(torch.randn(2, 5, 96).to(torch.bfloat16))
        assert torch.ops.glyd.linear(x, layout, shape, arrays, None, version).shape == (2, 5, 12)
        assert torch.ops.glyd.unpack(layout, shape, arrays, version).shape == (12, 96)
        ids = mode.from_tensor(torch.zeros(4, 7, dtype=torch.int64))
        assert torch.ops.glyd.rows(layout, shape, arrays, version, ids).shape == (4, 7, 96)


@pytest.mark.parametrize("bias", [False, True])
def test_linear_backward_is_the_bf16_layers(bias):
    # d/dx of x @ W^T + b is grad @ W, of b the row sum: the same as the bf16 layer's (fp32 here)
    w = random_weights(12, 96)
    p = glyd.pack(w, "fixed12")
    b = torch.randn(12, requires_grad=True) if bias else None
    x = torch.randn(4, 96, requires_grad=True)
    y = ops.linear(x, p, b)
    g = torch.randn_like(y)
    y.backward(g)
    x2 = x.detach().clone().requires_grad_()
    b2 = b.detach().clone().requires_grad_() if bias else None
    F.linear(x2, w.float(), b2).backward(g)
    assert torch.equal(x.grad, x2.grad)
    if bias:
        assert torch.equal(b.grad, b2.grad)


def test_a_step_of_a_packed_model_compiles_with_fullgraph():
    # torch.compile sees glyd's ops through their fake implementations: no graph break anywhere
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    glyd.compress(model, layout="tiered", progress=False)
    ids = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        eager = model(ids).logits.float()
        torch._dynamo.reset()
        got = torch.compile(model, fullgraph=True)(ids).logits.float()
    # the graph around the ops is inductor's (its fusions may round differently)
    assert (got - eager).abs().max() <= 2e-2 * eager.abs().max()


@pytest.mark.parametrize("shape, match", [([9], r"shape must be the matrix's \[rows, cols\], got \[9\]"),
                                          ([9, 70, 1], "shape must be the matrix's"),
                                          ([-9, 70], "shape must be two non-negative ints")])
def test_ops_refuse_a_shape_that_is_not_rows_cols(shape, match):
    # torch.ops.glyd.unpack("dense11", [9], ...) raised a raw IndexError (shape[1]).
    p = glyd.pack(random_weights(9, 70), "dense11")
    layout, _, arrays, version = _args(p)
    x = torch.randn(2, 70).to(torch.bfloat16)
    for call in (lambda: torch.ops.glyd.unpack(layout, shape, arrays, version),
                 lambda: torch.ops.glyd.rows(layout, shape, arrays, version, torch.tensor([1])),
                 lambda: torch.ops.glyd.linear(x, layout, shape, arrays, None, version)):
        with pytest.raises(glyd.FormatError, match=match):
            call()
    with pytest.raises(glyd.FormatError, match="unknown layout 'zip'"):
        torch.ops.glyd.unpack("zip", [9, 70], arrays, version)
