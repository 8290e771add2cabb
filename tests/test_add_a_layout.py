"""Adding a layout is one entry: a toy 16-bit identity layout, registered here and nowhere else,
goes through pack, unpack, the ops (the twins: it has no kernels), the nn modules, the checkpoint
store and a whole model's save and load, bit for bit (docs/architecture.md, "Adding a layout")."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import glyd
import glyd.ops
from glyd.codec import Layout, Packed, register
from glyd.codec.layout import unregister
from glyd.codec.packed import as_bf16_matrix, check_no_extra, expect_array

NAME = "ident16"


def _pack(w: torch.Tensor) -> Packed:
    w = as_bf16_matrix(w)
    return Packed(NAME, tuple(w.shape), {"bits": w.view(torch.int16).clone()})


def _unpack(p: Packed) -> torch.Tensor:
    return p.arrays["bits"].view(torch.bfloat16).clone()


def _check_arrays(shape: tuple[int, int], arrays: dict[str, torch.Tensor]) -> None:
    check_no_extra(arrays, ("bits",), NAME)
    expect_array(arrays, "bits", torch.int16, shape)


IDENT16 = Layout(name=NAME, arrays=("bits",), pack=_pack, unpack=_unpack, check_arrays=_check_arrays,
                 padded_cols=lambda k: k, padded_array="bits", about="16 bits a weight, the bf16 bits as they are",
                 bits=16.0)


@pytest.fixture
def ident16():
    register(IDENT16)
    try:
        yield NAME
    finally:
        unregister(NAME)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _every_pattern() -> torch.Tensor:
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(256, 256)


def test_pack_unpack_every_pattern(ident16):
    w = _every_pattern()
    p = glyd.pack(w, ident16)
    assert p.layout == ident16 and p.bits_per_weight == 16.0
    assert torch.equal(_bits(glyd.unpack(p)), _bits(w))
    assert torch.equal(_bits(glyd.ops.unpack(p)), _bits(w))
    with pytest.raises(glyd.FormatError, match="bits"):
        Packed(ident16, (2, 3), {"bits": torch.zeros(2, 4, dtype=torch.int16)})


def test_the_ops_and_modules(ident16):
    w = (torch.randn(24, 40) * 0.05).to(torch.bfloat16)
    p = glyd.pack(w, ident16)
    x = torch.randn(3, 40, dtype=torch.bfloat16)
    assert torch.equal(_bits(glyd.ops.linear(x, p)), _bits(F.linear(x, w)))
    idx = torch.tensor([[5, 0], [23, 5]])
    assert torch.equal(_bits(glyd.ops.rows(p, idx)), _bits(w[idx]))
    lin = glyd.GlydLinear(p, exact=True)
    assert torch.equal(_bits(lin(x)), _bits(F.linear(x, w)))
    emb = glyd.GlydEmbedding(p)
    assert torch.equal(_bits(emb(idx)), _bits(w[idx]))
    f = torch.compile(lambda x: glyd.ops.linear(x, p), fullgraph=True, backend="eager")
    assert torch.equal(_bits(f(x)), _bits(F.linear(x, w)))


def test_checkpoint_save_and_load(ident16, tmp_path):
    from glyd.store import CheckpointReader, CheckpointWriter, sha256_tensor

    w = _every_pattern()[:100, :70]
    with CheckpointWriter(tmp_path / "ckpt", layout=ident16) as out:
        out.add_packed("w", glyd.pack(w, ident16), sha256_tensor(w))
    r = CheckpointReader(tmp_path / "ckpt")
    assert r.verify(progress=False)["tensors"] == 1
    back = r.get("w")
    assert back.layout == ident16 and torch.equal(_bits(glyd.unpack(back)), _bits(w))


def test_a_model_saved_and_loaded(ident16, tmp_path):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        want = model(ids).logits
    glyd.compress(model, layout=ident16, exact=True)
    glyd.save_pretrained(model, tmp_path / "m")
    again = glyd.from_pretrained(tmp_path / "m", exact=True, device="cpu", verify=True, progress=False)
    with torch.no_grad():
        got = again(ids).logits
    assert torch.equal(_bits(got), _bits(want))
    assert {m.packed.layout for m in again.modules() if hasattr(m, "packed")} == {ident16}


def test_registering_twice_or_a_bad_entry_is_refused(ident16):
    import dataclasses

    with pytest.raises(ValueError, match="registered already"):
        register(dataclasses.replace(IDENT16))
    with pytest.raises(ValueError, match="padded_array"):
        dataclasses.replace(IDENT16, name="other", padded_array="nope")
    with pytest.raises(ValueError, match="kernel family"):
        dataclasses.replace(IDENT16, name="other", kernels={"gemv": "m:C"})
    register(dataclasses.replace(IDENT16, name="toy", kernels={"toy_x_gemv": "m:C"}))
    try:
        with pytest.raises(ValueError, match="kernel families"):
            register(dataclasses.replace(IDENT16, name="toy_x", kernels={"toy_x_gemv": "m:C"}))
    finally:
        unregister("toy")
    assert "toy" not in glyd.LAYOUTS and "toy_x" not in glyd.LAYOUTS
