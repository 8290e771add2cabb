"""Will a model fit on a GPU, in bf16 and with Glyd? (``glyd fit``)

The estimate is three terms, each printed:

* **weights**: the model transformers builds from the config on the meta device
  (:mod:`glyd.apps.fit_meta`: every parameter really there, MoE experts and tied embeddings as the
  class resolves them); for a folder with safetensors files, their headers give the exact bf16
  size (read without loading a byte of weights; a folder saved by Glyd is counted as stored).
  With Glyd, the weights the packer packs (exact ``nn.Linear`` and ``nn.Embedding`` weights, the
  fused 3-D weights of MoE experts) are held at the layout's bits a weight; everything else
  (norms, biases, routers) stays bf16.
* **KV cache** for the context, summed over the layers: ``kv_heads x head_dim x 2 (K and V) x
  2 bytes (bf16) x tokens x batch``, where a sliding-window (or chunked) layer holds at most its
  window of tokens. Glyd does not shrink it here (the compressed KV cache is a separate option).
* **runtime margin**: the CUDA context, workspaces and the allocator's reserve, 5% of the GPU's
  memory (at least 1 GiB: measured on the H200, below); the activations of one prefill chunk of
  ``min(context, 2048)`` tokens a sequence: ``chunk x batch x (4 x hidden + 2 x intermediate) x 2
  bytes``; fp32 logits of the last token (``batch x vocab x 4``); and a decode step's attention
  temporaries: with grouped-query attention and a mask, transformers' SDPA path repeats one layer's
  keys and values to every query head (``heads x head_dim x 2 x 2 bytes x tokens x batch``).

On the H200 (2026-12-03, ``benchmarks/scale.py``: the largest static-cache context that still ran a
decode step, Qwen2.5-0.5B to Llama-3.1-70B in bf16, fixed12 and tiered) the memory beside weights,
KV cache and those repeated keys and values was 6.1-10.1 GiB (4.3-7.2% of the card's 140.4 GiB):
the 5% reserve is that, and without the repeat term fit's largest context was 13-26% too high. A
context near the largest is within a few percent of what the GPU holds, not exact
(``benchmarks/RESULTS.md``, fit section).

Sizes are bytes; the table prints GiB (2^30 bytes). ``--gpu`` takes a card (``h200``, ``a100-80gb``,
``4090``, ...: its nvidia-smi total) or a size, read as ``glyd.apps.fit_gpus`` says (``141GB``, the
size an H200 is sold as, is that card's 143,771 MiB; the table says which reading it took).

>>> from glyd.apps.fit import estimate, load_config, model_shape
>>> e = estimate(model_shape(load_config("llama-3.1-8b")), gpu_bytes=16 * 2**30, context=8192)
>>> round(e.weights_bf16 / 1e9, 2), e.fits_bf16, e.fits_glyd
(16.06, False, True)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glyd.apps.fit_configs import KNOWN_CONFIGS
from glyd.apps.fit_gpus import MAX_GPU_BYTES, parse_gpu, parse_size  # noqa: F401 (MAX_GPU_BYTES: fit.MAX_GPU_BYTES)
from glyd.apps.fit_meta import ModelShape, model_shape
from glyd.codec import LAYOUTS
from glyd.errors import FormatError, GlydError, show_path
from glyd.hf.memory import SPEED_ORDER, weights_bytes
from glyd.store._config import QUANT_METHOD, plain_config
from glyd.store._manifest import safe_relpath
from glyd.store._safetensors import MAX_JSON_FILE_BYTES, load_json, read_header, read_json_bytes, short

__all__ = ["KNOWN_CONFIGS", "ModelShape", "estimate", "load_config", "model_shape", "parse_size", "run_fit"]

log = logging.getLogger(__name__)

GiB = 2**30

MARGIN_FIXED = 1 * GiB
#: Share of the GPU's memory beside weights, KV cache and activations (CUDA context, workspaces,
#: the allocator's reserve): 6.1-10.1 GiB of the H200's 140.4 measured (module docstring).
RESERVE_FRACTION = 0.05
PREFILL_CHUNK = 2048
#: The largest config.json (or safetensors index) fit reads: a real one is kilobytes; a file passed as
#: the model may be weights. The store's bound for every JSON side file a reader takes whole.
MAX_CONFIG_BYTES = MAX_JSON_FILE_BYTES
_BF16 = 2


def layout_bits(layout: str) -> float:
    """Bits a weight assumed for ``layout`` when no packed file says otherwise: the ``bits`` of its
    entry in ``glyd.LAYOUTS`` (where the measurements behind each figure are named)."""
    lay = LAYOUTS.get(layout)
    if lay is None or lay.bits is None:
        known = [name for name, lay in LAYOUTS.items() if lay.bits is not None]
        raise GlydError(f"unknown layout {layout!r}; choose one of {', '.join(known)}")
    return lay.bits


@dataclass
class WeightCount:
    """Weights split by what Glyd does with them: ``packable`` elements and the rest (bytes as bf16)."""

    packable: int = 0  # elements Glyd packs (a folder's headers alone: its 2-D floating tensors)
    other_bytes: int = 0  # 1-D tensors (norms, biases) and anything not packed, in bytes as bf16
    packed_bytes: int | None = None  # a Glyd folder: the packed arrays' bytes as stored
    source: str = "config"
    rows: tuple[tuple[int, int], ...] = ()  # (K, rows) of the packed matrices (the config's model): K is padded
    names: frozenset[str] = frozenset()  # the tensors of the folder (its headers)

    def bf16_bytes(self) -> int:
        return self.packable * _BF16 + self.other_bytes

    def glyd_bytes(self, layout: str) -> int:
        if self.packed_bytes is not None:
            return self.packed_bytes + self.other_bytes
        layout_bits(layout)  # an unknown layout: fit's own message
        return weights_bytes(self.packable, self.other_bytes, layout, self.rows)  # the loader's memory_limit counts the same


@dataclass
class FitEstimate:
    """Memory needed on one GPU, in bytes (``gpu`` keeps ``--gpu`` as typed), and whether it fits."""

    gpu_bytes: int
    context: int
    batch: int
    layout: str
    weights_bf16: int
    weights_glyd: int
    kv_cache: int
    margin: int
    source: str
    params: int = 0  # parameters of the config's model, a tied one once
    notes: list[str] = field(default_factory=list)
    gpu: str = ""  # --gpu as typed
    gpu_reading: str = ""  # how --gpu was read (a card, a sold size, a size)

    @property
    def total_bf16(self) -> int:
        return self.weights_bf16 + self.kv_cache + self.margin

    @property
    def total_glyd(self) -> int:
        return self.weights_glyd + self.kv_cache + self.margin

    @property
    def fits_bf16(self) -> bool:
        return self.total_bf16 <= self.gpu_bytes

    @property
    def fits_glyd(self) -> bool:
        return self.total_glyd <= self.gpu_bytes


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    # Multimodal configs (Gemma 3, Llama 4, ...) keep the language model's config in text_config;
    # fit counts that model (the note says so), as glyd eval --random builds it.
    sub = cfg.get("text_config")
    if isinstance(sub, dict) and "hidden_size" in sub and isinstance(sub.get("model_type"), str):
        merged = dict(sub, _text_only=True)
        if cfg.get("tie_word_embeddings") is not None:
            merged.setdefault("tie_word_embeddings", cfg["tie_word_embeddings"])
        return merged
    return cfg


def _has_text_config(cfg: dict[str, Any]) -> bool:
    """Whether ``cfg``'s model_type has a text_config in transformers (a multimodal config); True
    where transformers is missing or does not know the type (build_config says so)."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        return "text_config" in (getattr(CONFIG_MAPPING[cfg.get("model_type")], "sub_configs", None) or {})
    except (ImportError, KeyError, TypeError):
        return True


def load_config(model: str | Path) -> dict[str, Any]:
    """The config dict of ``model``: a known name (see ``KNOWN_CONFIGS``), a folder (a packed one
    too: the model's own config), a config.json, or a hub id whose config.json is in the local
    Hugging Face cache (nothing is downloaded)."""
    key = str(model).lower()
    if key in KNOWN_CONFIGS and not Path(model).exists():
        return dict(KNOWN_CONFIGS[key], _name=key)
    path = Path(model)
    cfg_path = path / "config.json" if path.is_dir() else path
    if not cfg_path.is_file() and not path.exists():
        cfg_path = _cached_hub_config(str(model))
    if not cfg_path.is_file():
        known = ", ".join(KNOWN_CONFIGS)
        raise FormatError(f"{show_path(model)}: not a model folder, a config.json, a hub id in the local Hugging Face "
                          f"cache or a known model ({known})")
    try:  # a weights file given for its folder: not read into memory whole
        raw = read_json_bytes(cfg_path, "a config.json", "; pass the model's folder or its config.json")
    except OSError as exc:
        raise FormatError(f"{show_path(cfg_path)}: cannot read it ({exc.strerror or exc})") from exc
    cfg = load_json(raw, cfg_path, "not a readable JSON config")  # nesting, duplicate keys, huge numbers bounded
    if not isinstance(cfg, dict):
        raise FormatError(f"{show_path(cfg_path)}: a config must be a JSON object")
    q = cfg.get("quantization_config")
    packed = isinstance(q, dict) and q.get("quant_method") == QUANT_METHOD
    if packed:  # a packed folder: the model's own config (its type is kept in quantization_config)
        cfg = plain_config(cfg)
    if isinstance(cfg.get("text_config"), dict) and not _has_text_config(cfg):
        # a Llama's config keeps any extra field: fit counted the text_config's model, not the one built
        raise FormatError(f"{show_path(cfg_path)}: a text_config beside model_type {short(cfg.get('model_type'))}, "
                          "whose transformers config has none: a damaged or edited config")
    cfg = _text_config(cfg)
    cfg["_name"] = str(model)
    cfg["_folder"] = str(cfg_path.parent)
    if packed:
        cfg["_packed_layout"] = q.get("layout") if isinstance(q.get("layout"), str) else ""
    if not path.exists():
        cfg["_hub"] = True
    return cfg


def _cached_hub_config(repo_id: str) -> Path:
    """config.json of ``repo_id`` in the local Hugging Face cache; a path that does not exist when it
    is not there (a FormatError names the model when ``repo_id`` looks like a hub id)."""
    missing = Path(repo_id) / "config.json"
    if repo_id.count("/") != 1 or repo_id.startswith((".", "/", "~")):
        return missing
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.errors import HFValidationError
    except ImportError:
        return missing
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except HFValidationError:
        return missing
    if isinstance(found, str):
        return Path(found)
    raise FormatError(f"{show_path(repo_id)}: not a local folder, and the Hugging Face cache has no config.json for it "
                      f"(glyd fit downloads nothing: `hf download {show_path(repo_id)} config.json` fetches it, or "
                      "pass a folder)")


def count_from_shape(shape: ModelShape) -> WeightCount:
    """The weights of the model built on the meta device: packed ones and the rest in bf16."""
    return WeightCount(packable=shape.packable, other_bytes=shape.other * _BF16, source="config (built on the meta device)",
                       rows=shape.packable_rows)


#: Float dtypes of a safetensors header (store's names); the 2-D ones are what Glyd packs.
_FLOATS = ("bfloat16", "float16", "float32", "float64")


def count_from_files(folder: Path) -> WeightCount | None:
    """Weights from the safetensors headers of ``folder`` (None when it has no safetensors files)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():  # a sharded checkpoint: only the shards its index names
        try:
            raw = read_json_bytes(index, "a safetensors index")  # a hostile index: not read into memory whole
            weight_map = load_json(raw, index, "not a valid safetensors index")["weight_map"]
            names = sorted({str(f) for f in weight_map.values()})
        except (OSError, KeyError, TypeError, AttributeError) as exc:
            raise FormatError(f"{show_path(index)}: not a valid safetensors index ({exc})") from exc
        outside = next((f for f in names if safe_relpath(f) is None or "/" in f), None)
        if outside is not None:  # as glyd pack: a shard elsewhere is another model's weights
            raise FormatError(f"{show_path(index)}: shard name {short(outside)} is not a file of the folder")
        files = [folder / f for f in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FormatError(f"{show_path(index)}: names missing shard(s) {', '.join(missing[:3])}")
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    glyd_folder = False
    cfg_path = folder / "config.json"
    if cfg_path.is_file():
        try:
            qc = load_json(read_json_bytes(cfg_path, "a config.json"), cfg_path).get("quantization_config") or {}
            glyd_folder = isinstance(qc, dict) and qc.get("quant_method") == "glyd"
        except (OSError, FormatError, AttributeError):
            pass
    glyd_folder = glyd_folder or (folder / "glyd.json").is_file()
    count = WeightCount(source=f"safetensors headers ({len(files)} file{'s' * (len(files) > 1)})")
    packed = 0
    shard_of: dict[str, Path] = {}
    for path in files:
        # The store's reader: the length prefix and every entry bound-checked before use.
        for key, info in read_header(path).tensors.items():
            if shard_of.setdefault(key, path) != path:  # counted twice, and refused by the loader
                raise FormatError(f"{show_path(folder)}: tensor {key!r} is in two shards: "
                                  f"{show_path(shard_of[key].name)} and {show_path(path.name)}")
            dtype, shape, nbytes = info.dtype, info.shape, info.end - info.begin
            numel = math.prod(shape)
            if glyd_folder:
                # A Glyd folder: packed arrays are integer planes; float tensors are kept as is.
                if dtype in _FLOATS:
                    count.other_bytes += nbytes
                else:
                    packed += nbytes
            elif dtype in _FLOATS[:3] and len(shape) == 2:
                count.packable += numel
            elif dtype in _FLOATS:
                count.other_bytes += numel * _BF16
            else:
                count.other_bytes += nbytes
    count.names = frozenset(shard_of)
    if glyd_folder:
        count.packed_bytes = packed
        count.source += ", Glyd folder: sizes as stored"
    return count


def kv_cache_bytes(shape: ModelShape, context: int, batch: int = 1, bytes_per_value: int = _BF16) -> int:
    """Sum over layers of ``kv_heads x head_dim x 2 x bytes x min(context, window) x batch``."""
    total = 0
    for layer in shape.attention:
        tokens = context if layer.window is None else min(context, layer.window)
        total += layer.kv_heads * layer.head_dim * 2 * bytes_per_value * tokens * batch
    return total


def attention_temporaries(shape: ModelShape, context: int, batch: int = 1) -> int:
    """A decode step's largest attention temporary: one layer's keys and values repeated to every
    query head (transformers' SDPA path with a mask and grouped-query attention); 0 without GQA."""
    worst = 0
    for layer in shape.attention:
        if layer.heads > layer.kv_heads:
            tokens = context if layer.window is None else min(context, layer.window)
            worst = max(worst, layer.heads * layer.head_dim * 2 * _BF16 * tokens * batch)
    return worst


def runtime_margin(shape: ModelShape, context: int, batch: int = 1, gpu_bytes: int = 0) -> int:
    """Memory beside weights and KV cache (module docstring): reserve, prefill activations, last-token
    logits, a decode step's repeated keys and values."""
    chunk = min(context, PREFILL_CHUNK)
    activations = chunk * batch * (4 * shape.hidden + 2 * shape.intermediate) * _BF16
    reserve = max(MARGIN_FIXED, int(RESERVE_FRACTION * gpu_bytes))
    return reserve + activations + batch * shape.vocab * 4 + attention_temporaries(shape, context, batch)


def _weights(shape: ModelShape, folder: Path | None, layout: str) -> tuple[WeightCount, int, list[str]]:
    """(the count, bf16 bytes, notes): the folder's headers when it has safetensors files, else the shape."""
    files = count_from_files(folder) if folder is not None else None
    notes: list[str] = []
    if files is None:
        count = count_from_shape(shape)
    elif files.packed_bytes is not None:
        notes.append("bf16 weights of a Glyd folder: 2 bytes for every weight of the config's model")
        return files, shape.params * _BF16, notes
    else:
        # The headers give the exact size; the config's model says which of it Glyd packs (a
        # checkpoint's per-expert matrices become fused 3-D experts, packed as well).
        total = files.bf16_bytes()
        packable = min(shape.packable, total // _BF16)
        count = WeightCount(packable=packable, other_bytes=total - packable * _BF16,
                            source=f"{files.source}; packed weights from the config's model",
                            rows=shape.packable_rows if packable == shape.packable else ())
        stored = files.packable + files.other_bytes // _BF16
        if abs(stored - shape.params) > 0.01 * shape.params:
            notes.append(f"the folder holds {stored:,} weights, the config's model {shape.params:,}")
    notes.append(f"Glyd weights at {layout_bits(layout)} bits a packed weight ({layout})")
    return count, count.bf16_bytes(), notes


def _shape_notes(shape: ModelShape, context: int) -> list[str]:
    notes = []
    if shape.unpacked_matrices:
        kinds = ", ".join(sorted(shape.unpacked_matrices))
        n = sum(shape.unpacked_matrices.values())
        notes.append(f"{n / 1e9:.2f} B weights outside nn.Linear/nn.Embedding ({kinds}) stay bf16: Glyd does not pack them")
    windows = sorted({a.window for a in shape.attention if a.window is not None})
    if windows:
        n = sum(a.window is not None for a in shape.attention)
        notes.append(f"KV cache: {n} of {len(shape.attention)} layers hold at most {'/'.join(map(str, windows))} tokens (sliding window)")
    if shape.text_only:
        notes.append("counted: the language model of a multimodal config (its text_config)")
    if shape.max_positions is not None and context > shape.max_positions:
        notes.append(f"context {context} exceeds the model's max_position_embeddings {shape.max_positions}")
    return notes


def estimate(
    shape: ModelShape, *, gpu_bytes: int, context: int, batch: int = 1, layout: str = "fixed12", folder: Path | None = None
) -> FitEstimate:
    """Memory a model needs on one GPU in bf16 and with Glyd (see the module docstring)."""
    layout_bits(layout)  # an unknown layout: the error names the known ones
    if context <= 0 or batch <= 0 or gpu_bytes <= 0:
        raise GlydError("context, batch and GPU memory must be positive")
    count, bf16, notes = _weights(shape, folder, layout)
    return FitEstimate(
        gpu_bytes=gpu_bytes,
        context=context,
        batch=batch,
        layout=layout,
        weights_bf16=bf16,
        weights_glyd=count.glyd_bytes(layout),
        kv_cache=kv_cache_bytes(shape, context, batch),
        margin=runtime_margin(shape, context, batch, gpu_bytes),
        source=count.source,
        params=shape.params,
        notes=notes + _shape_notes(shape, context),
    )


def max_context(e: FitEstimate, shape: ModelShape, weights: int) -> int:
    """Largest context (tokens a sequence, at ``e.batch``) whose total fits, 0 if none; at most the
    model's ``max_position_embeddings``."""
    lo, hi = 0, shape.max_positions or 1 << 24
    while lo < hi:  # KV and margin grow with the context (sliding layers stop growing), so search
        mid = (lo + hi + 1) // 2
        if weights + kv_cache_bytes(shape, mid, e.batch) + runtime_margin(shape, mid, e.batch, e.gpu_bytes) <= e.gpu_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _gib(b: int) -> str:
    return f"{b / GiB:8.2f} GiB"


def format_table(e: FitEstimate, shape: ModelShape) -> str:
    """The small table ``glyd fit`` prints (sizes in GiB, 2^30 bytes)."""
    gpu = f"{e.gpu} = {e.gpu_bytes / GiB:.2f} GiB" if e.gpu else f"{e.gpu_bytes / GiB:.2f} GiB"
    reserve = max(MARGIN_FIXED, int(RESERVE_FRACTION * e.gpu_bytes))
    rows = [
        ("", "bf16", f"Glyd ({e.layout})"),
        ("weights", _gib(e.weights_bf16), _gib(e.weights_glyd)),
        (f"KV cache ({e.context} tok x {e.batch})", _gib(e.kv_cache), _gib(e.kv_cache)),
        ("runtime margin", _gib(e.margin), _gib(e.margin)),
        ("total", _gib(e.total_bf16), _gib(e.total_glyd)),
        (f"fits in {gpu}", "yes" if e.fits_bf16 else "no", "yes" if e.fits_glyd else "no"),
        (
            f"max context (batch {e.batch})",
            str(max_context(e, shape, e.weights_bf16)),
            str(max_context(e, shape, e.weights_glyd)),
        ),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    lines = [f"{a:<{w0}}  {b:>{w1}}  {c:>{w2}}" for a, b, c in rows]
    lines.insert(1, "-" * len(lines[0]))
    if e.gpu_reading:
        lines.append(f"GPU: {e.gpu_reading}")
    lines.append(f"parameters: {e.params / 1e9:.2f} B; weights from: {e.source}")
    lines.append(
        "KV cache: sum over layers of kv_heads x head_dim x 2 x 2 bytes (bf16) x tokens (at most the layer's window) "
        f"x batch; margin: {reserve / GiB:.2f} GiB reserve (5% of the GPU, at least 1 GiB) + one "
        f"{min(e.context, PREFILL_CHUNK)}-token prefill chunk's activations + last-token logits + a decode step's "
        "keys and values of one layer repeated to every query head"
    )
    lines.extend(f"note: {n}" for n in e.notes)
    return "\n".join(lines)


def run_fit(model: str, gpu: str, context: int, batch: int = 1, layout: str = "fixed12") -> tuple[FitEstimate, str]:
    """``glyd fit``: the estimate for ``model`` (a known name, a folder, a config.json, a packed folder or
    a hub id whose config is in the local Hugging Face cache) on ``gpu``, and its table."""
    card = parse_gpu(gpu)  # a wrong --gpu is said before the model is built
    cfg = load_config(model)
    path = Path(cfg.get("_folder") or model)
    folder = path if path.is_dir() else (path.parent if path.is_file() else None)
    files = None
    if folder is not None:
        try:
            files = count_from_files(folder)
        except FormatError:  # said by estimate, after the config's own errors
            if cfg.get("_hub"):  # a hub snapshot may hold the config and only some weights: the config counts
                folder = None
    # a bf16 folder's names: a tied copy it stores (lm_head beside the embedding) is packed apart by the loader
    shape = model_shape(cfg, files.names if files is not None and files.packed_bytes is None else None)
    e = estimate(shape, gpu_bytes=card.bytes, context=context, batch=batch, layout=layout, folder=folder)
    e.gpu, e.gpu_reading = str(gpu).strip(), card.reading
    stored = cfg.get("_packed_layout")
    if stored is not None and e.source.endswith("as stored"):
        e.layout = f"{stored or 'packed'}, as stored"
    elif not e.fits_glyd:
        e.notes.append(smaller_layout_note(e, shape, folder))
    return e, format_table(e, shape)


def smaller_layout_note(e: FitEstimate, shape: ModelShape, folder: Path | None) -> str:
    """What fits when ``e.layout`` does not: the fastest smaller layout of :data:`SPEED_ORDER` whose
    total fits, and the ``--memory-limit`` that makes ``layout auto`` pick it (the room left for the
    weights by the KV cache and the margin)."""
    count, _, _ = _weights(shape, folder, e.layout)
    room = e.gpu_bytes - e.kv_cache - e.margin
    for name in SPEED_ORDER:
        lay = LAYOUTS.get(name)
        if name == e.layout or lay is None or lay.bits is None:
            continue
        weights = count.glyd_bytes(name)
        if weights <= room:
            limit = math.floor(room / GiB * 100) / 100
            where = "demo, eval, serve" if shape.experts else "pack, demo, eval, serve"  # pack keeps experts bf16
            return (f"{name} fits: weights {weights / GiB:.2f} GiB, total {(weights + e.kv_cache + e.margin) / GiB:.2f} "
                    f"GiB (--layout {name}; or --layout auto --memory-limit {limit:.2f}GiB on {where})")
    return "no layout fits at this context and batch: a shorter --context, a smaller --batch or a larger GPU"

