"""The shard headers against the manifest: every listed tensor and array present once with the
dtype and shape the manifest says, each packed entry's shapes valid for its layout (checked on
shape-only tensors: no data is read), no shard key left unlisted. Used by ``CheckpointReader``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from glyd.codec import Packed, PackedExperts
from glyd.codec.experts import LENS
from glyd.errors import FormatError, show_path
from glyd.store._manifest import MANIFEST, key_for
from glyd.store._safetensors import Header, dtype_from_name


def check_claims(tensors: dict[str, dict[str, Any]], headers: dict[str, Header], files: list[str],
                 mpath: Path) -> dict[str, set[str]]:
    """Each shard's keys that the manifest's entries claim (raises FormatError on any mismatch)."""
    claimed: dict[str, set[str]] = {file: set() for file in files}
    for name, e in tensors.items():
        header = headers[e["file"]]
        if e["kind"] == "packed":
            specs = {key_for(name, a): s for a, s in e["arrays"].items()}
        else:
            specs = {name: e}
        for key, spec in specs.items():
            what = f"{show_path(header.path)}: tensor {name!r}" + (f" (key {key!r})" if key != name else "")
            info = header.tensors.get(key)
            if info is None:
                raise FormatError(f"{what}: listed in {MANIFEST} but absent from the shard")
            if key in claimed[e["file"]]:
                raise FormatError(f"{what}: key claimed by two manifest entries")
            claimed[e["file"]].add(key)
            if info.dtype != spec["dtype"] or list(info.shape) != spec["shape"]:
                raise FormatError(
                    f"{what}: the shard holds {info.dtype}{list(info.shape)} but {MANIFEST} says "
                    f"{spec['dtype']}{spec['shape']}"
                )
        if e["kind"] == "packed":
            # The layout's own shape rules, checked on shape-only tensors: no data is read.
            meta = {
                a: torch.empty(s["shape"], dtype=dtype_from_name(s["dtype"]), device="meta")
                for a, s in e["arrays"].items()
            }
            try:
                kind = PackedExperts if LENS in meta else Packed
                kind(e["layout"], tuple(e["shape"]), meta, e["format_version"])
            except (FormatError, ValueError, TypeError, KeyError, IndexError, RuntimeError) as exc:
                raise FormatError(f"{show_path(mpath)}: tensor {name!r} ({e['file']}): {exc}") from exc
    for file, header in headers.items():
        extra = sorted(set(header.tensors) - claimed[file])
        if extra:
            raise FormatError(f"{show_path(header.path)}: holds tensor(s) {MANIFEST} does not list: "
                              f"{', '.join(extra[:5])}")
    return claimed
