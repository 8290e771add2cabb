"""Will a model fit on a GPU, in bf16 and with Glyd? (``glyd fit``)

The estimate is three terms, each printed:

* **weights**: from the model folder's safetensors headers when there are any (exact tensor sizes,
  read without loading a byte of weights; a folder saved by Glyd is counted as stored), else from
  the config's parameter count. With Glyd, every 2-D weight (linears, embedding, lm_head) is held
  packed at the layout's bits a weight; 1-D weights (norms, biases) stay bf16.
* **KV cache** for the context: ``layers x kv_heads x head_dim x 2 (K and V) x 2 bytes (bf16) x
  tokens x batch``. Glyd does not shrink it here (the compressed KV cache is a separate option).
* **runtime margin**: a fixed 1 GiB (CUDA context, cuBLAS/Triton workspaces, allocator slack) plus
  the activations of one prefill chunk of ``min(context, 2048)`` tokens a sequence:
  ``chunk x batch x (4 x hidden + 2 x intermediate) x 2 bytes``, plus fp32 logits of the last token
  (``batch x vocab x 4``).

>>> from glyd.apps.fit import estimate, load_config
>>> e = estimate(load_config("llama-3.1-8b"), gpu_bytes=16 * 2**30, context=8192)
>>> round(e.weights_bf16 / 1e9, 2), e.fits_bf16, e.fits_glyd
(16.06, False, True)
"""

from __future__ import annotations

import json
import logging
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glyd.errors import FormatError, GlydError

log = logging.getLogger(__name__)

GiB = 2**30
#: Bits a weight assumed for a layout when no packed file says otherwise. fixed12 is 12 bits plus
#: its exceptions (about 0.1% of weights at 40 bits each on real weights); tiered is the codec's
#: measured 10.81 on MiniLM + wordllama (benchmarks/RESULTS.md), rounded up.
LAYOUT_BITS = {"fixed12": 12.05, "tiered": 10.85}
MARGIN_FIXED = 1 * GiB
PREFILL_CHUNK = 2048
_BF16 = 2

# Real hyperparameters of a few public models, so ``glyd fit`` works offline.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
        tie_word_embeddings=True, max_position_embeddings=8192,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=32768,
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
    ),
    "qwen2.5-14b": dict(
        model_type="qwen2", hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
        num_attention_heads=40, num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False,
        max_position_embeddings=32768,
    ),
    "llama-3.2-1b": dict(
        model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
        tie_word_embeddings=True, max_position_embeddings=131072,
    ),
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
        tie_word_embeddings=False, max_position_embeddings=131072,
    ),
    "mistral-7b": dict(
        model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=32768,
        tie_word_embeddings=False, max_position_embeddings=32768,
    ),
}


@dataclass
class WeightCount:
    """Weights split by what Glyd does with them: ``packable`` 2-D tensors and the rest (bytes as stored)."""

    packable: int = 0  # elements of 2-D floating tensors that Glyd packs
    other_bytes: int = 0  # 1-D tensors (norms, biases) and anything not packed, in bytes as bf16
    packed_bytes: int | None = None  # a Glyd folder: the packed arrays' bytes as stored
    source: str = "config"

    def bf16_bytes(self) -> int:
        return self.packable * _BF16 + self.other_bytes

    def glyd_bytes(self, layout: str) -> int:
        if self.packed_bytes is not None:
            return self.packed_bytes + self.other_bytes
        return int(round(self.packable * LAYOUT_BITS[layout] / 8)) + self.other_bytes


@dataclass
class FitEstimate:
    """Memory needed on one GPU, in bytes, and whether it fits."""

    gpu_bytes: int
    context: int
    batch: int
    layout: str
    weights_bf16: int
    weights_glyd: int
    kv_cache: int
    margin: int
    source: str
    notes: list[str] = field(default_factory=list)

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


def _config_get(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    return default


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    # Multimodal configs (Gemma 3, Llama 4, ...) keep the language model's numbers in text_config.
    sub = cfg.get("text_config")
    if isinstance(sub, dict) and "hidden_size" in sub:
        merged = dict(sub)
        merged.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings"))
        return merged
    return cfg


def load_config(model: str | Path) -> dict[str, Any]:
    """The config dict of ``model``: a known name (see ``KNOWN_CONFIGS``), a folder or a config.json."""
    key = str(model).lower()
    if key in KNOWN_CONFIGS and not Path(model).exists():
        return dict(KNOWN_CONFIGS[key], _name=key)
    path = Path(model)
    cfg_path = path / "config.json" if path.is_dir() else path
    if not cfg_path.is_file():
        known = ", ".join(KNOWN_CONFIGS)
        raise FormatError(f"{model}: not a model folder, a config.json or a known model ({known})")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{cfg_path}: not a readable JSON config ({exc})") from exc
    if not isinstance(cfg, dict):
        raise FormatError(f"{cfg_path}: a config must be a JSON object")
    cfg = _text_config(cfg)
    cfg["_name"] = str(path)
    return cfg


def _dims(cfg: dict[str, Any]) -> dict[str, int]:
    where = cfg.get("_name", "config")
    try:
        hidden = int(cfg["hidden_size"])
        layers = int(_config_get(cfg, "num_hidden_layers", "n_layer", "num_layers"))
        heads = int(_config_get(cfg, "num_attention_heads", "n_head"))
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{where}: config lacks hidden_size, num_hidden_layers or num_attention_heads") from exc
    kv_heads = int(_config_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_config_get(cfg, "head_dim", default=hidden // heads))
    inter = int(_config_get(cfg, "intermediate_size", "ffn_dim", default=4 * hidden))
    vocab = int(_config_get(cfg, "vocab_size", default=0))
    if min(hidden, layers, heads, kv_heads, head_dim, inter) <= 0 or vocab < 0:
        raise FormatError(f"{where}: config has a non-positive size")
    return dict(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim, inter=inter, vocab=vocab)


def count_from_config(cfg: dict[str, Any]) -> WeightCount:
    """Weights of a decoder-only transformer (Llama/Qwen2/Mistral/Gemma layout) from its config."""
    d = _dims(cfg)
    h, hd = d["hidden"], d["head_dim"]
    q, kv = d["heads"] * hd, d["kv_heads"] * hd
    per_layer_2d = h * q + 2 * h * kv + q * h + 3 * h * d["inter"]
    per_layer_1d = 2 * h
    if cfg.get("attention_bias") or cfg.get("model_type") == "qwen2":  # Qwen2 has q, k, v biases
        per_layer_1d += q + 2 * kv
    tied = bool(cfg.get("tie_word_embeddings", False))
    packable = d["layers"] * per_layer_2d + d["vocab"] * h * (1 if tied else 2)
    other = (d["layers"] * per_layer_1d + h) * _BF16
    return WeightCount(packable=packable, other_bytes=other, source="config")


_MAX_HEADER = 100 * 2**20


def _read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file, read with its length bound-checked first."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise FormatError(f"{path}: truncated safetensors file (no header length)")
        (n,) = struct.unpack("<Q", raw)
        size = path.stat().st_size
        if n == 0 or n > min(_MAX_HEADER, size - 8):
            raise FormatError(f"{path}: safetensors header length {n} is out of bounds for a {size}-byte file")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"{path}: safetensors header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise FormatError(f"{path}: safetensors header is not a JSON object")
    return header


_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8, "BOOL": 1}


def count_from_files(folder: Path) -> WeightCount | None:
    """Weights from the safetensors headers of ``folder`` (None when it has no safetensors files)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():  # a sharded checkpoint: only the shards its index names
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted({folder / str(f) for f in weight_map.values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FormatError(f"{index}: not a valid safetensors index ({exc})") from exc
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FormatError(f"{index}: names missing shard(s) {', '.join(missing[:3])}")
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    glyd_folder = False
    cfg_path = folder / "config.json"
    if cfg_path.is_file():
        try:
            qc = json.loads(cfg_path.read_text()).get("quantization_config") or {}
            glyd_folder = isinstance(qc, dict) and qc.get("quant_method") == "glyd"
        except (OSError, ValueError, AttributeError):
            pass
    glyd_folder = glyd_folder or (folder / "glyd.json").is_file()
    count = WeightCount(source=f"safetensors headers ({len(files)} file{'s' * (len(files) > 1)})")
    packed = 0
    for path in files:
        for name, info in _read_safetensors_header(path).items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape = info["dtype"], [int(s) for s in info["shape"]]
            except (KeyError, TypeError, ValueError) as exc:
                raise FormatError(f"{path}: tensor {name!r} has no valid dtype/shape") from exc
            numel = 1
            for s in shape:
                numel *= s
            itemsize = _ITEMSIZE.get(dtype)
            if itemsize is None:
                raise FormatError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r}")
            if glyd_folder:
                # A Glyd folder: packed arrays are integer planes; float tensors are kept as is.
                if dtype in ("BF16", "F16", "F32", "F64"):
                    count.other_bytes += numel * itemsize
                else:
                    packed += numel * itemsize
            elif dtype in ("BF16", "F16", "F32") and len(shape) == 2:
                count.packable += numel
            elif dtype in ("BF16", "F16", "F32", "F64"):
                count.other_bytes += numel * _BF16
            else:
                count.other_bytes += numel * itemsize
    if glyd_folder:
        count.packed_bytes = packed
        count.source += ", Glyd folder: sizes as stored"
    return count


def kv_cache_bytes(cfg: dict[str, Any], context: int, batch: int = 1, bytes_per_value: int = _BF16) -> int:
    """``layers x kv_heads x head_dim x 2 x bytes x tokens x batch``."""
    d = _dims(cfg)
    return d["layers"] * d["kv_heads"] * d["head_dim"] * 2 * bytes_per_value * context * batch


def runtime_margin(cfg: dict[str, Any], context: int, batch: int = 1) -> int:
    d = _dims(cfg)
    chunk = min(context, PREFILL_CHUNK)
    activations = chunk * batch * (4 * d["hidden"] + 2 * d["inter"]) * _BF16
    return MARGIN_FIXED + activations + batch * d["vocab"] * 4


def estimate(
    cfg: dict[str, Any], *, gpu_bytes: int, context: int, batch: int = 1, layout: str = "fixed12", folder: Path | None = None
) -> FitEstimate:
    """Memory a model needs on one GPU in bf16 and with Glyd (see the module docstring)."""
    if layout not in LAYOUT_BITS:
        raise GlydError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUT_BITS)}")
    if context <= 0 or batch <= 0 or gpu_bytes <= 0:
        raise GlydError("context, batch and GPU memory must be positive")
    count = count_from_files(folder) if folder is not None else None
    if count is None:
        count = count_from_config(cfg)
    notes = []
    if count.packed_bytes is not None:
        notes.append("bf16 weights of a Glyd folder: 2 bytes for every packed weight (from the config)")
        bf16 = count_from_config(cfg).bf16_bytes()
    else:
        bf16 = count.bf16_bytes()
        notes.append(f"Glyd weights at {LAYOUT_BITS[layout]} bits a packed weight ({layout})")
    max_pos = cfg.get("max_position_embeddings")
    if isinstance(max_pos, int) and context > max_pos:
        notes.append(f"context {context} exceeds the model's max_position_embeddings {max_pos}")
    return FitEstimate(
        gpu_bytes=gpu_bytes,
        context=context,
        batch=batch,
        layout=layout,
        weights_bf16=bf16,
        weights_glyd=count.glyd_bytes(layout),
        kv_cache=kv_cache_bytes(cfg, context, batch),
        margin=runtime_margin(cfg, context, batch),
        source=count.source,
        notes=notes,
    )


def max_context(e: FitEstimate, cfg: dict[str, Any], weights: int) -> int:
    """Largest context (tokens a sequence, at ``e.batch``) whose total fits, 0 if none; at most the
    model's ``max_position_embeddings``."""
    per_token = kv_cache_bytes(cfg, 1, e.batch)
    lo, hi = 0, 1 << 24
    max_pos = cfg.get("max_position_embeddings")
    if isinstance(max_pos, int) and max_pos > 0:
        hi = max_pos
    while lo < hi:  # margin grows with the context up to the prefill chunk, so search
        mid = (lo + hi + 1) // 2
        if weights + per_token * mid + runtime_margin(cfg, mid, e.batch) <= e.gpu_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(gib|gb|g|mib|mb|m|tib|tb|t)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """GPU memory in bytes from ``"24GB"``, ``"80GiB"``, ``"24"`` (GiB) or ``"16000MB"``.

    GPU makers' "GB" are GiB (a "24 GB" card has 24 GiB), so GB and GiB mean the same here.

    >>> parse_size("24GB") == 24 * 2**30
    True
    """
    m = _SIZE.match(str(text))
    if not m:
        raise GlydError(f"--gpu {text!r}: give a memory size such as 24GB, 80GiB or 16000MB")
    value, unit = float(m.group(1)), (m.group(2) or "g").lower()[0]
    scale = {"m": 2**20, "g": GiB, "t": 2**40}[unit]
    size = int(value * scale)
    if size <= 0:
        raise GlydError(f"--gpu {text!r}: must be positive")
    return size


def format_table(e: FitEstimate, cfg: dict[str, Any]) -> str:
    """The small table ``glyd fit`` prints."""
    g = lambda b: f"{b / GiB:8.2f} GiB"  # noqa: E731
    rows = [
        ("", "bf16", f"Glyd ({e.layout})"),
        ("weights", g(e.weights_bf16), g(e.weights_glyd)),
        (f"KV cache ({e.context} tok x {e.batch})", g(e.kv_cache), g(e.kv_cache)),
        ("runtime margin", g(e.margin), g(e.margin)),
        ("total", g(e.total_bf16), g(e.total_glyd)),
        (f"fits in {e.gpu_bytes / GiB:.1f} GiB", "yes" if e.fits_bf16 else "no", "yes" if e.fits_glyd else "no"),
        (
            f"max context (batch {e.batch})",
            str(max_context(e, cfg, e.weights_bf16)),
            str(max_context(e, cfg, e.weights_glyd)),
        ),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    lines = [f"{a:<{w0}}  {b:>{w1}}  {c:>{w2}}" for a, b, c in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.append(f"weights from: {e.source}")
    lines.append(
        "KV cache: layers x kv_heads x head_dim x 2 x 2 bytes (bf16) x tokens x batch; "
        f"margin: 1 GiB + one {min(e.context, PREFILL_CHUNK)}-token prefill chunk's activations + last-token logits"
    )
    lines.extend(f"note: {n}" for n in e.notes)
    return "\n".join(lines)


def run_fit(model: str, gpu: str, context: int, batch: int = 1, layout: str = "fixed12") -> tuple[FitEstimate, str]:
    cfg = load_config(model)
    path = Path(model)
    folder = path if path.is_dir() else (path.parent if path.is_file() else None)
    e = estimate(cfg, gpu_bytes=parse_size(gpu), context=context, batch=batch, layout=layout, folder=folder)
    stored = (cfg.get("quantization_config") or {}) if isinstance(cfg.get("quantization_config"), dict) else {}
    if stored.get("quant_method") == "glyd" and e.source.endswith("as stored"):
        e.layout = f"{stored.get('layout', 'packed')}, as stored"
    return e, format_table(e, cfg)
