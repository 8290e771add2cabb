"""Whole model folders: pack a transformers safetensors folder, unpack it back bit for bit, describe it.

>>> import glyd.store as store                                         # doctest: +SKIP
>>> summary = store.pack_folder("Qwen2.5-7B", "Qwen2.5-7B-glyd")      # doctest: +SKIP
>>> store.CheckpointReader("Qwen2.5-7B-glyd").verify()                 # doctest: +SKIP
>>> store.unpack_folder("Qwen2.5-7B-glyd", "Qwen2.5-7B-again")        # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from glyd.codec import LAYOUTS
from glyd.codec import pack as codec_pack
from glyd.codec.packed import FORMAT_VERSION as CODEC_FORMAT_VERSION
from glyd.errors import CorruptError, DestinationExistsError, FormatError, show_path
from glyd.store._config import (
    LOADER_FILE,
    QUANT_METHOD,
    SOURCE_CONFIG,
    check_restorable,
    describes,
    packed_config,
    plain_config,
)
from glyd.store._safetensors import (
    Header,
    dtype_from_name,
    dtype_name,
    load_json,
    read_json_bytes,
    sha256_tensor,
    write_streaming,
)
from glyd.store._atomic import check_outside
from glyd.store._card import human_bytes
from glyd.store._source import check_utf8_path, copy_list, read_config, source_shards
from glyd.store.checkpoint import (
    CONFIG,
    MANIFEST,
    AtomicDir,
    CheckpointReader,
    CheckpointWriter,
    copy_hashed,
    entry_bytes,
    shard_name,
)
from glyd.store.checkpoint import index_name as index_file

log = logging.getLogger(__name__)

__all__ = ["PackSummary", "pack_folder", "unpack_folder", "info"]


@dataclass
class PackSummary:
    """What :func:`pack_folder` did; ``str(summary)`` is the table the CLI prints."""

    src: Path
    dst: Path
    layout: str
    layouts: Counter = field(default_factory=Counter)  # layout -> packed tensor count
    packed: int = 0
    packed_weights: int = 0
    packed_bytes_before: int = 0
    packed_bytes_after: int = 0
    kept: Counter = field(default_factory=Counter)  # dtype name -> tensors kept unpacked
    kept_bytes: Counter = field(default_factory=Counter)  # dtype name -> their bytes
    kept_names: list[str] = field(default_factory=list)
    kept_2d: Counter = field(default_factory=Counter)  # dtype name -> 2-D float tensors kept (not bf16)
    kept_float: Counter = field(default_factory=Counter)  # dtype name -> other float tensors kept (not bf16)
    kept_asked: int = 0  # 2-D bf16 tensors kept because the caller asked (``keep``: the loader runs them unpacked)
    files: list[str] = field(default_factory=list)  # copied verbatim (config.json is rewritten)
    skipped_files: list[str] = field(default_factory=list)
    src_bytes: int = 0  # safetensors files read
    dst_bytes: int = 0  # safetensors files written
    shards: int = 0
    seconds: float = 0.0

    @property
    def bits_per_weight(self) -> float:
        """Bits a weight over the packed matrices."""
        return 8.0 * self.packed_bytes_after / self.packed_weights if self.packed_weights else 0.0

    def rows(self) -> list[tuple[str, str]]:
        lay = ", ".join(f"{n} {k}" for k, n in sorted(self.layouts.items())) or "none"
        kept = ", ".join(f"{self.kept[d]} {d}{self._why(d)} ({_human(self.kept_bytes[d])})"
                         for d in sorted(self.kept)) or "none"
        ratio = f"{100.0 * self.dst_bytes / self.src_bytes:.1f}%" if self.src_bytes else "-"
        rows = [
            ("source", str(self.src)),
            ("packed checkpoint", str(self.dst)),
            ("packed matrices", f"{self.packed} ({lay}), {self.packed_weights:,} weights"),
            (
                "  size",
                f"{_human(self.packed_bytes_before)} bf16 -> {_human(self.packed_bytes_after)}, "
                f"{self.bits_per_weight:.3f} bits a weight",
            ),
            ("kept unpacked", kept),
            *([("  tensors", ", ".join(kept_patterns(self.kept_names)))] if self.kept_names else []),
            ("files copied", f"{len(self.files)} + config.json" if CONFIG in self.files else str(len(self.files))),
            ("safetensors on disk", f"{_human(self.src_bytes)} -> {_human(self.dst_bytes)} ({ratio}), {self.shards} shard(s)"),
        ]
        if self.skipped_files:
            rows.append(("not copied (other weight files)", ", ".join(self.skipped_files)))
        rows.append(("time", f"{self.seconds:.1f} s"))
        return rows

    def _why(self, dtype: str) -> str:
        # why bf16 tensors were kept: not matrices, or matrices the caller asked to keep (``keep``)
        if dtype != "bfloat16":
            return ""
        if not self.kept_asked:
            return " not 2-D"
        flat = self.kept[dtype] - self.kept_asked
        why = [f"{flat} not 2-D"] if flat else []
        return f" ({', '.join([*why, f'{self.kept_asked} not run packed by the model'])})"

    def __str__(self) -> str:
        return format_table(["", ""], self.rows(), header=False)


_human = human_bytes


def _title(src: Path) -> str:
    """The model's name for the card: ``org/name`` for a Hugging Face cache snapshot, else the folder's name."""
    src = src.resolve()
    repo = src.parent.parent.name
    if src.parent.name == "snapshots" and repo.startswith("models--"):
        return repo[len("models--"):].replace("--", "/")
    return src.name


def kept_patterns(names: list[str]) -> list[str]:
    """Tensor names with their layer numbers folded: ``model.layers.*.input_layernorm.weight (30)``."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(re.sub(r"\.\d+\.", ".*.", name), []).append(name)
    return [f"{p} ({len(g)})" if len(g) > 1 else g[0] for p, g in groups.items()]


def format_table(columns: list[str], rows: list[tuple], header: bool = True) -> str:
    """Plain-text table with aligned columns (numbers right-aligned)."""
    cells = [[str(c) for c in r] for r in rows]
    if header:
        cells.insert(0, list(columns))
    widths = [max((len(r[i]) for r in cells), default=0) for i in range(len(columns))]
    out = []
    for j, r in enumerate(cells):
        parts = []
        for i, c in enumerate(r):
            numeric = header and j > 0 and c.replace(",", "").replace(".", "").replace("-", "").isdigit()
            parts.append(c.rjust(widths[i]) if numeric else c.ljust(widths[i]))
        out.append("  ".join(parts).rstrip())
        if header and j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _auto_layout(name: str, w: torch.Tensor, choose: Callable | None, state: dict[str, Any]) -> str:
    """The layout for one matrix when ``layout="auto"``: ``choose(shape)`` (the caller's measured
    choice, ``glyd.ops.choose_layout`` for the GPU that will run the model), else ``fixed12``
    (logged once)."""
    if choose is None:
        if not state.get("told"):
            log.info("layout auto: no measured choice for this machine; packing every matrix with fixed12")
            state["told"] = True
        return "fixed12"
    layout = choose(tuple(w.shape))
    if layout not in LAYOUTS:
        raise ValueError(f"choose_layout returned {layout!r} for {name!r}; expected one of {', '.join(LAYOUTS)}")
    return layout


def _check_packable(src: Path, headers: dict[str, Header], keep: Collection[str]) -> None:
    """Refuse a model with no 2-D bf16 tensor to pack (none, or all in ``keep``), from the headers
    alone, before anything is written: its "packed" checkpoint would load as a bf16 model."""
    found: Counter = Counter()
    for h in headers.values():
        for name, info in h.tensors.items():
            if info.dtype == "bfloat16" and len(info.shape) == 2:
                if name not in keep:
                    return
            found[info.dtype] += 1
    what = ", ".join(f"{n} {d}" for d, n in sorted(found.items(), key=lambda x: (-x[1], x[0])))
    flat = f" (the bfloat16 ones are not 2-D{' or not run packed by the model' if keep else ''})"
    what = f"{what} tensors{flat if 'bfloat16' in found else ''}" if found else "no tensors"
    raise FormatError(
        f"{show_path(src)}: no bf16 2-D matrices to pack: {what}. glyd packs bf16 weights losslessly and never "
        "converts a dtype (convert the model to bf16 yourself if that is what you want; it is not lossless)"
    )


def pack_folder(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    layout: str = "fixed12",
    progress: bool = True,
    max_shard_bytes: int = 2 * 1024**3,
    choose: Callable[[tuple[int, int]], str] | None = None,
    keep: Collection[str] = (),
) -> PackSummary:
    """Pack a transformers safetensors folder into a glyd checkpoint at ``dst``.

    Every 2-D bf16 tensor is packed with ``layout`` (``"fixed12"``, ``"tiered"`` or ``"auto"``);
    every other tensor is kept as it is and listed in the summary (never converted); a model with
    no 2-D bf16 tensor is refused (FormatError). Shard boundaries of the source are kept (a packed
    shard is also split at ``max_shard_bytes``), every other file of the folder is copied, and
    config.json gets a ``quantization_config`` for glyd. Host memory stays near one output shard
    plus one tensor. ``choose``: the layout of a matrix of a shape for ``layout="auto"`` (``None``:
    fixed12; ``glyd pack`` passes ``glyd.ops.choose_layout`` for the GPU it runs on). ``keep``:
    names of 2-D bf16 tensors to keep as they are too (``glyd pack`` passes those its model's loader
    would not run packed: a router, a bias such as BART's ``final_logits_bias``); listed in the summary.
    """
    if layout not in LAYOUTS and layout != "auto":
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join([*LAYOUTS, 'auto'])}")
    t0 = time.perf_counter()
    src, dst = Path(src), Path(dst)
    check_utf8_path(dst, "destination")
    files, headers, index_name = source_shards(src)
    if dst.exists() or dst.is_symlink():
        raise DestinationExistsError(f"{show_path(dst)} already exists; glyd never overwrites (remove it or choose "
                                     "another name)")
    check_outside(src, dst)
    keep = frozenset(keep)
    _check_packable(src, headers, keep)
    config, config_bytes = read_config(src) or (None, b"")
    if config is not None and config.get("quantization_config"):
        q = config["quantization_config"]
        method = q.get("quant_method") if isinstance(q, dict) else q
        raise FormatError(
            f"{show_path(src / CONFIG)}: the model is already quantized (quant_method {method!r}); glyd packs bf16 "
            "models"
        )
    if config is not None:
        check_restorable(config, src / CONFIG)
    copies, skipped = copy_list(src, set(files) | ({index_name} if index_name else set()))
    if any(rel == SOURCE_CONFIG for _, rel in copies):
        raise FormatError(f"{show_path(src / SOURCE_CONFIG)}: the name is glyd's own (a packed folder keeps its "
                          "source's config.json there): rename or remove the file")
    summary = PackSummary(src=src, dst=dst, layout=layout, skipped_files=skipped)
    summary.src_bytes = sum(h.file_size for h in headers.values())
    with CheckpointWriter(dst, layout=layout, max_shard_bytes=max_shard_bytes, title=_title(src)) as out:
        _pack_shards(out, src, files, headers, summary, progress, choose, keep)
        for path, rel in copies:
            if rel == CONFIG and config is not None:
                continue
            out.add_file(path, rel)
            summary.files.append(rel)
        if config is not None:
            out.set_config(packed_config(config, {"quant_method": QUANT_METHOD, "layout": layout,
                                                  "format_version": CODEC_FORMAT_VERSION}))
            out.add_bytes(config_bytes, SOURCE_CONFIG)  # what unpack gives back, byte for byte
            summary.files.append(CONFIG)
        else:
            log.warning("%s has no config.json: the checkpoint will not load with transformers", show_path(src))
    reader = CheckpointReader(dst)
    shards = {reader.entry(n)["file"] for n in reader.names()}
    summary.shards = len(shards)
    summary.dst_bytes = sum((dst / s).stat().st_size for s in shards)
    _log_kept(summary)
    summary.seconds = time.perf_counter() - t0
    return summary


def _pack_shards(out: CheckpointWriter, src: Path, files: list[str], headers: dict[str, Header],
                 summary: PackSummary, progress: bool, choose: Callable | None, keep: frozenset[str]) -> None:
    """Pack or keep every tensor of the source shards, one tensor in memory at a time."""
    layout, auto_state = summary.layout, {}
    total = sum(len(h.tensors) for h in headers.values())
    with tqdm(total=total, desc="pack", unit="tensor", disable=not progress, leave=False) as bar:
        for f in files:
            handle = safe_open(str(src / f), framework="pt", device="cpu")
            for name in headers[f].keys_in_file_order():
                t = handle.get_tensor(name)
                d = dtype_name(t.dtype)
                if t.dtype == torch.bfloat16 and t.dim() == 2 and name not in keep:
                    lay = _auto_layout(name, t, choose, auto_state) if layout == "auto" else layout
                    p = codec_pack(t, lay)
                    out.add_packed(name, p, sha256_tensor(t))
                    summary.packed += 1
                    summary.layouts[lay] += 1
                    summary.packed_weights += t.numel()
                    summary.packed_bytes_before += t.numel() * 2
                    summary.packed_bytes_after += p.nbytes
                else:
                    if t.is_floating_point() and t.dtype != torch.bfloat16:
                        (summary.kept_2d if t.dim() == 2 else summary.kept_float)[d] += 1
                    out.add_tensor(name, t)
                    asked = t.dtype == torch.bfloat16 and t.dim() == 2
                    summary.kept_asked += asked
                    why = "asked" if asked else "not 2-D" if t.dtype == torch.bfloat16 else "not bf16"
                    log.debug("kept unpacked (%s): %s %s%s", why, name, d, list(t.shape))
                    summary.kept[d] += 1
                    summary.kept_bytes[d] += t.numel() * t.element_size()
                    summary.kept_names.append(name)
                del t
                bar.update(1)
            del handle
            out.flush()  # keep the source's shard boundaries


def _log_kept(summary: PackSummary) -> None:
    if summary.kept_2d:
        log.warning(
            "%s 2-D float tensors are not bfloat16 (%s): kept as they are, unpacked. glyd packs bf16 weights only; "
            "convert the model to bf16 first if that is what you want (it is not lossless from %s)",
            sum(summary.kept_2d.values()),
            ", ".join(f"{n} {d}" for d, n in sorted(summary.kept_2d.items())),
            "/".join(sorted(summary.kept_2d)),
        )
    if summary.kept_float:
        log.warning(
            "%s other float tensors are not bfloat16 (%s): kept as they are in the checkpoint (glyd unpack gives "
            "them back exactly), but transformers loads a glyd checkpoint in bfloat16",
            sum(summary.kept_float.values()),
            ", ".join(f"{n} {d}" for d, n in sorted(summary.kept_float.items())),
        )


# --------------------------------------------------------------------------------------------------
# Unpacking


def unpack_folder(src: str | os.PathLike, dst: str | os.PathLike, progress: bool = True) -> dict[str, int]:
    """Write the original bf16 safetensors folder of the checkpoint ``src`` to ``dst``.

    Same shards as the checkpoint (with ``model.safetensors.index.json`` when sharded), every tensor
    bit-identical to the original (each sha256 is checked before it is written), config.json without
    glyd's ``quantization_config``, every other file copied and checked. Returns counts. Tensors
    are unpacked and written one at a time (memory: the largest tensor, not the largest shard);
    each shard's bytes are those ``safetensors.torch.save_file`` would write.
    """
    reader = CheckpointReader(src)
    dst = Path(dst)
    if dst.exists() or dst.is_symlink():
        raise DestinationExistsError(f"{show_path(dst)} already exists; glyd never overwrites (remove it or choose "
                                     "another name)")
    check_outside(reader.path, dst)
    by_file: dict[str, list[str]] = {}
    for name in reader.names():
        by_file.setdefault(reader.entry(name)["file"], []).append(name)
    counts = {"tensors": 0, "shards": len(by_file), "files": 0, "bytes": 0}
    out = AtomicDir(dst)
    try:
        weight_map: dict[str, str] = {}
        total = params = 0
        with tqdm(total=len(reader), desc="unpack", unit="tensor", disable=not progress, leave=False) as bar:
            for file, names in sorted(by_file.items()):
                # One tensor in memory at a time: the header comes from the manifest's dtypes and
                # shapes, each tensor is unpacked, checked against its sha256 and written in turn.
                specs = {name: (reader.entry(name)["dtype"], reader.entry(name)["shape"]) for name in names}

                def produce(name: str) -> torch.Tensor:
                    t = reader.get_original(name)
                    reader.check_tensor(name, t)
                    bar.update(1)
                    return t

                write_streaming(out.tmp / file, specs, produce, metadata={"format": "pt"})
                for name, (dt, shape) in specs.items():
                    weight_map[name] = file
                    numel = math.prod(shape)
                    total += numel * torch.empty(0, dtype=getattr(torch, dt)).element_size()
                    params += numel
                counts["tensors"] += len(specs)
        if len(by_file) > 1:
            meta = {"total_parameters": params, "total_size": total}  # as transformers 5 writes it
            index = {"metadata": meta, "weight_map": dict(sorted(weight_map.items()))}
            (out.tmp / index_file(reader.weights_name)).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n",
                                                                  encoding="utf-8")
        counts["bytes"] = total
        for rel, digest in reader.files.items():
            if rel in (CONFIG, LOADER_FILE, SOURCE_CONFIG):  # the loader only serves a packed folder's config
                continue
            if copy_hashed(reader.path / rel, out.tmp / rel) != digest:
                raise CorruptError(f"{show_path(reader.path / rel)}: sha256 mismatch with {MANIFEST} (the file was "
                                   "changed or damaged)")
            counts["files"] += 1
        if CONFIG in reader.files:
            (out.tmp / CONFIG).write_bytes(_source_config(reader))
            counts["files"] += 1
        elif SOURCE_CONFIG in reader.files:
            raise CorruptError(f"{show_path(reader.path / MANIFEST)}: lists {SOURCE_CONFIG} but no {CONFIG}")
        out.commit()
    except BaseException:
        out.abort()
        raise
    return counts


def _read_listed(reader: CheckpointReader, rel: str) -> bytes:
    """The bytes of ``rel``, a config.json the manifest lists (the packed one or the source's), checked
    against its sha256; one larger than any config is refused before it is read."""
    path = reader.path / rel
    data = read_json_bytes(path, "a config.json")
    if hashlib.sha256(data).hexdigest() != reader.files[rel]:
        raise CorruptError(f"{show_path(path)}: sha256 mismatch with {MANIFEST} (the file was changed or damaged)")
    return data


def _source_config(reader: CheckpointReader) -> bytes:
    """config.json as the source had it: its bytes as ``glyd pack`` kept them (``SOURCE_CONFIG``),
    which must say what the packed config.json says, or (a folder written without them)
    config.json without glyd's quantization_config, in transformers' spelling."""
    cfg = load_json(_read_listed(reader, CONFIG), reader.path / CONFIG)
    if not isinstance(cfg, dict):
        raise FormatError(f"{show_path(reader.path / CONFIG)}: not a JSON object")
    if SOURCE_CONFIG not in reader.files:
        return (json.dumps(plain_config(cfg), indent=2, sort_keys=True) + "\n").encode("utf-8")
    data = _read_listed(reader, SOURCE_CONFIG)
    source = load_json(data, reader.path / SOURCE_CONFIG)
    if not isinstance(source, dict):
        raise FormatError(f"{show_path(reader.path / SOURCE_CONFIG)}: not a JSON object")
    if not describes(cfg, source):
        raise CorruptError(f"{show_path(reader.path / SOURCE_CONFIG)}: is not the config "
                           f"{show_path(reader.path / CONFIG)} describes (the two were edited apart)")
    return data


# --------------------------------------------------------------------------------------------------
# Description


def info(path: str | os.PathLike) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (one per tensor) and totals of a packed checkpoint, from its manifest (no data read).

    Each row: ``name``, ``kind`` ("packed" or "raw"), ``layout`` and ``format_version`` (the
    layout's version of its arrays; both None when raw), ``dtype`` (the original's), ``shape``,
    ``bytes`` (stored), ``bits_per_weight`` (stored bits / elements). Totals count, among others,
    ``layouts`` (layout -> packed tensors) and ``layout_versions`` ((layout, format version) -> packed tensors).
    """
    reader = CheckpointReader(path)
    rows: list[dict[str, Any]] = []
    totals: dict[str, Any] = {
        "tensors": 0,
        "packed": 0,
        "raw": 0,
        "weights": 0,
        "packed_weights": 0,
        "bytes": 0,
        "packed_bytes": 0,
        "original_bytes": 0,
        "files": len(reader.files),
        "layouts": Counter(),
        "layout_versions": Counter(),
        "raw_dtypes": Counter(),
    }
    for name in reader.names():
        e = reader.entry(name)
        numel = math.prod(e["shape"])
        stored = entry_bytes(e)
        packed = e["kind"] == "packed"
        rows.append(
            {
                "name": name,
                "kind": e["kind"],
                "layout": e.get("layout") if packed else None,
                "format_version": e.get("format_version") if packed else None,
                "dtype": e["dtype"],
                "shape": tuple(e["shape"]),
                "bytes": stored,
                "bits_per_weight": 8.0 * stored / numel if numel else 0.0,
            }
        )
        totals["tensors"] += 1
        totals["weights"] += numel
        totals["bytes"] += stored
        totals["original_bytes"] += numel * dtype_from_name(e["dtype"]).itemsize
        if packed:
            totals["packed"] += 1
            totals["packed_weights"] += numel
            totals["packed_bytes"] += stored
            totals["layouts"][e["layout"]] += 1
            totals["layout_versions"][e["layout"], e["format_version"]] += 1
        else:
            totals["raw"] += 1
            totals["raw_dtypes"][e["dtype"]] += 1
    w, b = totals["weights"], totals["bytes"]
    totals["bits_per_weight"] = 8.0 * b / w if w else 0.0
    pw = totals["packed_weights"]
    totals["packed_bits_per_weight"] = 8.0 * totals["packed_bytes"] / pw if pw else 0.0
    totals["layout"] = reader.layout
    return rows, totals
