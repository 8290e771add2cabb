"""What is checked when a packed folder becomes a model, so that a wrong model never comes back silently.

Always (``verify=False`` too; reads only ``glyd.json``, the shard headers and ``config.json``):

* the folder opens as a checkpoint (:class:`glyd.store.CheckpointReader`: manifest, shard headers,
  index), before transformers reads any of it;
* ``config.json`` carries glyd's ``quantization_config`` (without it transformers builds a bf16
  model and fills it at random) and names the manifest's layout;
* no count in ``config.json`` that transformers builds modules or tables from (layers, experts,
  labels) is more than the checkpoint can hold (:func:`check_counts`): a config claiming 10^30
  layers is refused before anything is built; each ``num_experts_per_tok`` is from 1 to its experts
  (:func:`check_top_k`), the class's default count too where the config leaves it out
  (:func:`check_built_top_k`, before any weight is loaded);
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
from typing import Any, Collection

from torch import nn

from glyd.codec import LAYOUTS
from glyd.codec.packed import FORMAT_VERSION
from glyd.errors import CorruptError, FormatError, not_a_file, show_path
from glyd.store import MANIFEST, CheckpointReader
from glyd.store._config import PACKED_MODEL_TYPE, own_model_type
from glyd.store._manifest import MAX_MANIFEST_BYTES, validate_manifest
from glyd.store._safetensors import dtype_name, load_json, read_json_bytes, sha256_file, short
from glyd.store.checkpoint import CONFIG, key_for

log = logging.getLogger(__name__)

__all__ = ["check_folder", "check_complete", "missing_tensors", "check_quantization_config", "check_counts",
           "check_top_k", "check_built_top_k", "count_fields"]

#: config.json keys (at any depth: text_config, vision_config, ...) that transformers and diffusers
#: build one module each of: a model cannot have more than its checkpoint has tensors.
LAYER_KEYS = frozenset({"num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                        "num_encoder_layers", "num_decoder_layers", "num_single_layers"})
#: Keys that size one dimension of a stored tensor (experts: a router's rows, or fused experts'
#: first dimension; labels: a classifier's rows, and a table transformers builds from the count).
WIDTH_KEYS = frozenset({"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_labels"})
#: The experts counts of WIDTH_KEYS, and the key of how many of them a token is routed to.
EXPERT_KEYS = WIDTH_KEYS - {"num_labels"}
TOP_K = "num_experts_per_tok"


def check_quantization_config(q: dict[str, Any], where: str = "") -> None:
    """Raise FormatError naming the field (after ``where``) unless glyd can read the fields of its
    ``quantization_config`` ``q``: a known ``layout`` (or ``"auto"``), this glyd's ``format_version``,
    ``merged`` mapping merged names to their parts as glyd merges them (``MERGE_GROUPS``, in order),
    ``exact`` true or false. Missing fields take GlydConfig's defaults."""
    layout = q.get("layout", "auto")
    if not isinstance(layout, str) or (layout != "auto" and layout not in LAYOUTS):
        raise FormatError(f"{where}quantization_config.layout: unknown layout {short(layout)}")
    fv = q.get("format_version", FORMAT_VERSION)
    if type(fv) is not int or fv != FORMAT_VERSION:
        raise FormatError(f"{where}quantization_config.format_version: {short(fv)} is not supported "
                          f"(this glyd reads {FORMAT_VERSION})")
    exact = q.get("exact", False)
    if not isinstance(exact, bool):  # bool("false") is True
        raise FormatError(f"{where}quantization_config.exact: {short(exact)} is not true or false")
    merged = q.get("merged") or {}
    if not isinstance(merged, dict) or not all(
        isinstance(k, str) and isinstance(v, (list, tuple)) and all(isinstance(p, str) for p in v)
        for k, v in merged.items()
    ):
        raise FormatError(f"{where}quantization_config.merged: must map a name to a list of module names, "
                          f"got {short(merged)}")
    from glyd.hf._model import MERGE_GROUPS

    for name, parts in merged.items():  # the parts' order decides which rows of the merged product each takes
        if MERGE_GROUPS.get(name) != tuple(parts):
            known = "; ".join(f"{k}: {', '.join(v)}" for k, v in MERGE_GROUPS.items())
            raise FormatError(f"{where}quantization_config.merged: {short(name)}: {short(list(parts))} is not a "
                              f"merge glyd writes ({known}, in that order): a damaged or edited config")


def count_fields(config: Any, path: str = ""):
    """(dotted path, key, value) of every int under a counted key of ``config`` (nested dicts and
    lists; JSON read by glyd is at most 64 levels deep)."""
    items = config.items() if isinstance(config, dict) else enumerate(config) if isinstance(config, list) else ()
    for k, v in items:
        key = f"{path}.{k}" if path else str(k)
        if isinstance(v, (dict, list)):
            yield from count_fields(v, key)
        elif k in LAYER_KEYS | WIDTH_KEYS and isinstance(v, int) and not isinstance(v, bool):
            yield key, k, v


def _dicts(config: Any, path: str = ""):
    """(dotted path, dict) of ``config`` and every dict under it (nested dicts and lists)."""
    if isinstance(config, dict):
        yield path, config
    items = config.items() if isinstance(config, dict) else enumerate(config) if isinstance(config, list) else ()
    for k, v in items:
        if isinstance(v, (dict, list)):
            yield from _dicts(v, f"{path}.{k}" if path else str(k))


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_top_k(config: dict[str, Any], where: object) -> None:
    """Raise FormatError (naming ``where`` and the field) unless every ``num_experts_per_tok`` of
    ``config`` is from 1 to the experts count beside it (where there is one, above 0): 0 builds MoE
    blocks that add nothing, more than the experts fails at the first forward, in torch.topk. The
    message names both fields."""
    for path, d in _dicts(config):
        k = d.get(TOP_K)
        field = next((e for e in sorted(EXPERT_KEYS) if _count(d.get(e)) and d[e] > 0), None)
        if field is not None and _count(k) and not 1 <= k <= d[field]:
            key, of = (f"{path}.{TOP_K}", f"{path}.{field}") if path else (TOP_K, field)
            raise FormatError(f"{show_path(where)}: {key} is {short(k)}, not a number of experts from 1 to {d[field]} "
                              f"({of}), the experts each token is routed to: a damaged or edited config")


def check_built_top_k(config: Any, where: object) -> None:
    """:func:`check_top_k` on a transformers config as its class built it (``config.to_dict()``, its
    sub-configs too): a ``num_experts_per_tok`` that config.json gives beside an experts count it
    leaves out is checked against the class's default (Mixtral's 8 experts a layer). ``glyd fit``,
    the bf16 loader and the packed folder's loaders all ask this of the config they build from."""
    check_top_k(config.to_dict(), where)


def check_counts(config: dict[str, Any], shapes: list[list[int]], where: object, *, top_k: bool = True) -> None:
    """Raise FormatError (naming ``where`` and the field) unless every layer count of ``config`` is
    at most the number of stored tensors (``shapes``), and every expert or label count at most
    their largest dimension (or the labels ``id2label`` names): transformers builds a module, or a
    table entry, for each before any weight is read, so a count read from a file is bounded first.
    ``top_k``: also :func:`check_top_k` (what a loader refuses; ``glyd pack`` warns of it)."""
    tensors = len(shapes)
    widest = max((max(s) for s in shapes if s), default=0)
    for key, name, value in count_fields(config):
        labels = config.get("id2label") if name == "num_labels" else None
        most = tensors if name in LAYER_KEYS else max(widest, len(labels) if isinstance(labels, dict) else 0)
        if not 0 <= value <= most:
            what = f"{most} tensors" if name in LAYER_KEYS else f"tensors at most {most} wide"
            raise FormatError(f"{show_path(where)}: {key} is {short(value)}, not a count from 0 to {most} (the "
                              "checkpoint holds "
                              f"{what}): a damaged or edited config; transformers would build a module or an entry "
                              f"for each before reading a weight")
    if top_k:
        check_top_k(config, where)


def stored_shapes(folder: Path) -> list[list[int]] | None:
    """The true shapes of the tensors ``folder``'s glyd.json lists (the manifest alone, checked; no
    shard is read), or None when the folder has no glyd.json: for :func:`check_counts` where
    transformers reads a packed folder's config before glyd sees the folder (native loading)."""
    mpath = folder / MANIFEST
    what = not_a_file(mpath)
    if what == "missing":
        return None
    if what is not None:
        raise FormatError(f"{show_path(mpath)}: {what}, not a regular file: not a glyd manifest")
    m = validate_manifest(load_json(read_json_bytes(mpath, "a glyd manifest", limit=MAX_MANIFEST_BYTES), mpath), mpath)
    return [e["shape"] for e in m["tensors"].values()]


def check_folder(folder: Path, *, verify: bool) -> CheckpointReader:
    """Open ``folder`` as a checkpoint and check its config against its manifest."""
    reader = CheckpointReader(folder)
    cfg = reader.config
    cpath = folder / CONFIG
    if cfg is None:
        raise FormatError(f"{show_path(folder)}: no {CONFIG}: a glyd folder needs the model's config to load")
    q = cfg.get("quantization_config")
    if not isinstance(q, dict) or q.get("quant_method") != "glyd":
        raise FormatError(
            f"{show_path(cpath)}: no glyd quantization_config (quant_method 'glyd'), though {MANIFEST} lists packed "
            "weights: transformers would build a bf16 model and fill it at random. Restore the config.json written "
            f"with the folder (its sha256 is in {MANIFEST}) or pack the model again"
        )
    check_quantization_config(q, f"{show_path(cpath)}: ")
    own = own_model_type(cfg)
    if cfg.get("model_type") == PACKED_MODEL_TYPE and (not isinstance(own, str) or not own or own == PACKED_MODEL_TYPE):
        raise FormatError(f"{show_path(cpath)}: model_type is {PACKED_MODEL_TYPE!r} but "
                          f"quantization_config.original_model_type ({short(own)}) does not name the model's own type")
    check_counts(cfg, [reader.entry(n)["shape"] for n in reader.names()], cpath)
    layout = q.get("layout")
    if layout != reader.layout:
        raise FormatError(f"{show_path(cpath)}: quantization_config.layout is {layout!r} but {MANIFEST} says "
                          f"{reader.layout!r}")
    want = reader.files.get(CONFIG)
    if want is not None and sha256_file(cpath) != want:
        msg = f"{show_path(cpath)}: differs from the config.json recorded in {MANIFEST} (sha256 mismatch)"
        if verify:
            raise CorruptError(f"{msg}; verify=True refuses it")
        log.warning("%s; loading it anyway (verify=True would refuse it)", msg)
    return reader


def ignored(model: nn.Module, attr: str) -> list[re.Pattern]:
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


def tied_output(model: nn.Module) -> set[str]:
    """Names an output projection tied to the input embedding may be stored under."""
    try:
        out = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return set()
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    name = names.get(id(out))
    return {f"{name}.weight"} if name else set()


def missing_tensors(model: nn.Module, provided: Collection[str]) -> list[str]:
    """The tensors of ``model`` that none of the ``provided`` names fills (:func:`check_complete`
    refuses them): not stored, not the same tensor as a stored one (a tie), not one transformers lets be missing."""
    state = model.state_dict(keep_vars=True)
    stored = {id(t) for name, t in state.items() if name in provided}
    skip = ignored(model, "_keys_to_ignore_on_load_missing")
    return [name for name, t in state.items()
            if name not in provided and id(t) not in stored and not any(p.search(name) for p in skip)]


def check_complete(model: nn.Module, manifest: dict[str, Any], where: str | Path) -> None:
    """Raise FormatError unless ``model``'s tensors and the checkpoint's are the same set, every
    stored raw tensor in its stored dtype and shape."""
    provided = _provided(manifest)
    state = model.state_dict(keep_vars=True)
    missing = missing_tensors(model, provided)
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise FormatError(
            f"{show_path(where)}: the checkpoint lacks tensor(s) the model needs: {', '.join(missing[:5])}{more} "
            f"(transformers would initialise them at random)"
        )
    skip = ignored(model, "_keys_to_ignore_on_load_unexpected")
    tied = tied_output(model)
    unused = [k for k in provided if k not in state and k not in tied and not any(p.search(k) for p in skip)]
    if unused:
        more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
        raise FormatError(f"{show_path(where)}: tensor(s) {', '.join(unused[:5])}{more} of the checkpoint have no "
                          "place in the model")
    for name, e in provided.items():
        t = state.get(name)
        if e is None or t is None:
            continue
        got = dtype_name(t.dtype)
        if got != e["dtype"] or list(t.shape) != e["shape"]:
            raise FormatError(
                f"{show_path(where)}: tensor {name!r} is stored as {e['dtype']}{e['shape']} but the model holds "
                f"{got}{list(t.shape)}: glyd never changes a dtype or shape silently"
            )
