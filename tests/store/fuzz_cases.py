"""Hostile edits of a packed checkpoint folder, generated deterministically from a seed.

Each :class:`Case` is a named mutation applied to a fresh copy of a pristine folder
(``case.mutate(folder, outside)``; ``outside`` is an empty folder next to it, for link targets).
``data_only`` marks the mutations that change nothing but bytes inside the stored arrays' data:
the one change ``verify=False`` loading is documented not to see (docs/models.md, "What only
verify=True detects"). The readers and the rules that judge their outcomes are in ``fuzz_readers.py``.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import shutil
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

MANIFEST = "glyd.json"
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Case:
    id: str
    mutate: Callable[[Path, Path], None]
    touches: str  # the file (relative name) or part of the folder the mutation is about
    data_only: bool = False
    family: str = ""  # the kind of mutation, for coverage assertions
    field: tuple = ()  # the JSON field edited, for a field's case
    #: What a reader that does not verify (``CheckpointReader.get``, ``info``) cannot see: the
    #: stored arrays' data, or a packed matrix's true width moved within its 64-column padding
    #: (the layouts' shape rules hold for every such width; only the hashes or a model can tell).
    unverified_ok: bool = False

    def __post_init__(self) -> None:
        if self.data_only:
            object.__setattr__(self, "unverified_ok", True)


def folder_files(folder: Path) -> list[str]:
    """Relative POSIX names of every regular file of ``folder``, sorted."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def split_shard(data: bytes) -> tuple[dict[str, Any], int]:
    """(header, data start) of safetensors bytes."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), 8 + n


def join_shard(header: dict[str, Any] | bytes, payload: bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + payload


# --------------------------------------------------------------------------------------------------
# Bytes: flips, truncations and appends at many offsets of every file

#: Tails appended to every file.
APPENDS = (b"\0", b" ", b"x" * 9)


def _flip(rel: str, offset: int, bit: int):
    def mutate(folder: Path, outside: Path) -> None:
        p = folder / rel
        data = bytearray(p.read_bytes())
        data[offset] ^= 1 << bit
        p.write_bytes(bytes(data))

    return mutate


def _truncate(rel: str, length: int):
    def mutate(folder: Path, outside: Path) -> None:
        p = folder / rel
        p.write_bytes(p.read_bytes()[:length])

    return mutate


def _append(rel: str, tail: bytes):
    def mutate(folder: Path, outside: Path) -> None:
        with open(folder / rel, "ab") as f:
            f.write(tail)

    return mutate


def _sample(rng: random.Random, lo: int, hi: int, n: int) -> list[int]:
    """``n`` distinct offsets in ``[lo, hi)`` (all of them when there are fewer), sorted."""
    return sorted(rng.sample(range(lo, hi), min(n, hi - lo)))


def _lengths(rng: random.Random, size: int, special: list[int], n: int) -> list[int]:
    """``n`` distinct truncated lengths below ``size``: the special ones first, then random ones."""
    out = sorted({x for x in special if 0 <= x < size})[:n]
    rest = [x for x in range(size) if x not in out]
    return sorted(out + rng.sample(rest, min(n - len(out), len(rest))))


def byte_cases(folder: Path, seed: int, flips: int = 16, truncations: int = 8, appends: tuple[bytes, ...] = APPENDS
               ) -> list[Case]:
    """Flips (one bit at an offset sampled in each region), truncations and appends of every file of
    ``folder``: ``flips`` offsets a region (a shard's 8-byte length prefix, JSON header, data; the
    whole of any other file), ``truncations`` lengths a file (the edges of the regions first)."""
    rng = random.Random(seed)
    cases: list[Case] = []
    for rel in folder_files(folder):
        data = (folder / rel).read_bytes()
        size = len(data)
        if rel.endswith(".safetensors"):
            _, start = split_shard(data)
            regions = [("prefix", _sample(rng, 0, 8, flips)), ("header", _sample(rng, 8, start, flips)),
                       ("data", _sample(rng, start, size, flips))]
            special = [0, 7, 8, 9, start - 1, start, start + 1, size - 1]
        else:
            regions, special = [("text", _sample(rng, 0, size, flips))], [0, 1, size // 2, size - 1]
        for region, offsets in regions:
            for off in offsets:
                bit = rng.randrange(8)
                cases.append(Case(f"flip {rel}@{off}^{bit} ({region})", _flip(rel, off, bit), rel,
                                  data_only=region == "data", family=f"flip-{region}"))
        for length in _lengths(rng, size, special, truncations):
            cases.append(Case(f"truncate {rel} to {length} of {size}", _truncate(rel, length), rel, family="truncate"))
        for tail in appends:
            cases.append(Case(f"append {tail[:4]!r}x{len(tail)} to {rel}", _append(rel, tail), rel, family="append"))
    return cases


# --------------------------------------------------------------------------------------------------
# glyd.json: every field removed, of a wrong type, out of range, another tensor's, huge, deep


class Raw:
    """JSON text to put in place of a value (deep nesting that json.dumps cannot write, NaN...)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text[:24]}{'...' if len(self.text) > 24 else ''})"


MISSING = object()
#: Every field gets each of these.
GENERIC: list[tuple[str, Any]] = [
    ("removed", MISSING), ("null", None), ("true", True), ("0", 0), ("-1", -1), ("1.5", 1.5), ("''", ""),
    ("'x'", "x"), ("[]", []), ("{}", {}), ("2**64", 2**64), ("10**400", 10**400), ("NaN", Raw("NaN")),
    ("-Infinity", Raw("-Infinity")), ("deep-50", Raw("[" * 50 + "]" * 50)), ("deep-5000", Raw("[" * 5000 + "]" * 5000)),
]
#: Field-specific values (out of range, another valid-looking value), by field name.
SPECIFIC: dict[str, list[Any]] = {
    "format": ["glyd-checkpoint2", "GLYD-CHECKPOINT"],
    "version": [0, 2, 1.0, "1", 2**63],
    "glyd_version": ["", "99.0", "\u00e9" * 300],
    "layout": ["fixed12", "tiered", "auto", "FIXED12", "fixed12 "],
    "kind": ["packed", "raw", "Packed"],
    "dtype": ["bfloat16", "float16", "float32", "uint8", "int8", "int64", "bool", "float8_e8m0fnu", "torch.bfloat16",
              "complex128", "qint8"],
    "shape": [[0], [1], [2**60], [2**61], [0, 2**62], [-1, 40], [1] * 65, [3.0, 2], [True, 2], "[50, 40]"],
    "sha256": ["0" * 64, "A" * 64, "0" * 63, "0" * 65, "g" * 64],
    "file": ["model.safetensors", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
             "model-00003-of-00002.safetensors", "model-00001-of-00001.safetensors", "../model.safetensors",
             "/etc/passwd", "tokenizer.json", "model-1-of-2.safetensors"],
    "format_version": [0, 2, 1.0, "1"],
}


def _dumps(obj: Any) -> str:
    """json.dumps, with :class:`Raw` values spliced in as text."""
    raws: list[str] = []

    def fix(o: Any) -> Any:
        if isinstance(o, Raw):
            raws.append(o.text)
            return f"@@RAW{len(raws) - 1}@@"
        if isinstance(o, dict):
            return {k: fix(v) for k, v in o.items()}
        if isinstance(o, list):
            return [fix(v) for v in o]
        return o

    text = json.dumps(fix(obj))
    for i, r in enumerate(raws):
        text = text.replace(f'"@@RAW{i}@@"', r)
    return text


def json_edit(rel: str, edit: Callable[[Any], Any]):
    """A mutation that parses ``rel``, changes it in place with ``edit`` (what it returns is
    ignored: ``dict.pop`` returns the value) and writes it back as JSON."""

    def mutate(folder: Path, outside: Path) -> None:
        p = folder / rel
        doc = json.loads(p.read_text())
        edit(doc)
        p.write_text(_dumps(doc))

    return mutate


def set_at(path: tuple[str, ...], value: Any) -> Callable[[Any], None]:
    def edit(doc: Any) -> None:
        obj = doc
        for k in path[:-1]:
            obj = obj[k]
        if value is MISSING:
            del obj[path[-1]]
        else:
            obj[path[-1]] = copy.deepcopy(value)

    return edit


def _label(v: Any) -> str:
    """A short name for a value (a cut one ends with its repr's CRC, to stay unique)."""
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:28]}...#{zlib.crc32(text.encode()):08x}"


def field_cases(rel: str, doc: dict[str, Any], path: tuple[str, ...], others: list[Any], family: str) -> list[Case]:
    """Every generic value, the field's specific values and ``others`` (the same field of other
    entries) at ``path`` of the JSON document ``rel``; values equal to the current one are skipped."""
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    obj = parent.get(path[-1], MISSING)  # MISSING: a key added
    values = [(name, v) for name, v in GENERIC if not (v is MISSING and obj is MISSING)]
    values += [(_label(v), v) for v in SPECIFIC.get(path[-1], [])]
    values += [(f"other's {_label(v)}", v) for v in others]
    if isinstance(obj, list) and obj and all(isinstance(d, int) for d in obj):  # a shape: near and permuted
        near = [[*obj[:i], d + s, *obj[i + 1:]] for i, d in enumerate(obj) for s in (-1, 1, 64)]
        values += [(_label(v), v) for v in [*near, obj[::-1], [*obj, 1], [1, *obj], obj[:-1]]]
    seen, cases = [], []
    for name, v in values:
        if (not isinstance(v, Raw) and v is not MISSING and v == obj and type(v) is type(obj)) or any(
            v is s or (type(v) is type(s) and not isinstance(v, Raw) and v == s) for s in seen
        ):
            continue
        seen.append(v)
        where = "".join(f"[{k!r}]" for k in path)
        cases.append(Case(f"{rel}{where} = {name}", json_edit(rel, set_at(path, v)), rel, family=family,
                          field=path, unverified_ok=_same_padding(doc, path, v)))
    return cases


def _same_padding(doc: Any, path: tuple[str, ...], v: Any) -> bool:
    """Whether ``v`` at ``path`` is the true shape of a packed matrix (or experts tensor) with the
    same leading dimensions and another width rounding up to the same multiple of 64."""
    if len(path) != 3 or path[0] != "tensors" or path[2] != "shape" or doc["tensors"][path[1]]["kind"] != "packed":
        return False
    *lead, k = doc["tensors"][path[1]]["shape"]  # [N, K], or [E, N, K] for experts
    return (isinstance(v, list) and len(v) == len(lead) + 1 and all(type(d) is int for d in v) and v[:-1] == lead
            and v[-1] != k and v[-1] > 0 and -(-v[-1] // 64) == -(-k // 64))


def manifest_cases(manifest: dict[str, Any], seed: int, full: bool = False) -> list[Case]:
    """Edits of every field of glyd.json: the top level, tensor entries (one packed and one raw, or
    all with ``full``), array specs (two arrays of that packed tensor, or all), and files."""
    rng = random.Random(seed)
    cases: list[Case] = []
    m = manifest
    for k in m:
        cases += field_cases(MANIFEST, m, (k,), [], "top")
    tensors = m["tensors"]
    packed = [n for n, e in tensors.items() if e["kind"] == "packed"]
    raw = [n for n, e in tensors.items() if e["kind"] == "raw"]
    chosen = packed + raw if full else [rng.choice(packed), rng.choice(raw)]
    for name in chosen:
        for f in tensors[name]:
            others = [e[f] for n, e in tensors.items() if n != name and f in e and e[f] != tensors[name][f]]
            cases += field_cases(MANIFEST, m, ("tensors", name, f), _distinct(others), "entry")
    for name in chosen:
        arrays = tensors[name].get("arrays", {})
        for a in (list(arrays) if full else rng.sample(list(arrays), min(2, len(arrays)))):
            for f in arrays[a]:
                others = [s[f] for b, s in arrays.items() if b != a and s[f] != arrays[a][f]]
                others += [e["arrays"][a][f] for n, e in tensors.items()
                           if n != name and a in e.get("arrays", {}) and e["arrays"][a][f] != arrays[a][f]]
                cases += field_cases(MANIFEST, m, ("tensors", name, "arrays", a, f), _distinct(others), "array")
    for rel in m["files"]:
        others = [d for r, d in m["files"].items() if r != rel]
        cases += field_cases(MANIFEST, m, ("files", rel), _distinct(others), "file-digest")
    return cases + structure_cases(m)


def _distinct(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _rename_key(d: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    return {(new if k == old else k): v for k, v in d.items()}


def structure_cases(m: dict[str, Any]) -> list[Case]:
    """Tensors and arrays dropped, renamed, swapped or added; files entries dropped or pointing elsewhere."""
    cases: list[Case] = []

    def add(what: str, edit) -> None:
        cases.append(Case(f"glyd.json: {what}", json_edit(MANIFEST, edit), MANIFEST, family="structure"))

    names = list(m["tensors"])
    for n in names:
        add(f"tensor {n!r} dropped", lambda d, n=n: d["tensors"].pop(n))
        add(f"tensor {n!r} renamed", lambda d, n=n: d.update(tensors=_rename_key(d["tensors"], n, n + ".x")))
    for a, b in zip(names, names[1:] + names[:1]):
        def swap(d, a=a, b=b):
            t = d["tensors"]
            t[a], t[b] = t[b], t[a]
        add(f"entries of {a!r} and {b!r} swapped", swap)
        add(f"sha256 of {a!r} and {b!r} swapped",
            lambda d, a=a, b=b: _swap_field(d["tensors"][a], d["tensors"][b], "sha256"))
    add("tensors in reverse order", lambda d: d.update(tensors=dict(reversed(list(d["tensors"].items())))))
    for n in [n for n in names if m["tensors"][n]["kind"] == "packed"][:1]:
        arrays = list(m["tensors"][n]["arrays"])
        for a in arrays:
            add(f"array {n!r}.{a} dropped", lambda d, n=n, a=a: d["tensors"][n]["arrays"].pop(a))
            add(f"array {n!r}.{a} renamed",
                lambda d, n=n, a=a: d["tensors"][n].update(arrays=_rename_key(d["tensors"][n]["arrays"], a, a + "x")))
        add(f"array {n!r}.bogus added",
            lambda d, n=n: d["tensors"][n]["arrays"].update(bogus=copy.deepcopy(d["tensors"][n]["arrays"][arrays[0]])))
        add(f"arrays of {n!r} reversed",
            lambda d, n=n: d["tensors"][n].update(arrays=dict(reversed(list(d["tensors"][n]["arrays"].items())))))
        add(f"tensor {n!r} made raw", lambda d, n=n: d["tensors"][n].update(kind="raw"))
    for rel in m["files"]:
        add(f"file {rel!r} dropped", lambda d, rel=rel: d["files"].pop(rel))
        add(f"file {rel!r} renamed", lambda d, rel=rel: d.update(files=_rename_key(d["files"], rel, rel + ".old")))
    some = next(iter(m["files"].values()))
    for bad in ["missing.txt", "../outside.txt", "/etc/passwd", "a\\b.txt", "glyd.json", INDEX, "model.safetensors",
                "sub/../x.txt", "", "./config.json", "sub//x.txt", "x\u0000y", "extra.safetensors"]:
        add(f"files gets {bad!r}", lambda d, bad=bad: d["files"].update({bad: some}))
    return cases


def index_cases(index: dict[str, Any], seed: int, keys: int = 3) -> list[Case]:
    """Edits of the index of a sharded folder: ``metadata.total_size`` and ``keys`` sampled
    entries of ``weight_map`` (other shards' names swapped in), entries dropped and added."""
    rng = random.Random(seed)
    wm = index["weight_map"]
    shards = sorted(set(wm.values()))
    cases = field_cases(INDEX, index, ("metadata", "total_size"), [index["metadata"]["total_size"] + d for d in (-1, 1)],
                        "index")
    for key in rng.sample(sorted(wm), min(keys, len(wm))):
        cases += field_cases(INDEX, index, ("weight_map", key), [s for s in shards if s != wm[key]] + ["../model.safetensors"],
                             "index")
    cases += field_cases(INDEX, index, ("weight_map", "no.such.tensor"), shards[:1], "index")
    for k in ("metadata", "weight_map"):
        cases += field_cases(INDEX, index, (k,), [], "index")
    return cases


def _swap_field(a: dict[str, Any], b: dict[str, Any], f: str) -> None:
    a[f], b[f] = b[f], a[f]


def text_cases(rel: str) -> list[Case]:
    """Whole-text variants of a JSON file: duplicate keys, trailing junk, BOM, other encodings, scalars."""

    def text_edit(what: str, edit: Callable[[bytes], bytes]) -> Case:
        def mutate(folder: Path, outside: Path) -> None:
            p = folder / rel
            p.write_bytes(edit(p.read_bytes()))

        return Case(f"{rel}: {what}", mutate, rel, family="text")

    return [
        text_edit("'format' key put first (glyd.json's a duplicate)", lambda b: b.replace(b"{", b'{"format": "x", ', 1)),
        text_edit("trailing junk", lambda b: b + b"{}"),
        text_edit("UTF-8 BOM", lambda b: b"\xef\xbb\xbf" + b),
        text_edit("UTF-16", lambda b: b.decode("utf-8").encode("utf-16")),
        text_edit("Latin-1 byte in a string", lambda b: b.replace(b'": "', b'": "\xe9', 1)),
        text_edit("empty", lambda b: b""),
        text_edit("null", lambda b: b"null"),
        text_edit("a list", lambda b: b"[" + b + b"]"),
        text_edit("a number", lambda b: b"1"),
        text_edit("pretty-printed again", lambda b: json.dumps(json.loads(b), indent=4).encode()),
        text_edit("compact again", lambda b: json.dumps(json.loads(b), separators=(",", ":")).encode()),
        text_edit("\\u-escaped", lambda b: json.dumps(json.loads(b), ensure_ascii=True).encode().replace(b"e", b"\\u0065")),
    ]


# --------------------------------------------------------------------------------------------------
# Crafted safetensors headers (the data bytes stay as they are)

#: Another dtype of the same element size, for each safetensors dtype.
SAME_SIZE = {"U8": "I8", "I8": "U8", "BOOL": "U8", "BF16": "F16", "F16": "BF16", "U16": "I16", "I16": "U16",
             "I32": "U32", "U32": "F32", "F32": "I32", "I64": "U64", "U64": "F64", "F64": "I64"}
ITEMSIZE = {"U8": 1, "I8": 1, "BOOL": 1, "BF16": 2, "F16": 2, "U16": 2, "I16": 2, "I32": 4, "U32": 4, "F32": 4,
            "I64": 8, "U64": 8, "F64": 8}


def header_edit(rel: str, edit: Callable[[dict[str, Any]], Any]):
    """A mutation of shard ``rel``'s header: ``edit`` changes it in place or returns raw header bytes."""

    def mutate(folder: Path, outside: Path) -> None:
        p = folder / rel
        header, start = split_shard(p.read_bytes())
        payload = p.read_bytes()[start:]
        new = edit(header)
        p.write_bytes(join_shard(new if isinstance(new, bytes) else header, payload))

    return mutate


def _reassign(h: dict[str, Any], order: list[str]) -> None:
    """Give the tensors of ``h`` contiguous offsets in ``order`` (a valid tiling, other bytes)."""
    pos = 0
    for k in order:
        b, e = h[k]["data_offsets"]
        h[k]["data_offsets"] = [pos, pos + e - b]
        pos += e - b


def header_cases(folder: Path, seed: int, full: bool = False) -> list[Case]:
    rng = random.Random(seed)
    cases: list[Case] = []
    for rel in [f for f in folder_files(folder) if f.endswith(".safetensors")]:
        data = (folder / rel).read_bytes()
        h, start = split_shard(data)
        keys = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"])

        def add(family: str, what: str, edit, rel=rel) -> None:
            cases.append(Case(f"header {rel}: {what}", header_edit(rel, edit), rel, family=family))

        for k in keys if full else rng.sample(keys, min(4, len(keys))):
            dt, shape, (b, e) = h[k]["dtype"], h[k]["shape"], h[k]["data_offsets"]
            add("shift", f"{k} offsets +1", lambda h, k=k, b=b, e=e: h[k].update(data_offsets=[b + 1, e + 1]))
            add("shift", f"{k} end -1", lambda h, k=k, b=b, e=e: h[k].update(data_offsets=[b, e - 1]))
            add("overlap", f"{k} starts at 0", lambda h, k=k, b=b, e=e: h[k].update(data_offsets=[0, e - b]))
            add("dtype-same-size", f"{k} {dt}->{SAME_SIZE[dt]}", lambda h, k=k, dt=dt: h[k].update(dtype=SAME_SIZE[dt]))
            other = "I64" if ITEMSIZE[dt] != 8 else "U8"
            add("dtype-size", f"{k} {dt}->{other}", lambda h, k=k, o=other: h[k].update(dtype=o))
            add("shape-same-numel", f"{k} shape {shape}->{[math.prod(shape)] + [1]}",
                lambda h, k=k, s=shape: h[k].update(shape=[math.prod(s), 1]))
            add("shape-size", f"{k} shape +1", lambda h, k=k, s=shape: h[k].update(shape=[s[0] + 1, *s[1:]] if s else [2]))
            add("rename", f"{k} renamed", lambda h, k=k: h.update({k + "x": h.pop(k)}))
            add("rename", f"{k} dropped", lambda h, k=k: h.pop(k))
            for bad in ([float(b), float(e)], [b], [b, e, e], [-1, e - b - 1], [str(b), str(e)], [b, 2**64]):
                add("offsets", f"{k} data_offsets {bad}", lambda h, k=k, bad=bad: h[k].update(data_offsets=bad))
        pairs = [(a, b) for i, a in enumerate(keys) for b in keys[i + 1:] if _nbytes(h[a]) == _nbytes(h[b])
                 and _slice(data, start, h[a]) != _slice(data, start, h[b])]
        for a, b in pairs if full else rng.sample(pairs, min(4, len(pairs))):
            add("swap", f"data_offsets of {a} and {b} swapped", lambda h, a=a, b=b: _swap_field(h[a], h[b], "data_offsets"))
        add("permute", "tensors laid out in reverse order", lambda h, keys=keys: _reassign(h, keys[::-1]))
        add("permute", "tensors laid out by name", lambda h, keys=keys: _reassign(h, sorted(keys)))
        end = max(h[k]["data_offsets"][1] for k in keys)
        add("extra", "extra empty tensor", lambda h, end=end: h.update(extra={"dtype": "U8", "shape": [0], "data_offsets": [end, end]}))
        add("extra", "extra tensor on the first byte", lambda h: h.update(extra={"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}))
        add("extra", "extra packed array", lambda h, k=keys[0]: h.update({k.split("_glyd_")[0] + "_glyd_bogus": dict(h[k])}))
        for md in (MISSING, {"format": "pt"}, {"format": "pt", "glyd": "1", "x": "y"}, {"format": "pt", "glyd": 1},
                   {"format": "pt", "glyd": "2"}, {"format": "np", "glyd": "1"}, [], "pt"):
            add("metadata", f"__metadata__ = {_label(md) if md is not MISSING else 'removed'}",
                lambda h, md=md: h.pop("__metadata__") if md is MISSING else h.update(__metadata__=md))
        raw = json.dumps(h).encode()
        add("padding", "8 more spaces of padding", lambda h, raw=raw: raw + b" " * 8)
        add("padding", "NUL padding", lambda h, raw=raw: raw + b"\0" * 8)
        add("padding", "tab and newline padding", lambda h, raw=raw: raw + b"\t\n\r ")
        add("whole", "header is a list", lambda h: b"[]")
        add("whole", "header has only __metadata__", lambda h: json.dumps({"__metadata__": h["__metadata__"]}).encode())
        add("whole", "header length 0", lambda h: b"")
        add("whole", "header nested 5000 deep", lambda h: b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    return cases


def _nbytes(info: dict[str, Any]) -> int:
    b, e = info["data_offsets"]
    return e - b


def _slice(data: bytes, start: int, info: dict[str, Any]) -> bytes:
    b, e = info["data_offsets"]
    return data[start + b : start + e]


# --------------------------------------------------------------------------------------------------
# Links and added files


def _link(rel: str, target: Callable[[Path, Path], str | Path], copy_from: str | None = None):
    """Replace ``rel`` by a symbolic link to ``target(folder, outside)``; with ``copy_from``, first
    copy that file of the folder to the target (an identical file outside)."""

    def mutate(folder: Path, outside: Path) -> None:
        p = folder / rel
        t = Path(target(folder, outside)) if not isinstance(target, str) else target
        if copy_from is not None:
            src = folder / copy_from
            if src.is_dir():
                shutil.copytree(src, t)
            else:
                shutil.copyfile(src, t)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(t, p)

    return mutate


def link_cases(folder: Path) -> list[Case]:
    files = folder_files(folder)
    shards = [f for f in files if f.endswith(".safetensors")]
    subdirs = sorted({f.split("/")[0] for f in files if "/" in f})
    copied = [f for f in files if f not in shards and f not in (MANIFEST, INDEX)]
    cases: list[Case] = []

    def add(what: str, touches: str, mutate) -> None:
        cases.append(Case(f"link: {what}", mutate, touches, family="link"))

    linked = [*shards, MANIFEST, *([INDEX] if INDEX in files else []), *copied]
    for rel, other in zip(linked, linked[1:] + linked[:1]):
        add(f"{rel} -> identical copy outside", rel, _link(rel, lambda f, o, r=rel: o / Path(r).name, copy_from=rel))
        add(f"{rel} -> a copy of {other} outside", rel, _link(rel, lambda f, o: o / "other", copy_from=other))
        add(f"{rel} -> a file inside", rel, _link(rel, (MANIFEST if rel != MANIFEST else shards[0]) if "/" not in rel
                                                   else "../" + MANIFEST))
        add(f"{rel} -> itself (a loop)", rel, _link(rel, Path(rel).name))
        add(f"{rel} -> dangling", rel, _link(rel, lambda f, o: o / "nothing-here"))
    a = shards[0]
    add(f"{a} -> x.lnk -> {a} (a two-link loop)", a, _two_link_loop(a))
    for d in subdirs:
        add(f"folder {d} -> identical copy outside", d, _link(d, lambda f, o, d=d: o / d, copy_from=d))
        add(f"folder {d} -> an empty folder outside", d, _link(d, lambda f, o: _mkdir(o / "empty")))
        add(f"folder {d}/up -> .. (a loop)", d, _link(f"{d}/up", ".."))
    add("unlisted folder loop -> .", "", _link("loop", "."))
    add("unlisted folder -> outside", "", _link("elsewhere", lambda f, o: _mkdir(o / "docs")))
    add("unlisted dangling notes.txt", "", _link("notes.txt", lambda f, o: o / "nothing-here"))
    add("unlisted dangling extra.safetensors", "", _link("extra.safetensors", lambda f, o: o / "nothing-here"))
    add("unlisted README.md -> outside", "", _link("README.md", lambda f, o: _write(o / "README.md", b"# hi\n")))
    add("unlisted link to a shard", "", _link("copy.safetensors", shards[0]))
    return cases


def _two_link_loop(rel: str):
    def mutate(folder: Path, outside: Path) -> None:
        (folder / rel).unlink()
        os.symlink("x.lnk", folder / rel)
        os.symlink(Path(rel).name, folder / Path(rel).parent / "x.lnk")

    return mutate


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def _write(p: Path, data: bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def _add(rel: str, content: Callable[[Path], bytes] | bytes):
    def mutate(folder: Path, outside: Path) -> None:
        _write(folder / rel, content(folder) if callable(content) else content)

    return mutate


def added_file_cases(folder: Path) -> list[Case]:
    files = folder_files(folder)
    shards = [f for f in files if f.endswith(".safetensors")]
    shard = lambda f: (f / shards[0]).read_bytes()  # noqa: E731
    index = json.dumps({"metadata": {"total_size": 0}, "weight_map": {}}).encode()
    adds = {
        "model-00003-of-00002.safetensors": shard,
        "model-00001-of-00003.safetensors": shard,
        "model.safetensors" if "model.safetensors" not in files else "model-00001-of-00002.safetensors": shard,
        INDEX if INDEX not in files else "other.safetensors.index.json": index,
        "pytorch_model.bin": b"\x80\x02junk",
        "modeling_evil.py": b"import os\n",
        "sub/evil.py": b"import os\n",
        "sub/model.safetensors": shard,
        "sub/config.json": b"{}",
        "weights.npy": b"\x93NUMPY",
        "README.md": b"# notes\n",
        "LICENSE": b"MIT\n",
        "notes.txt": b"added later\n",
        "added_tokens.json": b"{}",
        ".hidden/model.safetensors": shard,
        ".gitattributes": b"*.safetensors filter=lfs\n",
        ".x.12.glyd-tmp/model.safetensors": shard,
    }
    cases = [Case(f"added {rel}", _add(rel, c), rel, family="added") for rel, c in adds.items()]
    cases.append(Case("added empty folder", lambda f, o: _mkdir(f / "empty"), "empty", family="added"))
    return cases


# --------------------------------------------------------------------------------------------------
# Pipes, devices and folders in place of files


def _fifo(rel: str):
    def mutate(folder: Path, outside: Path) -> None:
        (folder / rel).unlink()
        os.mkfifo(folder / rel)

    return mutate


def _folder_for(rel: str):
    def mutate(folder: Path, outside: Path) -> None:
        (folder / rel).unlink()
        (folder / rel).mkdir()
        (folder / rel / "inside.txt").write_text("a folder where a file was\n")

    return mutate


#: What each special case's error must say the path is (issue 33: all of them read "missing" or "no glyd.json").
SPECIAL_SAYS = {"FIFO": "a FIFO (named pipe)", "/dev/zero": "a symbolic link to /dev/zero, a character device",
                "folder": "a folder"}


def special_file_cases(folder: Path) -> list[Case]:
    """Every file of the folder replaced by a FIFO, a link to /dev/zero and a folder: a reader that
    opened the first would block forever, the second never end."""
    cases: list[Case] = []
    for rel in folder_files(folder):
        for what, mutate in (("FIFO", _fifo(rel)), ("/dev/zero", _link(rel, "/dev/zero")), ("folder", _folder_for(rel))):
            cases.append(Case(f"special: {rel} is {SPECIAL_SAYS[what]}", mutate, rel, family="special", field=(what,)))
    return cases
