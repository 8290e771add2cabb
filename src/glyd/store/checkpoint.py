"""The packed checkpoint: safetensors shards of packed arrays plus a ``glyd.json`` manifest.

A packed tensor ``name`` is stored as one safetensors tensor per array of its layout, under the key
``f"{name}_glyd_{array}"`` (see :func:`key_for`); any other tensor is stored as is under its own
name. ``glyd.json`` records, for every tensor, its original dtype, true shape and the sha256 of
its original bytes, so :meth:`CheckpointReader.verify` can prove every bit comes back. The byte-level
description is in ``docs/format.md`` ("Packed checkpoints").

>>> import tempfile, torch, glyd
>>> from glyd.store import CheckpointWriter, CheckpointReader, sha256_tensor
>>> w = torch.randn(16, 32).to(torch.bfloat16)
>>> dst = tempfile.mkdtemp() + "/ckpt"
>>> with CheckpointWriter(dst, layout="fixed12") as out:
...     out.add_packed("fc.weight", glyd.pack(w), sha256_tensor(w))
...     out.add_tensor("fc.bias", torch.zeros(16))
>>> r = CheckpointReader(dst)
>>> r.names(), r.is_packed("fc.weight")
(['fc.weight', 'fc.bias'], True)
>>> torch.equal(glyd.unpack(r.get("fc.weight")).view(torch.int16), w.view(torch.int16))
True
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
import weakref
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from glyd._version import __version__
from glyd.codec import LAYOUTS, Packed, unpack
from glyd.codec.packed import FORMAT_VERSION as CODEC_FORMAT_VERSION
from glyd.errors import CorruptError, DestinationExistsError, FormatError
from glyd.store._safetensors import (
    Header,
    dtype_from_name,
    dtype_name,
    read_header,
    sha256_file,
    sha256_tensor,
)

log = logging.getLogger(__name__)

#: The manifest's ``format`` value: what identifies a glyd packed checkpoint.
FORMAT = "glyd-checkpoint"
#: Version of the checkpoint layout (files, keys, manifest fields). Bumped on any incompatible change.
VERSION = 1
#: File name of the manifest inside a checkpoint folder.
MANIFEST = "glyd.json"
#: safetensors file names of a checkpoint (one shard, or several plus the index).
SINGLE_SHARD = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
#: ``__metadata__`` written into every shard.
SHARD_METADATA = {"format": "pt", "glyd": str(VERSION)}
#: glyd.json is JSON text; a bigger one is rejected before it is read (about 500 bytes a tensor).
MAX_MANIFEST_BYTES = 256 * 1024**2
#: Marker in the names of temporary folders (``.DST.<random>.glyd-tmp``) next to a destination.
TMP_SUFFIX = ".glyd-tmp"

_KEY_SEP = "_glyd_"
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_SHARD_RE = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors")

__all__ = [
    "FORMAT",
    "VERSION",
    "MANIFEST",
    "CheckpointWriter",
    "CheckpointReader",
    "key_for",
    "sha256_tensor",
]


def key_for(name: str, array: str) -> str:
    """The safetensors key of array ``array`` of the packed tensor ``name``.

    >>> key_for("model.layers.0.mlp.up_proj.weight", "lo")
    'model.layers.0.mlp.up_proj.weight_glyd_lo'
    """
    return f"{name}{_KEY_SEP}{array}"


def shard_name(i: int, n: int) -> str:
    """File name of shard ``i`` (1-based) of ``n``: ``model.safetensors`` when ``n == 1``."""
    return SINGLE_SHARD if n == 1 else f"model-{i:05d}-of-{n:05d}.safetensors"


def _is_sha(s: object) -> bool:
    return isinstance(s, str) and _SHA_RE.fullmatch(s) is not None


def _safe_relpath(name: object) -> str | None:
    """``name`` as a normalised relative POSIX path inside a folder, or None if it could escape it."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        return None
    p = PurePosixPath(name)
    if p.is_absolute() or any(part in ("", ".", "..") for part in p.parts) or name != p.as_posix():
        return None
    return p.as_posix()


def _reserved(arcname: str) -> bool:
    return arcname in (MANIFEST, INDEX) or _SHARD_RE.fullmatch(arcname) is not None


# --------------------------------------------------------------------------------------------------
# Writing into a temporary folder that becomes the destination only when complete


def check_destination(dst: Path, overwrite: bool) -> None:
    """Raise DestinationExistsError unless ``dst`` may be written (``overwrite`` replaces only a
    glyd checkpoint or an empty folder: never anything else)."""
    if not (dst.exists() or dst.is_symlink()):
        return
    if not overwrite:
        raise DestinationExistsError(f"{dst} already exists; glyd never overwrites (remove it or choose another name)")
    if dst.is_symlink() or not dst.is_dir() or not ((dst / MANIFEST).is_file() or not any(dst.iterdir())):
        raise DestinationExistsError(f"{dst} exists and is not a glyd checkpoint or an empty folder: refusing to replace it")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class AtomicDir:
    """A temporary sibling folder of ``dst`` that is renamed to ``dst`` by :meth:`commit` and
    removed by :meth:`abort` (or when the object is garbage-collected without a commit)."""

    def __init__(self, dst: str | os.PathLike, overwrite: bool = False):
        self.dst = Path(dst).absolute()
        self.overwrite = overwrite
        check_destination(self.dst, overwrite)
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.dst.name}.", suffix=TMP_SUFFIX, dir=self.dst.parent))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.tmp), True)
        self.done = False

    def commit(self) -> Path:
        check_destination(self.dst, self.overwrite)
        # mkdtemp and safetensors create owner-only entries: give the result the usual umask modes.
        umask = _umask()
        for root, dirs, files in os.walk(self.tmp):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o777 & ~umask)
            for f in files:
                os.chmod(os.path.join(root, f), 0o666 & ~umask)
        os.chmod(self.tmp, 0o777 & ~umask)
        old = None
        if self.dst.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{self.dst.name}.", suffix=".glyd-old", dir=self.dst.parent))
            os.rename(self.dst, old / "old")
        try:
            os.rename(self.tmp, self.dst)
        except BaseException:
            if old is not None:
                os.rename(old / "old", self.dst)
                shutil.rmtree(old, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._cleanup.detach()
        self.done = True
        return self.dst

    def abort(self) -> None:
        self._cleanup()
        self.done = True


def copy_hashed(src: str | os.PathLike, dst: Path, chunk: int = 1 << 20) -> str:
    """Copy ``src`` to ``dst`` and return the sha256 of the bytes copied."""
    h = hashlib.sha256()
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while block := fi.read(chunk):
            h.update(block)
            fo.write(block)
    return h.hexdigest()


def _cpu_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU, contiguous, owning exactly its bytes (safetensors refuses shared storage)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size() or t.storage_offset():
        t = t.clone()
    return t


class CheckpointWriter:
    """Write a packed checkpoint folder; it appears at ``dst`` only when :meth:`close` succeeds.

    Use it as a context manager: on an exception the temporary folder is removed and nothing is
    left at ``dst``. Tensors are buffered until a shard reaches ``max_shard_bytes`` (a tensor's
    arrays never straddle two shards), so memory holds at most one shard.

    >>> import tempfile, torch, glyd
    >>> w = torch.ones(4, 4, dtype=torch.bfloat16)
    >>> with CheckpointWriter(tempfile.mkdtemp() + "/out", layout="tiered") as ckpt:
    ...     ckpt.add_packed("w", glyd.pack(w, "tiered"), sha256_tensor(w))
    ...     ckpt.set_config({"model_type": "demo"})
    """

    def __init__(
        self,
        dst: str | os.PathLike,
        *,
        layout: str,
        max_shard_bytes: int = 2 * 1024**3,
        overwrite: bool = False,
    ):
        if layout not in LAYOUTS and layout != "auto":
            raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join([*LAYOUTS, 'auto'])}")
        if not isinstance(max_shard_bytes, int) or isinstance(max_shard_bytes, bool) or max_shard_bytes <= 0:
            raise ValueError(f"max_shard_bytes must be a positive int, got {max_shard_bytes!r}")
        self.layout = layout
        self.max_shard_bytes = max_shard_bytes
        self._dir = AtomicDir(dst, overwrite)
        self.path = self._dir.dst
        self._tensors: dict[str, dict[str, Any]] = {}
        self._keys: dict[str, str] = {}  # safetensors key -> tensor name
        self._files: dict[str, str] = {}  # arcname -> sha256
        self._buf: dict[str, torch.Tensor] = {}
        self._buf_names: list[str] = []
        self._buf_bytes = 0
        self._shards: list[tuple[Path, list[str]]] = []  # (temporary path, tensor names)
        self._closed = False

    # -- context manager ---------------------------------------------------------------------------
    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"checkpoint writer for {self.path} is closed")

    def _check_name(self, name: object) -> str:
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor name must be a non-empty str, got {name!r}")
        if name in self._tensors:
            raise ValueError(f"tensor {name!r} was already added")
        return name

    def _claim(self, name: str, keys: list[str]) -> None:
        for k in keys:
            if k in self._keys:
                raise ValueError(f"tensor {name!r}: safetensors key {k!r} collides with tensor {self._keys[k]!r}")
        for k in keys:
            self._keys[k] = name

    # -- tensors -----------------------------------------------------------------------------------
    def add_packed(self, name: str, packed: Packed, sha256: str) -> None:
        """Add a packed matrix; ``sha256`` is :func:`sha256_tensor` of the original bf16 matrix."""
        self._check_open()
        self._check_name(name)
        if not isinstance(packed, Packed):
            raise TypeError(f"tensor {name!r}: add_packed expects a glyd.Packed, got {type(packed).__name__}")
        if not _is_sha(sha256):
            raise ValueError(f"tensor {name!r}: sha256 must be 64 lowercase hex digits, got {sha256!r}")
        order = [a for a in LAYOUTS[packed.layout].ARRAYS if a in packed.arrays]
        arrays = {a: _cpu_tensor(packed.arrays[a]) for a in order}
        keys = [key_for(name, a) for a in order]
        self._claim(name, keys)
        entry = {
            "kind": "packed",
            "dtype": "bfloat16",
            "shape": list(packed.shape),
            "sha256": sha256,
            "file": None,
            "layout": packed.layout,
            "format_version": packed.version,
            # Each array's own hash catches changes to bytes the decoder ignores (padding, the code
            # of an exception weight, unused table entries) that the original's hash cannot see.
            "arrays": {
                a: {"dtype": dtype_name(t.dtype), "shape": list(t.shape), "sha256": sha256_tensor(t)}
                for a, t in arrays.items()
            },
        }
        self._put(name, entry, {key_for(name, a): t for a, t in arrays.items()})

    def add_tensor(self, name: str, tensor: torch.Tensor, sha256: str | None = None) -> None:
        """Add a tensor kept as it is (any dtype and shape)."""
        self._check_open()
        self._check_name(name)
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor {name!r}: add_tensor expects a torch.Tensor, got {type(tensor).__name__}")
        if dtype_from_name(dtype_name(tensor.dtype)) is None:
            raise FormatError(f"tensor {name!r}: dtype {tensor.dtype} cannot be stored in safetensors")
        t = _cpu_tensor(tensor)
        digest = sha256_tensor(t)
        if sha256 is not None and sha256 != digest:
            raise CorruptError(f"tensor {name!r}: sha256 given ({sha256}) is not the tensor's ({digest})")
        self._claim(name, [name])
        entry = {"kind": "raw", "dtype": dtype_name(t.dtype), "shape": list(t.shape), "sha256": digest, "file": None}
        self._put(name, entry, {name: t})

    def _put(self, name: str, entry: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        if self._buf and self._buf_bytes + nbytes > self.max_shard_bytes:
            self.flush()
        self._tensors[name] = entry
        self._buf.update(tensors)
        self._buf_names.append(name)
        self._buf_bytes += nbytes

    def flush(self) -> None:
        """End the current shard: write the buffered tensors to disk (the next tensor starts a new one)."""
        self._check_open()
        if not self._buf and self._shards:
            return
        path = self._dir.tmp / f".shard-{len(self._shards) + 1:05d}.safetensors"
        save_file(self._buf, str(path), metadata=SHARD_METADATA)
        self._shards.append((path, self._buf_names))
        self._buf, self._buf_names, self._buf_bytes = {}, [], 0

    # -- other files -------------------------------------------------------------------------------
    def _arcname(self, arcname: object) -> str:
        rel = _safe_relpath(arcname)
        if rel is None:
            raise ValueError(f"file name {arcname!r} must be a relative path inside the checkpoint")
        if _reserved(rel):
            raise ValueError(f"file name {rel!r} is reserved for the checkpoint's own files")
        if rel in self._files:
            raise ValueError(f"file {rel!r} was already added")
        return rel

    def add_file(self, path: str | os.PathLike, arcname: str | None = None) -> None:
        """Copy a file (tokenizer, generation config, ...) verbatim into the checkpoint as ``arcname``."""
        self._check_open()
        src = Path(path)
        rel = self._arcname(src.name if arcname is None else arcname)
        if not src.is_file():
            raise FormatError(f"{src}: not a file")
        self._files[rel] = copy_hashed(src, self._dir.tmp / rel)

    def set_config(self, config: dict[str, Any]) -> None:
        """Write ``config`` as the checkpoint's config.json (transformers' spelling: indent 2, sorted keys)."""
        self._check_open()
        if not isinstance(config, dict):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        rel = self._arcname(CONFIG)
        data = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8")
        (self._dir.tmp / rel).write_bytes(data)
        self._files[rel] = hashlib.sha256(data).hexdigest()

    # -- finishing ---------------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        """The manifest as it will be written (``file`` fields are set at close)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "glyd_version": __version__,
            "layout": self.layout,
            "tensors": copy.deepcopy(self._tensors),
            "files": dict(self._files),
        }

    def close(self) -> Path:
        """Write the remaining shard, the index and glyd.json, then move the folder to ``dst``."""
        if self._closed:
            return self.path
        try:
            if self._buf or not self._shards:
                self.flush()
            n = len(self._shards)
            weight_map: dict[str, str] = {}
            total = 0
            for i, (tmp_path, names) in enumerate(self._shards, 1):
                final = shard_name(i, n)
                os.rename(tmp_path, self._dir.tmp / final)
                for name in names:
                    entry = self._tensors[name]
                    entry["file"] = final
                    keys = [key_for(name, a) for a in entry["arrays"]] if entry["kind"] == "packed" else [name]
                    for k in keys:
                        weight_map[k] = final
                    total += _entry_bytes(entry)
            if n > 1:
                index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
                (self._dir.tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
            manifest = self.manifest()
            (self._dir.tmp / MANIFEST).write_text(dump_manifest(manifest), encoding="utf-8")
            path = self._dir.commit()
        except BaseException:
            self.abort()
            raise
        self._closed = True
        log.debug("wrote %s: %d tensors in %d shard(s)", path, len(self._tensors), n)
        return path

    def abort(self) -> None:
        """Discard everything written so far; nothing is left on disk."""
        self._dir.abort()
        self._closed = True
        self._buf = {}


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


def _entry_bytes(entry: dict[str, Any]) -> int:
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
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise _fail(manifest, field, f"must be a list of non-negative ints, got {shape!r}")
    return shape


def _validate_manifest(m: object, where: Path) -> dict[str, Any]:
    """Check every field of a parsed glyd.json; raise FormatError naming the field."""
    if not isinstance(m, dict):
        raise FormatError(f"{where}: not a glyd manifest (a JSON object is expected)")
    if m.get("format") != FORMAT:
        raise FormatError(f"{where}: not a glyd checkpoint manifest (format {m.get('format')!r}, expected {FORMAT!r})")
    version = m.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _fail(where, "version", f"must be an int, got {version!r}")
    if version != VERSION:
        raise FormatError(
            f"{where}: checkpoint format version {version} is not supported (this glyd {__version__} reads version {VERSION})"
        )
    for field in ("glyd_version", "layout"):
        if not isinstance(m.get(field), str):
            raise _fail(where, field, f"missing or not a string ({m.get(field)!r})")
    tensors = m.get("tensors")
    if not isinstance(tensors, dict):
        raise _fail(where, "tensors", "missing or not an object")
    files = m.get("files")
    if not isinstance(files, dict):
        raise _fail(where, "files", "missing or not an object")
    for rel, digest in files.items():
        if _safe_relpath(rel) is None or _reserved(rel):
            raise _fail(where, f"files[{rel!r}]", "must be a relative path inside the checkpoint (not a shard)")
        if not _is_sha(digest):
            raise _fail(where, f"files[{rel!r}]", f"sha256 must be 64 lowercase hex digits, got {digest!r}")
    for name, e in tensors.items():
        f = f"tensors[{name!r}]"
        if not isinstance(e, dict):
            raise _fail(where, f, "must be an object")
        kind = e.get("kind")
        if kind not in ("packed", "raw"):
            raise _fail(where, f"{f}.kind", f"must be 'packed' or 'raw', got {kind!r}")
        if dtype_from_name(e.get("dtype")) is None:
            raise _fail(where, f"{f}.dtype", f"unknown dtype {e.get('dtype')!r}")
        _check_shape(where, f"{f}.shape", e.get("shape"))
        if not _is_sha(e.get("sha256")):
            raise _fail(where, f"{f}.sha256", f"must be 64 lowercase hex digits, got {e.get('sha256')!r}")
        file = e.get("file")
        if not isinstance(file, str) or _SHARD_RE.fullmatch(file) is None:
            raise _fail(where, f"{f}.file", f"must name a shard (model.safetensors or model-NNNNN-of-NNNNN.safetensors), got {file!r}")
        if kind == "raw":
            continue
        layout = e.get("layout")
        if layout not in LAYOUTS:
            raise _fail(where, f"{f}.layout", f"unknown layout {layout!r} (known: {', '.join(LAYOUTS)})")
        fv = e.get("format_version")
        if fv != CODEC_FORMAT_VERSION or isinstance(fv, bool):
            raise _fail(where, f"{f}.format_version", f"layout format version {fv!r} is not supported (this glyd reads {CODEC_FORMAT_VERSION})")
        if e["dtype"] != "bfloat16" or len(e["shape"]) != 2:
            raise _fail(where, f, f"a packed tensor is a 2-D bfloat16 matrix, got {e['dtype']}{e['shape']}")
        arrays = e.get("arrays")
        if not isinstance(arrays, dict) or not arrays:
            raise _fail(where, f"{f}.arrays", "missing or not an object")
        for a, spec in arrays.items():
            if not isinstance(spec, dict) or dtype_from_name(spec.get("dtype")) is None:
                raise _fail(where, f"{f}.arrays[{a!r}]", f"needs a known dtype, got {spec!r}")
            _check_shape(where, f"{f}.arrays[{a!r}].shape", spec.get("shape"))
            if not _is_sha(spec.get("sha256")):
                raise _fail(where, f"{f}.arrays[{a!r}].sha256", f"must be 64 lowercase hex digits, got {spec.get('sha256')!r}")
    return m


class CheckpointReader:
    """Open a packed checkpoint folder, checking its manifest against the shard headers.

    Opening reads only glyd.json and the safetensors headers; :meth:`get` reads one tensor's arrays;
    :meth:`verify` unpacks everything and checks every sha256.

    >>> import tempfile, torch
    >>> d = tempfile.mkdtemp() + "/c"
    >>> with CheckpointWriter(d, layout="fixed12") as w:
    ...     w.add_tensor("scale", torch.tensor([1.5]))
    >>> CheckpointReader(d).get("scale")
    tensor([1.5000])
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise FormatError(f"{self.path}: no such checkpoint folder")
        if not self.path.is_dir():
            raise FormatError(f"{self.path}: not a folder (a glyd checkpoint is a folder with {MANIFEST})")
        mpath = self.path / MANIFEST
        if not mpath.is_file():
            raise FormatError(f"{self.path}: not a glyd packed checkpoint (no {MANIFEST})")
        size = mpath.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise FormatError(f"{mpath}: {size} bytes is larger than any manifest glyd writes")
        try:
            manifest = json.loads(mpath.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"{mpath}: not valid JSON ({exc})") from exc
        self._manifest = _validate_manifest(manifest, mpath)
        self._tensors: dict[str, dict[str, Any]] = self._manifest["tensors"]
        self._headers: dict[str, Header] = {}
        self._handles: dict[tuple[str, str], Any] = {}
        self._config: dict[str, Any] | None = None
        self._check_shards(mpath)
        self._check_files(mpath)

    def _check_shards(self, mpath: Path) -> None:
        files = sorted({e["file"] for e in self._tensors.values()})
        for file in files:
            p = self.path / file
            if not p.is_file():
                raise CorruptError(f"{p}: shard listed in {MANIFEST} is missing")
            self._headers[file] = read_header(p)
        claimed: dict[str, set[str]] = {file: set() for file in files}
        for name, e in self._tensors.items():
            header = self._headers[e["file"]]
            if e["kind"] == "packed":
                specs = {key_for(name, a): s for a, s in e["arrays"].items()}
            else:
                specs = {name: e}
            for key, spec in specs.items():
                what = f"{header.path}: tensor {name!r}" + (f" (key {key!r})" if key != name else "")
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
                    Packed(e["layout"], tuple(e["shape"]), meta, e["format_version"])
                except FormatError as exc:
                    raise FormatError(f"{mpath}: tensor {name!r} ({e['file']}): {exc}") from exc
        for file, header in self._headers.items():
            extra = sorted(set(header.tensors) - claimed[file])
            if extra:
                raise FormatError(f"{header.path}: holds tensor(s) {MANIFEST} does not list: {', '.join(extra[:5])}")
        index = self.path / INDEX
        if index.is_file():
            try:
                wm = json.loads(index.read_bytes().decode("utf-8"))["weight_map"]
                if not isinstance(wm, dict):
                    raise TypeError
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
                raise FormatError(f"{index}: not a safetensors index (JSON with a weight_map)") from exc
            for file, keys in claimed.items():
                for key in keys:
                    if wm.get(key) != file:
                        raise FormatError(f"{index}: maps {key!r} to {wm.get(key)!r} but it is in {file}")

    def _check_files(self, mpath: Path) -> None:
        for rel in self._manifest["files"]:
            if not (self.path / rel).is_file():
                raise CorruptError(f"{self.path / rel}: file listed in {MANIFEST} is missing")

    # -- manifest ----------------------------------------------------------------------------------
    @property
    def manifest(self) -> dict[str, Any]:
        """A copy of the parsed, validated glyd.json."""
        return copy.deepcopy(self._manifest)

    @property
    def layout(self) -> str:
        """The layout the checkpoint was packed with (``"auto"`` when chosen per matrix)."""
        return self._manifest["layout"]

    @property
    def files(self) -> dict[str, str]:
        """Copied files (config, tokenizer, ...) -> sha256."""
        return dict(self._manifest["files"])

    def names(self) -> list[str]:
        """Tensor names in the order they were written."""
        return list(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def entry(self, name: str) -> dict[str, Any]:
        """The manifest entry of tensor ``name`` (kind, dtype, shape, sha256, file, layout, arrays)."""
        return copy.deepcopy(self._entry(name))

    def _entry(self, name: str) -> dict[str, Any]:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor {name!r} in the checkpoint") from None

    def is_packed(self, name: str) -> bool:
        return self._entry(name)["kind"] == "packed"

    @property
    def config(self) -> dict[str, Any] | None:
        """config.json as a dict, or None when the checkpoint has none."""
        if self._config is None:
            p = self.path / CONFIG
            if not p.is_file():
                return None
            try:
                cfg = json.loads(p.read_bytes().decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise FormatError(f"{p}: not valid JSON ({exc})") from exc
            if not isinstance(cfg, dict):
                raise FormatError(f"{p}: not a JSON object")
            self._config = cfg
        return copy.deepcopy(self._config)

    # -- tensors -----------------------------------------------------------------------------------
    def _open(self, file: str, device: str) -> Any:
        h = self._handles.get((file, device))
        if h is None:
            h = safe_open(str(self.path / file), framework="pt", device=device)
            self._handles[(file, device)] = h
        return h

    def get(self, name: str, device: str | torch.device = "cpu") -> Packed | torch.Tensor:
        """Tensor ``name``: a :class:`glyd.Packed` if it is packed, else the tensor as stored.

        Only that tensor's arrays are read (memory-mapped through ``safetensors.safe_open``).
        """
        e = self._entry(name)
        dev = str(torch.device(device))
        f = self._open(e["file"], dev)
        try:
            if e["kind"] == "raw":
                return f.get_tensor(name)
            arrays = {a: f.get_tensor(key_for(name, a)) for a in e["arrays"]}
        except Exception as exc:  # safetensors raises its own error types for damaged files
            raise CorruptError(f"{self.path / e['file']}: tensor {name!r}: cannot read: {exc}") from exc
        return Packed(e["layout"], tuple(e["shape"]), arrays, e["format_version"])

    def get_original(self, name: str) -> torch.Tensor:
        """Tensor ``name`` as it was before packing (bf16 for packed tensors), on the CPU, unverified."""
        t = self.get(name)
        return self._unpack(name, t) if isinstance(t, Packed) else t

    def _unpack(self, name: str, t: Packed) -> torch.Tensor:
        where = f"{self.path / self._entry(name)['file']}: tensor {name!r}"
        try:
            return unpack(t)
        except (CorruptError, FormatError) as exc:
            raise CorruptError(f"{where}: {exc}") from exc
        except (RuntimeError, IndexError, ValueError) as exc:  # damaged arrays the codec did not foresee
            raise CorruptError(f"{where}: damaged arrays ({exc})") from exc

    def check_tensor(self, name: str, t: torch.Tensor) -> None:
        """Raise CorruptError unless ``t`` (an original tensor) hashes to the manifest's sha256."""
        e = self._entry(name)
        if dtype_name(t.dtype) != e["dtype"] or list(t.shape) != e["shape"]:
            raise CorruptError(
                f"{self.path / e['file']}: tensor {name!r}: unpacked to {dtype_name(t.dtype)}{list(t.shape)}, "
                f"expected {e['dtype']}{e['shape']}"
            )
        if sha256_tensor(t) != e["sha256"]:
            raise CorruptError(
                f"{self.path / e['file']}: tensor {name!r}: sha256 mismatch: the stored data does not give back "
                f"the original tensor (damaged file or wrong manifest)"
            )

    def check_arrays(self, name: str, packed: Packed) -> None:
        """Raise CorruptError unless every stored array of packed tensor ``name`` hashes to the manifest."""
        e = self._entry(name)
        for a, spec in e["arrays"].items():
            if sha256_tensor(packed.arrays[a]) != spec["sha256"]:
                raise CorruptError(
                    f"{self.path / e['file']}: tensor {name!r}: stored array {a!r} (key {key_for(name, a)!r}) "
                    f"does not match its sha256 in {MANIFEST} (damaged file)"
                )

    def verify(self, progress: bool = True) -> dict[str, int]:
        """Check every stored array's sha256, unpack every tensor and check the original's sha256,
        then every copied file's; raise CorruptError on the first mismatch, naming the tensor or
        file. Returns counts of what was checked."""
        counts = {"tensors": 0, "packed": 0, "raw": 0, "weights": 0, "files": 0}
        for name in tqdm(self.names(), desc="verify", unit="tensor", disable=not progress, leave=False):
            t = self.get(name)
            if isinstance(t, Packed):
                self.check_arrays(name, t)
                t = self._unpack(name, t)
            self.check_tensor(name, t)
            counts["tensors"] += 1
            counts["packed" if self.is_packed(name) else "raw"] += 1
            counts["weights"] += t.numel()
        for rel, digest in self._manifest["files"].items():
            if sha256_file(self.path / rel) != digest:
                raise CorruptError(f"{self.path / rel}: sha256 mismatch with {MANIFEST} (the file was changed or damaged)")
            counts["files"] += 1
        return counts

    def __repr__(self) -> str:
        return f"CheckpointReader({str(self.path)!r}: {len(self)} tensors, layout {self.layout!r})"
