"""Names and the manifest of a packed checkpoint: file and key naming, glyd.json parsing and checks.

Everything here is pure: it reads parsed JSON and names, never the folder (see ``_inventory.py``
for what the folder holds, ``checkpoint.py`` for the reader and the writer).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from glyd._version import __version__
from glyd.codec import LAYOUTS
from glyd.codec.experts import LENS as EXPERTS_LENS
from glyd.errors import FormatError, show_path
from glyd.store._safetensors import MAX_DIMS, dtype_from_name, shape_ok, short

#: The manifest's ``format`` value: what identifies a glyd packed checkpoint.
FORMAT = "glyd-checkpoint"
#: Version of the checkpoint layout (files, keys, manifest fields). Bumped on any incompatible change.
VERSION = 1
#: File name of the manifest inside a checkpoint folder.
MANIFEST = "glyd.json"
#: Base names of a checkpoint's safetensors files: transformers' ``model``, diffusers'
#: ``diffusion_pytorch_model`` (the name each library looks for); one checkpoint uses one of them.
WEIGHT_BASES = ("model", "diffusion_pytorch_model")
#: safetensors file names of a transformers checkpoint (one shard, or several plus the index).
SINGLE_SHARD = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
#: ``__metadata__`` written into every shard.
SHARD_METADATA = {"format": "pt", "glyd": str(VERSION)}
#: glyd.json is JSON text; a bigger one is rejected before it is read (about 500 bytes a tensor).
MAX_MANIFEST_BYTES = 256 * 1024**2
#: Marker in the names of temporary folders (``.DST.<random>.glyd-tmp``) next to a destination.
TMP_SUFFIX = ".glyd-tmp"

#: What joins a packed tensor's name and its array's in a safetensors key (:func:`key_for`).
KEY_SEP = "_glyd_"
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_SHARD_RE = re.compile(r"(model|diffusion_pytorch_model)(-\d{5}-of-\d{5})?\.safetensors")


def key_for(name: str, array: str) -> str:
    """The safetensors key of array ``array`` of the packed tensor ``name``.

    >>> key_for("model.layers.0.mlp.up_proj.weight", "lo")
    'model.layers.0.mlp.up_proj.weight_glyd_lo'
    """
    return f"{name}{KEY_SEP}{array}"


def shard_name(i: int, n: int, base: str = "model") -> str:
    """File name of shard ``i`` (1-based) of ``n``: ``model.safetensors`` when ``n == 1``.

    >>> shard_name(2, 3), shard_name(1, 1, "diffusion_pytorch_model")
    ('model-00002-of-00003.safetensors', 'diffusion_pytorch_model.safetensors')
    """
    return f"{base}.safetensors" if n == 1 else f"{base}-{i:05d}-of-{n:05d}.safetensors"


def index_name(base: str = "model") -> str:
    """File name of the index of a sharded checkpoint whose shards are named after ``base``."""
    return f"{base}.safetensors.index.json"


def shard_base(file: str) -> str | None:
    """The base name (one of :data:`WEIGHT_BASES`) of shard file name ``file``; None if it is not one.

    >>> shard_base("diffusion_pytorch_model-00001-of-00002.safetensors"), shard_base("x.safetensors")
    ('diffusion_pytorch_model', None)
    """
    m = _SHARD_RE.fullmatch(file) if isinstance(file, str) else None
    return None if m is None else m.group(1)


def is_sha(s: object) -> bool:
    return isinstance(s, str) and _SHA_RE.fullmatch(s) is not None


def safe_relpath(name: object) -> str | None:
    """``name`` as a normalised relative POSIX path inside a folder, or None if it could escape it."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        return None
    p = PurePosixPath(name)
    if p.is_absolute() or any(part in ("", ".", "..") for part in p.parts) or name != p.as_posix():
        return None
    if not name.isascii():
        try:  # a lone surrogate that does not map to bytes here ("\ud800" in JSON): no file can have it
            os.fsencode(name)
        except UnicodeError:
            return None
    return p.as_posix()


def reserved(arcname: str) -> bool:
    """Names a copied file may not have: glyd.json, the index and any top-level ``*.safetensors``
    (loaders take every such file for weights)."""
    return arcname in (MANIFEST, *map(index_name, WEIGHT_BASES)) or ("/" not in arcname and arcname.lower().endswith(".safetensors"))


def dump_manifest(manifest: dict[str, Any]) -> str:
    """glyd.json text: plain JSON, one line per tensor and per file so it reads and diffs well."""

    def block(d: dict[str, Any]) -> str:
        if not d:
            return "{}"
        lines = [f"  {json.dumps(k)}: {json.dumps(v, separators=(', ', ': '))}" for k, v in d.items()]
        return "{\n" + ",\n".join(lines) + "\n }"

    parts = []
    for k, v in manifest.items():
        text = block(v) if k in ("tensors", "files") else json.dumps(v)
        parts.append(f" {json.dumps(k)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def entry_bytes(entry: dict[str, Any]) -> int:
    """Bytes the entry's arrays occupy in its shard."""
    if entry["kind"] == "packed":
        specs = entry["arrays"].values()
    else:
        specs = [entry]
    return sum(math.prod(s["shape"]) * dtype_from_name(s["dtype"]).itemsize for s in specs)


# --------------------------------------------------------------------------------------------------
# Reading


def _fail(manifest: Path, field: str, msg: str) -> FormatError:
    return FormatError(f"{manifest}: {field}: {msg}")


def _check_shape(manifest: Path, field: str, shape: object) -> list[int]:
    if not shape_ok(shape):
        raise _fail(manifest, field, f"must be a list of at most {MAX_DIMS} non-negative ints (at most "
                                     f"2**60 elements), got {short(shape)}")
    return shape


def validate_manifest(m: object, where: Path) -> dict[str, Any]:
    """Check every field of a parsed glyd.json; raise FormatError naming the field."""
    if not isinstance(m, dict):
        raise FormatError(f"{show_path(where)}: not a glyd manifest (a JSON object is expected)")
    if m.get("format") != FORMAT:
        raise FormatError(f"{show_path(where)}: not a glyd checkpoint manifest (format {short(m.get('format'))}, "
                          f"expected {FORMAT!r})")
    version = m.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _fail(where, "version", f"must be an int, got {short(version)}")
    if version != VERSION:
        raise FormatError(f"{show_path(where)}: checkpoint format version {short(version)} is not supported "
                          f"(this glyd {__version__} reads version {VERSION})")
    for field in ("glyd_version", "layout"):
        if not isinstance(m.get(field), str):
            raise _fail(where, field, f"missing or not a string ({short(m.get(field))})")
    if m["layout"] not in (*LAYOUTS, "auto"):
        raise _fail(where, "layout", f"unknown layout {short(m['layout'])} (known: {', '.join([*LAYOUTS, 'auto'])})")
    tensors = m.get("tensors")
    if not isinstance(tensors, dict):
        raise _fail(where, "tensors", "missing or not an object")
    if not tensors:
        raise _fail(where, "tensors", "is empty: a checkpoint holds at least one tensor")
    files = m.get("files")
    if not isinstance(files, dict):
        raise _fail(where, "files", "missing or not an object")
    for rel, digest in files.items():
        if safe_relpath(rel) is None or reserved(rel):
            raise _fail(where, f"files[{short(rel)}]", "must be a relative path inside the checkpoint, "
                        "not one of its own files (glyd.json, the index, a top-level *.safetensors)")
        if not is_sha(digest):
            raise _fail(where, f"files[{short(rel)}]", f"sha256 must be 64 lowercase hex digits, got {short(digest)}")
    for name, e in tensors.items():
        _check_entry(where, f"tensors[{short(name)}]", e)
    return m


def _check_entry(where: Path, f: str, e: object) -> None:
    """One tensor entry of glyd.json (``f`` names it in messages)."""
    if not isinstance(e, dict):
        raise _fail(where, f, "must be an object")
    kind = e.get("kind")
    if kind not in ("packed", "raw"):
        raise _fail(where, f"{f}.kind", f"must be 'packed' or 'raw', got {short(kind)}")
    if dtype_from_name(e.get("dtype")) is None:
        raise _fail(where, f"{f}.dtype", f"unknown dtype {short(e.get('dtype'))}")
    _check_shape(where, f"{f}.shape", e.get("shape"))
    if not is_sha(e.get("sha256")):
        raise _fail(where, f"{f}.sha256", f"must be 64 lowercase hex digits, got {short(e.get('sha256'))}")
    file = e.get("file")
    if not isinstance(file, str) or _SHARD_RE.fullmatch(file) is None:
        raise _fail(where, f"{f}.file", "must name a shard (model.safetensors, model-NNNNN-of-NNNNN.safetensors or "
                    f"the same with diffusion_pytorch_model), got {short(file)}")
    if kind == "raw":
        return
    layout = e.get("layout")
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise _fail(where, f"{f}.layout", f"unknown layout {short(layout)} (known: {', '.join(LAYOUTS)})")
    fv = e.get("format_version")
    reads = LAYOUTS[layout].reads
    if isinstance(fv, bool) or fv not in reads:
        raise _fail(where, f"{f}.format_version", f"layout format version {short(fv)} is not supported for {layout} "
                    f"(this glyd reads {', '.join(map(str, reads))})")
    arrays = e.get("arrays")
    if not isinstance(arrays, dict) or not arrays:
        raise _fail(where, f"{f}.arrays", "missing or not an object")
    # A 3-D packed tensor holds experts packed one by one (glyd.codec.experts: its arrays include LENS).
    dims = 3 if EXPERTS_LENS in arrays else 2
    if e["dtype"] != "bfloat16" or len(e["shape"]) != dims:
        what = "3-D bfloat16 experts tensor (it has a 'lens' array)" if dims == 3 else "2-D bfloat16 matrix"
        raise _fail(where, f, f"a packed tensor here is a {what}, got {e['dtype']}{short(e['shape'])}")
    for a, spec in arrays.items():
        af = f"{f}.arrays[{short(a)}]"
        if not isinstance(spec, dict) or dtype_from_name(spec.get("dtype")) is None:
            raise _fail(where, af, f"needs a known dtype, got {short(spec)}")
        _check_shape(where, f"{af}.shape", spec.get("shape"))
        if not is_sha(spec.get("sha256")):
            raise _fail(where, f"{af}.sha256", f"must be 64 lowercase hex digits, got {short(spec.get('sha256'))}")
