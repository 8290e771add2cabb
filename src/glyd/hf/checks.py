"""What is checked when a packed folder becomes a model, so that a wrong model never comes back silently.

Always (``verify=False`` too; reads only ``glyd.json``, the shard headers and ``config.json``):

* the folder opens as a checkpoint (:class:`glyd.store.CheckpointReader`: manifest, shard headers,
  index), before transformers reads any of it;
* ``config.json`` carries glyd's ``quantization_config`` (without it transformers builds a bf16
  model and fills it at random) and names the manifest's layout;
* after loading, the model and the checkpoint hold the same tensors: every tensor of the model was
  loaded from the checkpoint (none initialised at random), every tensor of the checkpoint found its
  place in the model, in its stored dtype and shape.

A ``config.json`` whose sha256 differs from the manifest's is a warning (a user may edit a config);
``verify=True`` makes it an error and re-hashes every loaded weight (:func:`glyd.verify`).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from torch import nn

from glyd.codec import LAYOUTS
from glyd.codec.packed import FORMAT_VERSION
from glyd.errors import CorruptError, FormatError
from glyd.store import MANIFEST, CheckpointReader
from glyd.store._config import PACKED_MODEL_TYPE, own_model_type
from glyd.store._safetensors import dtype_name, sha256_file, short
from glyd.store.checkpoint import CONFIG, key_for

log = logging.getLogger(__name__)

__all__ = ["check_folder", "check_complete", "check_quantization_config"]


def check_quantization_config(q: dict[str, Any], where: str = "") -> None:
    """Raise FormatError naming the field (after ``where``) unless glyd can read the fields of its
    ``quantization_config`` ``q``: a known ``layout`` (or ``"auto"``), this glyd's ``format_version``,
    ``merged`` mapping names to lists of module names. Missing fields take GlydConfig's defaults."""
    layout = q.get("layout", "auto")
    if not isinstance(layout, str) or (layout != "auto" and layout not in LAYOUTS):
        raise FormatError(f"{where}quantization_config.layout: unknown layout {short(layout)}")
    fv = q.get("format_version", FORMAT_VERSION)
    if type(fv) is not int or fv != FORMAT_VERSION:
        raise FormatError(f"{where}quantization_config.format_version: {short(fv)} is not supported "
                          f"(this glyd reads {FORMAT_VERSION})")
    merged = q.get("merged") or {}
    if not isinstance(merged, dict) or not all(
        isinstance(k, str) and isinstance(v, (list, tuple)) and all(isinstance(p, str) for p in v)
        for k, v in merged.items()
    ):
        raise FormatError(f"{where}quantization_config.merged: must map a name to a list of module names, "
                          f"got {short(merged)}")


def check_folder(folder: Path, *, verify: bool) -> CheckpointReader:
    """Open ``folder`` as a checkpoint and check its config against its manifest."""
    reader = CheckpointReader(folder)
    cfg = reader.config
    cpath = folder / CONFIG
    if cfg is None:
        raise FormatError(f"{folder}: no {CONFIG}: a glyd folder needs the model's config to load")
    q = cfg.get("quantization_config")
    if not isinstance(q, dict) or q.get("quant_method") != "glyd":
        raise FormatError(
            f"{cpath}: no glyd quantization_config (quant_method 'glyd'), though {MANIFEST} lists packed weights: "
            f"transformers would build a bf16 model and fill it at random. Restore the config.json written "
            f"with the folder (its sha256 is in {MANIFEST}) or pack the model again"
        )
    check_quantization_config(q, f"{cpath}: ")
    own = own_model_type(cfg)
    if cfg.get("model_type") == PACKED_MODEL_TYPE and (not isinstance(own, str) or not own or own == PACKED_MODEL_TYPE):
        raise FormatError(f"{cpath}: model_type is {PACKED_MODEL_TYPE!r} but quantization_config.original_model_type "
                          f"({short(own)}) does not name the model's own type")
    layout = q.get("layout")
    if layout != reader.layout:
        raise FormatError(f"{cpath}: quantization_config.layout is {layout!r} but {MANIFEST} says {reader.layout!r}")
    want = reader.files.get(CONFIG)
    if want is not None and sha256_file(cpath) != want:
        msg = f"{cpath}: differs from the config.json recorded in {MANIFEST} (sha256 mismatch)"
        if verify:
            raise CorruptError(f"{msg}; verify=True refuses it")
        log.warning("%s; loading it anyway (verify=True would refuse it)", msg)
    return reader


def _ignored(model: nn.Module, attr: str) -> list[re.Pattern]:
    return [re.compile(p) for p in (getattr(model, attr, None) or [])]


def _provided(manifest: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """Every stored key -> its raw entry (None for a packed array's key)."""
    keys: dict[str, dict[str, Any] | None] = {}
    for name, e in manifest["tensors"].items():
        if e["kind"] == "packed":
            keys.update({key_for(name, a): None for a in e["arrays"]})
        else:
            keys[name] = e
    return keys


def _tied_output(model: nn.Module) -> set[str]:
    """Names an output projection tied to the input embedding may be stored under."""
    try:
        out = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return set()
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    name = names.get(id(out))
    return {f"{name}.weight"} if name else set()


def check_complete(model: nn.Module, manifest: dict[str, Any], where: str | Path) -> None:
    """Raise FormatError unless ``model``'s tensors and the checkpoint's are the same set, every
    stored raw tensor in its stored dtype and shape."""
    provided = _provided(manifest)
    state = model.state_dict(keep_vars=True)
    by_id: dict[int, str] = {}
    missing: list[str] = []
    for name, t in state.items():
        if name in provided:
            by_id.setdefault(id(t), name)
    for name, t in state.items():
        if name in provided or by_id.get(id(t)) is not None:  # stored, or the same tensor as a stored one
            continue
        if any(p.search(name) for p in _ignored(model, "_keys_to_ignore_on_load_missing")):
            continue
        missing.append(name)
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise FormatError(
            f"{where}: the checkpoint lacks tensor(s) the model needs: {', '.join(missing[:5])}{more} "
            f"(transformers would initialise them at random)"
        )
    skip = _ignored(model, "_keys_to_ignore_on_load_unexpected")
    tied = _tied_output(model)
    unused = [k for k in provided if k not in state and k not in tied and not any(p.search(k) for p in skip)]
    if unused:
        more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
        raise FormatError(f"{where}: tensor(s) {', '.join(unused[:5])}{more} of the checkpoint have no place in the model")
    for name, e in provided.items():
        t = state.get(name)
        if e is None or t is None:
            continue
        got = dtype_name(t.dtype)
        if got != e["dtype"] or list(t.shape) != e["shape"]:
            raise FormatError(
                f"{where}: tensor {name!r} is stored as {e['dtype']}{e['shape']} but the model holds "
                f"{got}{list(t.shape)}: glyd never changes a dtype or shape silently"
            )
