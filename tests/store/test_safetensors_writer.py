"""glyd.store._safetensors.write_streaming: one tensor in memory at a time, same bytes as save_file."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from glyd.errors import FormatError
from glyd.store._safetensors import dtype_name, write_streaming

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.float8_e5m2, torch.float8_e4m3fn, torch.int16,
          torch.uint16, torch.float16, torch.bfloat16, torch.int32, torch.uint32, torch.float32, torch.float64,
          torch.int64, torch.uint64]


def _random(dtype: torch.dtype, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    raw = torch.randint(0, 256, (max(1, torch.Size(shape).numel()) * torch.empty(0, dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=g)
    return raw.view(dtype)[: torch.Size(shape).numel()].reshape(shape).clone()


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_same_bytes_as_save_file(tmp_path, metadata):
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i, dt in enumerate(DTYPES):
        for j, shape in enumerate([(3, 5), (0,), (7,)]):
            tensors[f"layer.{(i * 7 + j * 3) % 11}.{dtype_name(dt)}.{j}"] = _random(dt, shape, g)
    ref = tmp_path / "ref.safetensors"
    save_file(tensors, str(ref), metadata=metadata)
    out = tmp_path / "out.safetensors"
    asked = []

    def produce(name):
        asked.append(name)
        return tensors[name]

    write_streaming(out, {k: (dtype_name(v.dtype), list(v.shape)) for k, v in tensors.items()}, produce, metadata)
    assert out.read_bytes() == ref.read_bytes()
    assert sorted(asked) == sorted(tensors) and len(asked) == len(tensors)
    back = load_file(str(out))
    assert all(torch.equal(back[k].view(torch.uint8), tensors[k].view(torch.uint8)) for k in tensors)


def test_empty_file_matches(tmp_path):
    save_file({}, str(tmp_path / "a"), metadata={"format": "pt"})
    write_streaming(tmp_path / "b", {}, lambda name: None, {"format": "pt"})
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def test_a_tensor_unlike_its_spec_is_refused(tmp_path):
    with pytest.raises(FormatError, match="'w'.*header says bfloat16\\[2, 3\\]"):
        write_streaming(tmp_path / "x", {"w": ("bfloat16", [2, 3])}, lambda name: torch.zeros(3, 2, dtype=torch.bfloat16))
    with pytest.raises(FormatError, match="cannot be stored"):
        write_streaming(tmp_path / "y", {"w": ("complex128", [2])}, lambda name: torch.zeros(2, dtype=torch.complex128))
