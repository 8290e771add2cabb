"""Write the golden packed checkpoints of format version 1 under tests/data/store_v1/ (and, in
``dense11_v2`` and ``dense11_v3``, ones whose matrices are dense11 format versions 2 and 3).

Run once per released format version; the files are committed and must keep loading:

    .venv/bin/python tests/store/make_store_golden.py

Only missing folders are written. A golden of a layout's older format version (``version`` in
``GOLDENS``) is packed by today's ``pack_folder`` with that version's codec in place of
``glyd.pack``'s: the checkpoint around the matrices is today's, the matrices are that version's.

The tensors come from integer arithmetic only (no random generator), so the test can rebuild
them on any machine and compare every bit.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parent / "data" / "store_v1"
#: Every class of special bf16 value: +-0, subnormals, +-inf, quiet/signalling NaNs, max finite, 1.0.
SPECIALS = (0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x7F7F, 0x3F80, 0x0080)


def _bf16(rows: int, cols: int, seed: int, specials: bool = False) -> torch.Tensor:
    """Weight-like bf16 bits from an integer hash: exponents mostly 118..122, a few far ones."""
    out = []
    for i in range(rows * cols):
        u = (i * 2654435761 + seed * 40503 + 12345) & 0xFFFFFFFF
        u ^= u >> 13
        u = (u * 0x5BD1E995) & 0xFFFFFFFF
        u ^= u >> 15
        sign = (u >> 31) & 1
        tail = (u >> 8) & 0xFF
        exp = 122 - min(4, (tail ^ (tail + 1)).bit_length() - 1)  # geometric-like spread
        if (u >> 20) & 0x3F == 0:
            exp = 100 + ((u >> 26) & 0x1F)  # rare far exponents: exceptions / escapes
        out.append((sign << 15) | (exp << 7) | (u & 0x7F))
    if specials:
        for j, s in enumerate(SPECIALS):
            out[(j * 37) % len(out)] = s
    t = torch.tensor([b - 0x10000 if b >= 0x8000 else b for b in out], dtype=torch.int16)
    return t.view(torch.bfloat16).reshape(rows, cols)


def golden_tensors() -> dict[str, torch.Tensor]:
    return {
        "model.embed_tokens.weight": _bf16(12, 40, 1),
        "model.layers.0.mlp.up_proj.weight": _bf16(16, 72, 2, specials=True),
        "model.layers.0.mlp.up_proj.bias": _bf16(1, 16, 3).reshape(16),
        "model.empty.weight": torch.zeros(0, 8, dtype=torch.bfloat16),
        "model.norm.weight": torch.linspace(0.5, 1.5, 40, dtype=torch.float32),
        "model.position_ids": torch.arange(8, dtype=torch.int64),
    }


GOLDEN_CONFIG = {"model_type": "glyd-golden", "hidden_size": 40}
GOLDEN_TOKENIZER = '{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0}}}\n'


def write_source(path: Path, sharded: bool) -> None:
    path.mkdir(parents=True)
    t = golden_tensors()
    if sharded:
        names = list(t)
        parts = [names[:2], names[2:]]
        wm = {}
        for i, part in enumerate(parts, 1):
            f = f"model-{i:05d}-of-{len(parts):05d}.safetensors"
            save_file({k: t[k] for k in part}, str(path / f), metadata={"format": "pt"})
            wm.update(dict.fromkeys(part, f))
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    else:
        save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(GOLDEN_CONFIG))
    (path / "tokenizer.json").write_text(GOLDEN_TOKENIZER)


#: (folder, layout, sharded, format version of its matrices: None for what glyd.pack wrote that day).
#: fixed12 and tiered were written on 2026-11-30; dense11 (its format version 1) joined on 2026-12-02;
#: dense11_v3 (the same checkpoint format, its matrices in dense11 format version 3) on 2026-12-05;
#: dense11_v2 (format version 2, what glyd.pack wrote from 2026-12-04 until version 3) on 2026-12-05 too.
GOLDENS = (
    ("fixed12", "fixed12", False, None),
    ("tiered", "tiered", True, None),
    ("dense11", "dense11", False, None),
    ("dense11_v2", "dense11", False, 2),
    ("dense11_v3", "dense11", False, None),
)


@contextmanager
def _writing_version(layout: str, version: int | None):
    """``pack_folder`` packing ``layout``'s matrices in format ``version`` (None: as glyd.pack does)."""
    if version is None:
        yield
        return
    from glyd.codec import dense11
    from glyd.store import folder

    packers = {("dense11", 1): dense11.pack_v1, ("dense11", 2): dense11.pack_v2, ("dense11", 3): dense11.pack_v3}
    pack_one = packers[layout, version]
    codec_pack = folder.codec_pack

    def pack(t, lay):
        p = pack_one(t) if lay == layout else codec_pack(t, lay)
        assert p.version == version or lay != layout
        return p

    folder.codec_pack = pack
    try:
        yield
    finally:
        folder.codec_pack = codec_pack


def main() -> int:
    from glyd.store import pack_folder

    for name, layout, sharded, version in GOLDENS:
        dst = GOLDEN / name
        if dst.exists():
            print(f"{dst} exists: a released format's golden files are never rewritten; kept", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory() as tmp, _writing_version(layout, version):
            write_source(Path(tmp) / "src", sharded)
            pack_folder(Path(tmp) / "src", dst, layout=layout, progress=False)
        size = sum(p.stat().st_size for p in dst.rglob("*") if p.is_file())
        print(f"wrote {dst} ({size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
