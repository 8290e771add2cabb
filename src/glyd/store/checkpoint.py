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
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from glyd._version import __version__
from glyd.codec import LAYOUTS, Packed, PackedExperts, unpack, unpack_experts
from glyd.codec.experts import LENS, array_names
from glyd.errors import CorruptError, FormatError, not_a_file, show_path
from glyd.store._config import LOADER_CLASS, LOADER_FILE, LOADER_SOURCE
from glyd.store._atomic import AtomicDir, check_destination, copy_hashed  # noqa: F401 - re-exported
from glyd.store._card import card_name, card_text
from glyd.store._claims import check_claims
from glyd.store._inventory import check_index, check_shard_names, check_unlisted
from glyd.store._manifest import (  # noqa: F401 - the names are part of this module's interface
    CONFIG,
    FORMAT,
    INDEX,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    SHARD_METADATA,
    SINGLE_SHARD,
    VERSION,
    WEIGHT_BASES,
    dump_manifest,
    entry_bytes,
    index_name,
    is_sha,
    key_for,
    reserved,
    safe_relpath,
    shard_name,
    validate_manifest,
)
from glyd.store._safetensors import (
    MAX_JSON_FILE_BYTES,
    Header,
    check_write_order,
    dtype_from_name,
    dtype_name,
    load_json,
    read_header,
    read_json_bytes,
    sha256_file,
    sha256_tensor,
    short,
    write_streaming,
)

log = logging.getLogger(__name__)


__all__ = [
    "FORMAT",
    "VERSION",
    "MANIFEST",
    "CheckpointWriter",
    "CheckpointReader",
    "key_for",
    "sha256_tensor",
]


_NOT_A_FILE = ", not a regular file (glyd reads no pipe or device: it could block or never end)"


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
    arrays never straddle two shards), so memory holds at most one shard. The folder gets a model
    card (``README.md``, ``glyd.store._card``: documentation the manifest does not list) named
    after ``title`` (default: the config's ``_name_or_path``, else the folder's name).

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
        weights_name: str = "model",
        title: str | None = None,
    ):
        if layout not in LAYOUTS and layout != "auto":
            raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join([*LAYOUTS, 'auto'])}")
        if weights_name not in WEIGHT_BASES:
            raise ValueError(f"weights_name must be one of {', '.join(WEIGHT_BASES)}, got {weights_name!r}")
        self.weights_name = weights_name
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
        self.title = title
        self._config: dict[str, Any] = {}

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
            raise ValueError(f"checkpoint writer for {show_path(self.path)} is closed")

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
    def add_packed(self, name: str, packed: Packed | PackedExperts, sha256: str) -> None:
        """Add a packed matrix (or a 3-D experts tensor packed expert by expert, ``PackedExperts``);
        ``sha256`` is :func:`sha256_tensor` of the original bf16 tensor."""
        self._check_open()
        self._check_name(name)
        if not isinstance(packed, (Packed, PackedExperts)):
            raise TypeError(f"tensor {name!r}: add_packed expects a glyd.Packed, got {type(packed).__name__}")
        if not is_sha(sha256):
            raise ValueError(f"tensor {name!r}: sha256 must be 64 lowercase hex digits, got {sha256!r}")
        names = LAYOUTS[packed.layout].arrays if isinstance(packed, Packed) else array_names(packed.layout)
        order = [a for a in names if a in packed.arrays]
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
        # The bytes safetensors' save_file writes (tests pin it), written from Python so that a full
        # disk is an OSError (ENOSPC) like any other write, not a SafetensorError.
        buf = self._buf
        write_streaming(path, {k: (dtype_name(t.dtype), list(t.shape)) for k, t in buf.items()}, buf.__getitem__,
                        metadata=SHARD_METADATA)
        self._shards.append((path, self._buf_names))
        self._buf, self._buf_names, self._buf_bytes = {}, [], 0

    # -- other files -------------------------------------------------------------------------------
    def _arcname(self, arcname: object) -> str:
        rel = safe_relpath(arcname)
        if rel is None:
            raise ValueError(f"file name {arcname!r} must be a relative path inside the checkpoint")
        if reserved(rel):
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
            raise FormatError(f"{show_path(src)}: not a file")
        self._files[rel] = copy_hashed(src, self._dir.tmp / rel)

    def set_config(self, config: dict[str, Any]) -> None:
        """Write ``config`` as the checkpoint's config.json (transformers' spelling: indent 2, sorted keys),
        and glyd's loader module when its ``auto_map`` names it (``glyd.store._config.LOADER_FILE``);
        FormatError when that file would be larger than the readers take (``MAX_JSON_FILE_BYTES``)."""
        if not isinstance(config, dict):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        data = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8")
        if len(data) > MAX_JSON_FILE_BYTES:  # the reader and the loaders would refuse the folder
            raise FormatError(f"{show_path(self.path / CONFIG)}: would be {len(data):,} bytes, too large for a "
                              f"config.json (at most {MAX_JSON_FILE_BYTES:,})")
        self.add_bytes(data, CONFIG)
        self._config = config
        auto = config.get("auto_map")
        if isinstance(auto, dict) and auto.get("AutoConfig") == LOADER_CLASS:
            self._files.pop(LOADER_FILE, None)  # a copy from the source folder is replaced by this version's
            self._write(LOADER_FILE, LOADER_SOURCE.encode("utf-8"))

    def add_bytes(self, data: bytes, arcname: str) -> None:
        """Write ``data`` into the checkpoint as the file ``arcname`` (listed with its sha256, as a copied file)."""
        self._check_open()
        rel = self._arcname(arcname)
        (self._dir.tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        self._write(rel, bytes(data))

    def _write(self, rel: str, data: bytes) -> None:
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
            if not self._tensors:
                raise ValueError(f"checkpoint {show_path(self.path)}: no tensors were added (a checkpoint holds at "
                                 "least one)")
            if self._buf or not self._shards:
                self.flush()
            n = len(self._shards)
            weight_map: dict[str, str] = {}
            total = 0
            for i, (tmp_path, names) in enumerate(self._shards, 1):
                final = shard_name(i, n, self.weights_name)
                os.rename(tmp_path, self._dir.tmp / final)
                for name in names:
                    entry = self._tensors[name]
                    entry["file"] = final
                    keys = [key_for(name, a) for a in entry["arrays"]] if entry["kind"] == "packed" else [name]
                    for k in keys:
                        weight_map[k] = final
                    total += entry_bytes(entry)
            if n > 1:
                index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
                (self._dir.tmp / index_name(self.weights_name)).write_text(json.dumps(index, indent=2) + "\n",
                                                                           encoding="utf-8")
            manifest = self.manifest()
            self._write_card(manifest)
            (self._dir.tmp / MANIFEST).write_text(dump_manifest(manifest), encoding="utf-8")
            path = self._dir.commit()
        except BaseException:
            self.abort()
            raise
        self._closed = True
        log.debug("wrote %s: %d tensors in %d shard(s)", show_path(path), len(self._tensors), n)
        return path

    def _write_card(self, manifest: dict[str, Any]) -> None:
        name = card_name(self._files)
        if name in self._files:  # the source had both README.md and README.glyd.md: keep them, no card
            return
        title = self.title or self._config.get("_name_or_path") or self.path.name
        arch = self._config.get("architectures")
        cls = arch[0] if isinstance(arch, list) and arch and isinstance(arch[0], str) else self._config.get("_class_name")
        library = "diffusers" if self.weights_name != "model" else "transformers"
        text = card_text(manifest, str(title), cls if isinstance(cls, str) else None, library,
                         LOADER_FILE if LOADER_FILE in self._files else None)
        # config.json's JSON may spell a lone surrogate ("\udc80"), which UTF-8 cannot encode: shown escaped
        (self._dir.tmp / name).write_text(text, encoding="utf-8", errors="backslashreplace")

    def abort(self) -> None:
        """Discard everything written so far; nothing is left on disk."""
        self._dir.abort()
        self._closed = True
        self._buf = {}


# --------------------------------------------------------------------------------------------------
# Reading


class CheckpointReader:
    """Open a packed checkpoint folder, checking its manifest against the shard headers.

    Opening reads only glyd.json, the index and the safetensors headers, and checks that every file
    of the folder is accounted for by the manifest (``ignored`` lists the documentation and hidden
    files it tolerates unlisted); :meth:`get` reads one tensor's arrays; :meth:`verify` unpacks
    everything and checks every sha256.

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
            raise FormatError(f"{show_path(self.path)}: no such checkpoint folder")
        if not self.path.is_dir():
            raise FormatError(f"{show_path(self.path)}: not a folder (a glyd checkpoint is a folder with {MANIFEST})")
        mpath = self.path / MANIFEST
        what = not_a_file(mpath)
        if what is not None:
            raise FormatError(f"{show_path(self.path)}: not a glyd packed checkpoint (no "
                              f"{MANIFEST})" if what == "missing"
                              else f"{show_path(mpath)}: {what}, not a regular file: not a glyd manifest")
        # bounded as it is read: a file growing after a size check is caught too
        manifest = load_json(read_json_bytes(mpath, "a glyd manifest", limit=MAX_MANIFEST_BYTES), mpath)
        self._manifest = validate_manifest(manifest, mpath)
        self._tensors: dict[str, dict[str, Any]] = self._manifest["tensors"]
        self._headers: dict[str, Header] = {}
        self._handles: dict[tuple[str, str], Any] = {}
        self._config: dict[str, Any] | None = None
        files = sorted({e["file"] for e in self._tensors.values()})
        sharded, self.weights_name = check_shard_names(self.path, set(files))
        claimed = self._check_shards(mpath, files)
        check_index(self.path, claimed, self._headers, sharded, self.weights_name)
        self._check_files(mpath)
        listed = {MANIFEST, *files, *self._manifest["files"], *([index_name(self.weights_name)] if sharded else [])}
        self.ignored = check_unlisted(self.path, listed)

    def _check_shards(self, mpath: Path, files: list[str]) -> dict[str, set[str]]:
        """Read and check every shard's header against the manifest; returns each shard's keys."""
        for file in files:
            p = self.path / file
            what = not_a_file(p)
            if what is not None:
                raise CorruptError(f"{show_path(p)}: shard listed in {MANIFEST} is "
                                   f"{what}{_NOT_A_FILE * (what != 'missing')}")
            header = self._headers[file] = read_header(p)
            if header.metadata != SHARD_METADATA:
                raise FormatError(
                    f"{show_path(p)}: safetensors __metadata__ is {short(header.metadata)}, a glyd shard has exactly "
                    f"{SHARD_METADATA!r} ('glyd' = checkpoint format version {VERSION})"
                )
            check_write_order(header)
        return check_claims(self._tensors, self._headers, files, mpath)

    def _check_files(self, mpath: Path) -> None:
        for rel in self._manifest["files"]:
            what = not_a_file(self.path / rel)
            if what is not None:
                raise CorruptError(f"{show_path(self.path / rel)}: file listed in {MANIFEST} is {what}"
                                   f"{_NOT_A_FILE * (what != 'missing')}")

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
            raise KeyError(f"{show_path(self.path)}: no tensor {name!r} in the checkpoint") from None

    def is_packed(self, name: str) -> bool:
        return self._entry(name)["kind"] == "packed"

    @property
    def config(self) -> dict[str, Any] | None:
        """config.json as a dict, or None when the checkpoint has none; FormatError naming it when it
        is not a JSON object or is larger than any config (refused before it is read)."""
        if self._config is None:
            p = self.path / CONFIG
            if not p.is_file():
                return None
            cfg = load_json(read_json_bytes(p, "a config.json"), p)
            if not isinstance(cfg, dict):
                raise FormatError(f"{show_path(p)}: not a JSON object")
            self._config = cfg
        return copy.deepcopy(self._config)

    # -- tensors -----------------------------------------------------------------------------------
    def _open(self, file: str, device: str) -> Any:
        h = self._handles.get((file, device))
        if h is None:
            h = safe_open(str(self.path / file), framework="pt", device=device)
            self._handles[(file, device)] = h
        return h

    def get(self, name: str, device: str | torch.device = "cpu") -> Packed | PackedExperts | torch.Tensor:
        """Tensor ``name``: a :class:`glyd.Packed` if it is packed (a ``PackedExperts`` for a 3-D
        experts tensor), else the tensor as stored.

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
            raise CorruptError(f"{show_path(self.path / e['file'])}: tensor {name!r}: cannot read: {exc}") from exc
        if LENS in arrays:
            try:
                return PackedExperts(e["layout"], tuple(e["shape"]), arrays, e["format_version"])
            except (FormatError, CorruptError) as exc:  # the lengths (values, read now) do not fit the arrays
                raise CorruptError(f"{show_path(self.path / e['file'])}: tensor {name!r}: {exc}") from exc
        return Packed(e["layout"], tuple(e["shape"]), arrays, e["format_version"])

    def get_original(self, name: str) -> torch.Tensor:
        """Tensor ``name`` as it was before packing (bf16 for packed tensors), on the CPU, unverified."""
        t = self.get(name)
        return self._unpack(name, t) if isinstance(t, (Packed, PackedExperts)) else t

    def _unpack(self, name: str, t: Packed | PackedExperts) -> torch.Tensor:
        where = f"{show_path(self.path / self._entry(name)['file'])}: tensor {name!r}"
        try:
            return unpack_experts(t) if isinstance(t, PackedExperts) else unpack(t)
        except (CorruptError, FormatError) as exc:
            raise CorruptError(f"{show_path(where)}: {exc}") from exc
        except (RuntimeError, IndexError, ValueError) as exc:  # damaged arrays the codec did not foresee
            raise CorruptError(f"{show_path(where)}: damaged arrays ({exc})") from exc

    def check_tensor(self, name: str, t: torch.Tensor) -> None:
        """Raise CorruptError unless ``t`` (an original tensor) hashes to the manifest's sha256."""
        e = self._entry(name)
        if dtype_name(t.dtype) != e["dtype"] or list(t.shape) != e["shape"]:
            raise CorruptError(
                f"{show_path(self.path / e['file'])}: tensor {name!r}: unpacked to "
                f"{dtype_name(t.dtype)}{list(t.shape)}, expected {e['dtype']}{e['shape']}"
            )
        if sha256_tensor(t) != e["sha256"]:
            raise CorruptError(
                f"{show_path(self.path / e['file'])}: tensor {name!r}: sha256 mismatch: the stored data does not give "
                "back the original tensor (damaged file or wrong manifest)"
            )

    def check_arrays(self, name: str, packed: Packed | PackedExperts) -> None:
        """Raise CorruptError unless every stored array of packed tensor ``name`` hashes to the manifest."""
        e = self._entry(name)
        for a, spec in e["arrays"].items():
            if sha256_tensor(packed.arrays[a]) != spec["sha256"]:
                raise CorruptError(
                    f"{show_path(self.path / e['file'])}: tensor {name!r}: stored array {a!r} (key "
                    f"{key_for(name, a)!r}) does not match its sha256 in {MANIFEST} (damaged file)"
                )

    def verify(self, progress: bool = True) -> dict[str, int]:
        """Check every stored array's sha256, unpack every tensor and check the original's sha256,
        then every copied file's; raise CorruptError on the first mismatch, naming the tensor or
        file. Returns counts of what was checked."""
        counts = {"tensors": 0, "packed": 0, "raw": 0, "weights": 0, "files": 0}
        for name in tqdm(self.names(), desc="verify", unit="tensor", disable=not progress, leave=False):
            t = self.get(name)
            if isinstance(t, (Packed, PackedExperts)):
                self.check_arrays(name, t)
                t = self._unpack(name, t)
            self.check_tensor(name, t)
            counts["tensors"] += 1
            counts["packed" if self.is_packed(name) else "raw"] += 1
            counts["weights"] += t.numel()
        for rel, digest in self._manifest["files"].items():
            if sha256_file(self.path / rel) != digest:
                raise CorruptError(f"{show_path(self.path / rel)}: sha256 mismatch with {MANIFEST} (the file was "
                                   "changed or damaged)")
            counts["files"] += 1
        return counts

    def __repr__(self) -> str:
        return f"CheckpointReader({str(self.path)!r}: {len(self)} tensors, layout {self.layout!r})"
