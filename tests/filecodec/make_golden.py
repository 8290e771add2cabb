"""Writes tests/data/filecodec_v1/v1.glyd and v1.json: an archive of format version 1 that every
later glyd must still read (CONTRIBUTING.md). Run once per format version:

    .venv/bin/python tests/filecodec/make_golden.py
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

import glyd.filecodec as fc

HERE = Path(__file__).resolve().parents[1] / "data" / "filecodec_v1"


def content(root: Path) -> Path:
    g = torch.Generator().manual_seed(2026)
    d = root / "golden"
    d.mkdir()
    rows = torch.randn(260, 256, generator=g) * torch.logspace(-4, 0, 260)[torch.randperm(260, generator=g)][:, None]
    cols = torch.randn(260, 256, generator=g) * torch.logspace(-4, 0, 256)[torch.randperm(256, generator=g)][None, :]
    w = torch.randn(64, 64, generator=g) * 0.02
    w[::5, ::3] = 0
    table = torch.tensor([2.0**-100, 1.0, -3.0, 2.0**20])[torch.randint(0, 4, (32, 32), generator=g)]
    bits = torch.randint(-(2**15), 2**15, (40, 50), generator=g, dtype=torch.int16).view(torch.bfloat16)
    save_file(
        {
            "rows_bf16": rows.to(torch.bfloat16),
            "cols_bf16": cols.to(torch.bfloat16),
            "zeros_bf16": w.to(torch.bfloat16),
            "table_bf16": table.to(torch.bfloat16),
            "bits_bf16": bits,
            "fp16": w.to(torch.float16),
            "fp32": w,
            "e4m3": (w * 20).to(torch.float8_e4m3fn),
            "e5m2": w.to(torch.float8_e5m2),
            "ids": torch.arange(100),
        },
        str(d / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (d / "README.txt").write_text("golden archive of glyd file codec format 1\n" * 20)
    (d / "empty").write_bytes(b"")
    return d


def main() -> None:
    HERE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        d = content(Path(tmp))
        out = HERE / "v1.glyd"
        out.unlink(missing_ok=True)
        fc.compress_files([d], out, jobs=1)
        hashes = {f"golden/{p.relative_to(d).as_posix()}": hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}
    (HERE / "v1.json").write_text(json.dumps(hashes, indent=1) + "\n")


if __name__ == "__main__":
    main()
