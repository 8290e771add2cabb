"""Re-hashing a packed model or a glyd folder against the sha256 recorded when it was packed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn
from tqdm.auto import tqdm

from glyd.errors import CorruptError, FormatError, show_path
from glyd.hf.experts import packed_tensors, unpack_tensor
from glyd.store import MANIFEST, CheckpointReader, sha256_tensor
from glyd.store._safetensors import sha256_file

__all__ = ["verify"]


def verify_files(folder: Path) -> None:
    """Every file the manifest lists (config, tokenizer, ...) still has its recorded sha256."""
    reader = CheckpointReader(folder)
    for rel, digest in reader.files.items():
        if sha256_file(folder / rel) != digest:
            raise CorruptError(f"{show_path(folder / rel)}: sha256 mismatch with {MANIFEST} (the file was changed or "
                               "damaged)")


def verify_model(model: nn.Module, progress: bool = True) -> dict[str, int]:
    src = model.__dict__.get("_glyd_source")
    where = f"{show_path(src)}: " if src else ""
    if not any(True for _ in packed_tensors(model)):
        raise FormatError(f"{where}the model has no glyd-packed weights: nothing to verify (pack it with "
                          f"glyd.compress or load it with glyd.from_pretrained)")
    counts = {"packed": 0, "raw": 0, "weights": 0}
    for wname, _, p, sha in tqdm(list(packed_tensors(model)), desc="glyd: verify", unit="tensor",
                                 disable=not progress):
        if sha is None:
            raise CorruptError(f"{where}tensor {wname!r}: no sha256 was recorded for it, nothing to verify "
                               "against")
        try:
            w = unpack_tensor(p).cpu()
        except (CorruptError, FormatError, RuntimeError, IndexError, ValueError) as exc:
            raise CorruptError(f"{where}tensor {wname!r}: damaged packed arrays ({exc})") from exc
        if sha256_tensor(w) != sha:
            raise CorruptError(
                f"{where}tensor {wname!r}: sha256 mismatch: the packed arrays do not give back the "
                "original bf16 weights"
            )
        counts["packed"] += 1
        counts["weights"] += w.numel()
    manifest = model.__dict__.get("_glyd_manifest")
    if manifest:
        tensors = manifest.get("tensors", {})
        for wname, _, p, _ in packed_tensors(model):
            _check_arrays(p, tensors.get(wname), f"{where}tensor {wname!r}")
        for name, t in model.state_dict().items():
            e = tensors.get(name)
            if e is None or e.get("kind") != "raw":
                continue
            if sha256_tensor(t.cpu()) != e["sha256"]:
                raise CorruptError(f"{where}tensor {name!r}: sha256 mismatch with {MANIFEST}")
            counts["raw"] += 1
    return counts


def _check_arrays(p: Any, entry: dict[str, Any] | None, what: str) -> None:
    """The module's packed arrays hash to those glyd.json records (for a module loaded from a glyd
    folder): bytes that unpacking ignores (padding, the code of an exception weight) included,
    since a fused kernel may still read them."""
    if not entry or entry.get("kind") != "packed":
        return
    arrays = p.arrays
    for a, spec in entry["arrays"].items():
        if a not in arrays or sha256_tensor(arrays[a].cpu()) != spec["sha256"]:
            raise CorruptError(f"{what}: stored array {a!r} does not match its sha256 in {MANIFEST} (damaged file)")


def verify(model_or_path: nn.Module | str | os.PathLike, *, progress: bool = True) -> dict[str, int]:
    """Re-hash every tensor against the sha256 recorded at packing time; raise
    :class:`glyd.CorruptError` naming the first tensor that does not match. Returns counts.

    A path checks the folder on disk (every shard and copied file); a model checks what it holds.

    >>> glyd.verify("smollm2-glyd")                                       # doctest: +SKIP
    {'tensors': 273, 'packed': 211, 'raw': 62, 'weights': 134515008, 'files': 7}
    """
    if isinstance(model_or_path, (str, os.PathLike)):
        return CheckpointReader(model_or_path).verify(progress=progress)
    if not isinstance(model_or_path, nn.Module):
        raise TypeError(f"verify expects a model or a folder path, got {type(model_or_path).__name__}")
    return verify_model(model_or_path, progress=progress)
