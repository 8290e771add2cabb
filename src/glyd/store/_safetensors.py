"""Careful reading of safetensors headers, and byte hashing.

safetensors files are read through ``safetensors.safe_open`` (memory-mapped, no pickle), but only
after :func:`read_header` has checked the header against the file: its length prefix against the
file size before anything is allocated, then every tensor's dtype, shape and byte range. A file that
fails any check raises :class:`~glyd.errors.FormatError` or :class:`~glyd.errors.CorruptError`
naming the file and the tensor.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from glyd.errors import CorruptError, FormatError, show_path

#: safetensors' own limit on the JSON header (``MAX_HEADER_SIZE`` in the Rust crate).
MAX_HEADER_BYTES = 100_000_000
#: The largest JSON side file (a config.json, a safetensors index) a reader takes whole: a real one is
#: kilobytes to a few MiB; a weights file given in its place, or a hostile one, is not read into memory.
MAX_JSON_FILE_BYTES = 64 << 20
#: Deepest JSON nesting glyd reads (its own files nest 4 deep; config.json files a few more).
MAX_JSON_DEPTH = 64
#: Bounds on a tensor's shape: dims, and elements (counting a 0 dim as 1, so strides fit in int64).
MAX_DIMS = 64
MAX_ELEMENTS = 2**60

#: safetensors dtype code -> torch dtype name (the names glyd.json uses: ``str(dtype)`` minus "torch.").
ST_TO_NAME = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "U32": "uint32",
    "I32": "int32",
    "U64": "uint64",
    "I64": "int64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the dtype spelling used in glyd.json."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: object) -> torch.dtype | None:
    """The torch dtype named ``name`` if it is one safetensors can store, else None."""
    if not isinstance(name, str) or name not in ST_TO_NAME.values():
        return None
    dtype = getattr(torch, name, None)
    return dtype if isinstance(dtype, torch.dtype) else None


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors header: dtype name (glyd spelling), shape and byte range."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int
    file_size: int

    def keys_in_file_order(self) -> list[str]:
        """Tensor names sorted by their position in the file (sequential reads)."""
        return sorted(self.tensors, key=lambda k: (self.tensors[k].begin, k))


def shape_ok(shape: object) -> bool:
    """A list of at most MAX_DIMS non-negative ints whose product (a 0 counted as 1) is at most
    MAX_ELEMENTS: bounded so that torch can build the tensor (or its meta twin) without overflow."""
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        return False
    if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_ELEMENTS for s in shape):
        return False
    return math.prod(max(s, 1) for s in shape) <= MAX_ELEMENTS


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k[:80]!r}")
        out[k] = v
    return out


def _too_deep(obj: object, limit: int) -> bool:
    stack = [(obj, 1)]
    while stack:
        o, depth = stack.pop()
        if isinstance(o, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (o.values() if isinstance(o, dict) else o))
    return False


def load_json(raw: bytes, where: object, what: str = "not valid JSON") -> Any:
    """Parse untrusted JSON bytes; any way they can be bad raises FormatError(f"{where}: {what}
    (reason)"): not UTF-8, malformed, a duplicate key, a number past Python's int-string limit,
    nesting deeper than MAX_JSON_DEPTH (which would also make deep copies recurse)."""
    try:
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise FormatError(f"{show_path(where)}: {what} (nested too deeply)") from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, int-string limit, duplicate key
        raise FormatError(f"{show_path(where)}: {what} ({str(exc)[:200]})") from exc
    if _too_deep(obj, MAX_JSON_DEPTH):
        raise FormatError(f"{show_path(where)}: {what} (nested more than {MAX_JSON_DEPTH} levels deep)")
    return obj


def read_json_bytes(path: Path, kind: str, hint: str = "", limit: int = MAX_JSON_FILE_BYTES) -> bytes:
    """The bytes of ``path``, a JSON side file (``kind``: "a config.json", "a safetensors index"), read
    whole; FormatError naming the file and its size when it is over ``limit`` (``hint`` ends that
    message). A file growing while it is read is caught too: at most ``limit + 1`` bytes are read."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(limit + 1) if size <= limit else b""
    if size > limit or len(raw) > limit:
        size = max(size, len(raw))
        raise FormatError(f"{show_path(path)}: {size:,} bytes, too large for {kind} (at most {limit:,}){hint}")
    return raw


def read_header(path: str | os.PathLike) -> Header:
    """Parse and check the header of the safetensors file ``path`` without reading its data.

    Raises CorruptError for a truncated file or byte ranges outside it, FormatError for anything
    that is not a well-formed safetensors header.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CorruptError(f"{show_path(path)}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", prefix)
            # Bound the length prefix by the file and by safetensors' own limit before reading it.
            if n > size - 8:
                raise CorruptError(
                    f"{show_path(path)}: truncated or not a safetensors file (header length {n} but only {size - 8} "
                    "bytes follow)"
                )
            if n > MAX_HEADER_BYTES:
                raise FormatError(f"{show_path(path)}: safetensors header of {n} bytes exceeds the "
                                  f"{MAX_HEADER_BYTES}-byte limit")
            raw = f.read(n)
    except OSError as exc:
        raise FormatError(f"{show_path(path)}: cannot read: {exc.strerror or exc}") from exc
    header = load_json(raw, path, "not a safetensors file: the header is not valid JSON")
    if not isinstance(header, dict):
        raise FormatError(f"{show_path(path)}: not a safetensors file (header is not a JSON object)")
    data_start = 8 + n
    data_len = size - data_start
    metadata = header.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata  # ([], "", 0 or false: refused, as safetensors does)
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError(f"{show_path(path)}: safetensors __metadata__ must map strings to strings")
    # JSON may spell a lone surrogate ("\udc80"): Python reads it, safetensors refuses the file
    # (SafetensorError out of safe_open) and UTF-8 cannot write it back
    bad = next((t for t in (*header, *metadata, *metadata.values()) if not _utf8(t)), None)
    if bad is not None:
        raise FormatError(f"{show_path(path)}: not a safetensors file: the header holds {short(bad)}, which is not "
                          "valid Unicode (a lone surrogate)")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        where = f"{show_path(path)}: tensor {short(name)}"
        if not isinstance(entry, dict):
            raise FormatError(f"{show_path(where)}: header entry is not an object")
        st_dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(st_dtype, str) or st_dtype not in ST_TO_NAME:
            raise FormatError(f"{show_path(where)}: unsupported or invalid dtype {short(st_dtype)}")
        if not shape_ok(shape):
            raise FormatError(f"{show_path(where)}: invalid shape {short(shape)}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise FormatError(f"{show_path(where)}: invalid data_offsets {short(offsets)}")
        itemsize = torch.empty((), dtype=getattr(torch, ST_TO_NAME[st_dtype])).element_size()
        want = math.prod(shape) * itemsize
        if offsets[1] - offsets[0] != want:
            raise FormatError(
                f"{show_path(where)}: data_offsets {short(offsets)} span {short(offsets[1] - offsets[0])} bytes but "
                f"{ST_TO_NAME[st_dtype]}{list(shape)} needs {want}"
            )
        if offsets[1] > data_len:
            raise CorruptError(
                f"{show_path(where)}: truncated file (the tensor ends at byte {short(data_start + offsets[1])}, the "
                f"file has {size})"
            )
        tensors[name] = TensorInfo(ST_TO_NAME[st_dtype], tuple(shape), offsets[0], offsets[1])
    end = _check_tiling(path, tensors)
    if end != data_len:
        raise CorruptError(f"{show_path(path)}: {data_len - end} bytes after the last tensor (damaged or appended "
                           "file)")
    return Header(path, tensors, {str(k): v for k, v in metadata.items()}, data_start, size)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_tiling(path: Path, tensors: dict[str, TensorInfo]) -> int:
    """Byte ranges must tile the data from 0, in order, with no overlap and no gap (safetensors' own
    rule): two tensors sharing bytes would alias each other. Returns where the last one ends."""
    order = sorted(tensors, key=lambda k: (tensors[k].begin, tensors[k].end, k))
    end, last = 0, None
    for name in order:  # overlaps first: a shared range also leaves a gap somewhere
        info = tensors[name]
        if info.begin < end:
            raise FormatError(
                f"{show_path(path)}: tensor {short(name)}: data_offsets [{info.begin}, {info.end}] overlap tensor "
                f"{short(last)} (which ends at {end}): two tensors may not share bytes"
            )
        if info.end > end or last is None:
            end, last = info.end, name
    end, last = 0, None
    for name in order:
        info = tensors[name]
        if info.begin > end:
            after = f"after tensor {short(last)}" if last is not None else "at the start of the data"
            raise FormatError(
                f"{show_path(path)}: tensor {short(name)}: {info.begin - end} unused bytes {after} (data_offsets must "
                "be contiguous)"
            )
        end, last = info.end, name
    return end


def short(value: object, limit: int = 80) -> str:
    """repr of a value read from a file, cut to ``limit`` characters for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def tensor_bytes_view(t: torch.Tensor) -> memoryview:
    """The raw bytes of ``t`` (C order, little-endian) without a copy when ``t`` is contiguous on the CPU."""
    if sys.byteorder != "little":  # pragma: no cover - no big-endian host runs torch today
        raise RuntimeError("glyd hashes tensors as little-endian bytes; big-endian hosts are not supported")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.view(torch.uint8).numpy())


def sha256_tensor(t: torch.Tensor) -> str:
    """sha256 (hex) of a tensor's raw bytes in C order, little-endian: the hash glyd.json records.

    >>> import torch
    >>> sha256_tensor(torch.zeros(2, dtype=torch.bfloat16))[:16]
    'df3f619804a92fdb'
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"sha256_tensor expects a torch.Tensor, got {type(t).__name__}")
    return hashlib.sha256(tensor_bytes_view(t)).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


#: safetensors' order of dtypes (its ``Dtype`` enum): a file lists tensors by dtype, last first,
#: then by name. Measured against safetensors 0.8's ``save_file``; dtypes not listed sort first.
_ST_ORDER = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16", "I32", "U32",
             "F32", "C64", "F64", "I64", "U64"]
NAME_TO_ST = {v: k for k, v in ST_TO_NAME.items()}


def write_order(specs: dict[str, tuple[str, list[int]]], where: object = "safetensors file") -> list[str]:
    """The names of ``specs`` (name -> (dtype name, shape)) in the order safetensors' save_file
    lays the tensors out: by dtype, last of ``_ST_ORDER`` first, then by name."""
    def rank(name: str) -> tuple[int, str]:
        dt = specs[name][0]
        st = NAME_TO_ST.get(dt)
        if st is None:
            raise FormatError(f"{show_path(where)}: tensor {name!r}: dtype {dt!r} cannot be stored in safetensors")
        return (-(_ST_ORDER.index(st) if st in _ST_ORDER else -1), name)

    return sorted(specs, key=rank)


def check_write_order(header: Header) -> None:
    """Raise FormatError unless the tensors of ``header`` lie where :func:`write_streaming` (and
    save_file) put them: one after another in :func:`write_order`. The header then holds no choice
    of its own: byte ranges moved or swapped between tensors of one size (a valid tiling, so
    read_header accepts it) would hand each tensor another's bytes without any hash being read."""
    specs = {k: (i.dtype, list(i.shape)) for k, i in header.tensors.items()}
    pos = 0
    for name in write_order(specs, header.path):
        info = header.tensors[name]
        n = info.end - info.begin
        if info.begin != pos:
            raise FormatError(
                f"{show_path(header.path)}: tensor {short(name)}: data_offsets [{info.begin}, {info.end}] are not "
                f"where a glyd shard holds it ([{pos}, {pos + n}]: tensors in safetensors' order, by dtype then name): "
                f"byte ranges moved between tensors"
            )
        pos += n


def write_streaming(path: str | os.PathLike, specs: dict[str, tuple[str, list[int]]], produce,
                    metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file one tensor at a time: ``specs`` maps each name to (dtype name,
    shape); ``produce(name)`` returns that tensor when its turn comes, so only one is in memory.
    The bytes are those ``safetensors.torch.save_file`` writes for the same tensors (same order,
    header and padding; with two or more ``metadata`` keys save_file writes them in a random order,
    a Rust HashMap's, and this in ``metadata``'s). A produced tensor whose dtype or shape differs
    from its spec raises FormatError (the header is already written: write to a temporary path,
    then rename)."""
    order = [(name, specs[name]) for name in write_order(specs, path)]
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, (dt, shape) in order:
        n = math.prod(shape) * torch.empty(0, dtype=getattr(torch, dt)).element_size()
        header[name] = {"dtype": NAME_TO_ST[dt], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    # serde_json's spelling: compact, UTF-8 as is (\u escapes only for control characters).
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, (dt, shape) in order:
            t = produce(name)
            if dtype_name(t.dtype) != dt or list(t.shape) != list(shape):
                raise FormatError(f"{show_path(path)}: tensor {name!r} is {dtype_name(t.dtype)}{list(t.shape)}, "
                                  f"its header says {dt}{list(shape)}")
            f.write(tensor_bytes_view(t))
