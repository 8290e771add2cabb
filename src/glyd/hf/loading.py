"""Load and pack transformers models (causal LMs, encoders, ...) with glyd-packed weights.

* :func:`from_pretrained` reads a bf16 model folder (packing each weight as it streams in, one
  tensor at a time, ``glyd.hf.bf16``) or a folder written by glyd (nothing is packed again;
  transformers loads it through glyd's quantizer, ``glyd.hf.skeleton``). The transformers class
  is ``model_class=`` or the one config.json names (``glyd.hf.classes``).
* :func:`compress` packs a model already in memory, in place.

Saving is ``glyd.hf.save``, re-hashing ``glyd.hf.integrity``; which modules are packed is said in
``glyd.hf._model``.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from glyd.errors import FormatError, GlydError, MissingDependencyError, UnsupportedError, cause, show_path
from glyd.hf import hooks
from glyd.hf._model import check_layout, is_merged, note_source, pick_device, source_of
from glyd.hf._register import register
from glyd.hf.bf16 import load_bf16, resolve, subfolder_of
from glyd.hf.classes import check_model_type, pick_class, read_config
from glyd.hf.checks import check_folder
from glyd.hf.integrity import verify_files, verify_model
from glyd.hf.memory import WeightsCount, check_packed, check_stored, fit_layout, parse_memory
from glyd.hf.merge import merge_packed, unmerge_packed
from glyd.hf.packer import Packer
from glyd.nn.experts import GlydExperts
from glyd.nn.modules import GlydEmbedding, GlydLinear, set_exact
from glyd.store import MANIFEST
from glyd.store._safetensors import sha256_file
from glyd.store.checkpoint import CONFIG

log = logging.getLogger(__name__)

#: ``from_pretrained(kv=...)``: the page code of glyd's KV cache for each (``glyd.kv.generate.wire``).
KV_CODES = {None: None, "lossless": "kvf12", "lossless-tiered": "kvtiered"}
#: Old names, still taken (with a DeprecationWarning).
OLD_KV = {"lossless-dense": "lossless-tiered"}

__all__ = ["from_pretrained", "compress"]


def from_pretrained(
    name_or_path: str | os.PathLike,
    *,
    layout: str = "auto",
    exact: bool = False,
    verify: bool = False,
    device: str | torch.device | None = None,
    merge: bool | None = None,
    kv: str | None = None,
    progress: bool = True,
    model_class: Any = None,
    memory_limit: int | str | None = None,
    **hf_kwargs: Any,
) -> nn.Module:
    """Load a transformers model with packed weights: a causal LM ready for ``generate()``, an
    encoder, a classifier, ...

    ``name_or_path`` is a bf16 transformers folder (or Hub id) with safetensors weights, or a folder
    written by :func:`save_pretrained` / ``glyd pack`` (loaded as it is: nothing is packed again).
    A bf16 model is packed as it streams in, one tensor at a time and on ``device`` (default: the
    GPU when there is one), so neither the host nor the GPU ever holds the whole bf16 model.

    ``layout``: ``"fixed12"``, ``"tiered"``, ``"dense11"`` or ``"auto"`` (chosen per matrix and device).
    ``memory_limit`` (bytes, ``"40GB"``, ``"40GiB"``): the most the weights may take, counted as ``glyd fit``
    does (``glyd.hf.memory``); ``"auto"`` then packs the whole model in the fastest layout that fits.
    ``exact=True`` computes every product as bf16 does (unpack, then ``F.linear``): logits equal
    the bf16 model's bit for bit. ``merge`` runs q|k|v and gate|up as one product each (default:
    on for a GPU, off on the CPU). ``verify=True`` re-hashes every weight against the sha256
    recorded when it was packed. ``kv="lossless"`` gives each ``generate`` call glyd's compressed KV cache,
    a static pool of ``kvf12`` pages sized for the call and read by the fused attention (``glyd.kv.generate``);
    ``kv="lossless-tiered"`` a growing cache of the denser ``kvtiered`` pages (``"lossless-dense"``, its old
    name, still works). Other keyword arguments go to transformers (``attn_implementation=...``,
    ``trust_remote_code=...``); ``subfolder=`` loads the model in a folder inside ``name_or_path``.

    ``model_class``: the transformers class to build, or its name (``AutoModel``,
    ``"AutoModelForSequenceClassification"``, ``BertModel``, ...). Left out: the class config.json's
    ``architectures`` names (the one the checkpoint was saved from), else ``AutoModelForCausalLM``.

    ``device_map`` (instead of ``device``) places the model as transformers' does: ``"cpu"``,
    ``{"": "cuda:0"}``, ``"auto"`` or a dict of module names to devices; each packed layer's
    buffers go with their module. Offloading packed layers to the CPU or disk is refused
    (``glyd.UnsupportedError``), and so is a ``dtype`` other than bfloat16.

    >>> import glyd                                                       # doctest: +SKIP
    >>> model = glyd.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")  # doctest: +SKIP
    >>> model.generate(**tok("Hello", return_tensors="pt").to(model.device))  # doctest: +SKIP
    >>> encoder = glyd.from_pretrained("path/to/minilm", model_class="AutoModel", exact=True)  # doctest: +SKIP
    >>> small = glyd.from_pretrained("Qwen/Qwen2.5-7B", memory_limit="14GiB")  # doctest: +SKIP
    """
    check_layout(layout)
    limit = None if memory_limit is None else parse_memory(memory_limit)
    kv = _kv_arg(kv)
    hf_kwargs = dict(hf_kwargs)
    device_map = hf_kwargs.pop("device_map", None)
    if device is not None and device_map is not None:
        raise UnsupportedError(f"device={device!r} and device_map={device_map!r}: pass one of them")
    dev = pick_device(device)
    sub = hf_kwargs.pop("subfolder", None)  # a model inside a folder (a pipeline's text_encoder/)
    path = resolve(name_or_path, hf_kwargs)
    if sub is not None:
        path = subfolder_of(path, sub)
    if os.path.lexists(path / MANIFEST):  # a glyd folder (CheckpointReader says if glyd.json is not a file)
        model = _load_glyd(path, model_class, device=dev, device_map=device_map, exact=exact, verify=verify,
                           hf_kwargs=hf_kwargs, limit=limit)
        if verify:
            verify_model(model, progress=progress)
            verify_files(path)
        _match_merge(model, merge, exact, path)
    else:
        for k in ("revision", "token", "cache_dir"):  # used to fetch the folder; not model options
            hf_kwargs.pop(k, None)
        cls = pick_class(model_class, read_config(path))
        model = load_bf16(path, cls, layout=layout, merge=None if merge is None else bool(merge), exact=exact,
                          device=dev, progress=progress, hf_kwargs=hf_kwargs, device_map=device_map,
                          memory_limit=limit)
        if verify:
            verify_model(model, progress=progress)
    if kv is not None:
        _wire_kv(model, KV_CODES[kv])
    return model


def _kv_arg(kv: Any) -> Any:
    if kv in OLD_KV:
        warnings.warn(f"kv={kv!r} is deprecated: kv={OLD_KV[kv]!r}", DeprecationWarning, stacklevel=3)
        kv = OLD_KV[kv]
    if kv not in KV_CODES:
        raise ValueError(f"kv must be one of {list(KV_CODES)}, got {kv!r}")
    return kv


def _match_merge(model: nn.Module, merge: Any, exact: bool, path: Path) -> None:
    # a glyd folder keeps the merging it was saved with unless merge= asks otherwise
    if merge is True and not is_merged(model):
        log.info("%s was saved unmerged: merging q|k|v and gate|up (repacks those matrices)", show_path(path))
        merge_packed(model, exact)
    elif merge is False and is_merged(model):
        log.info("%s was saved merged: splitting q|k|v and gate|up (repacks those matrices)", show_path(path))
        unmerge_packed(model, exact)


def _load_glyd(path: Path, model_class: Any, *, device: torch.device, device_map: Any, exact: bool, verify: bool,
               hf_kwargs: dict[str, Any], limit: int | None = None) -> nn.Module:
    if not register():
        raise MissingDependencyError(f"{show_path(path)}: loading a glyd folder needs transformers "
                                     f"(pip install 'glyd-lossless[models]')")

    # Before transformers reads the folder: glyd's errors, not its.
    reader = check_folder(path, verify=verify)
    if limit is not None:
        check_stored(path, sorted({e["file"] for e in reader.manifest["tensors"].values()}), limit)  # the shards
    config = read_config(path)
    cls = pick_class(model_class, config)
    check_model_type(cls, config, path / CONFIG)
    cpath = path / CONFIG
    edited = reader.files.get(CONFIG) not in (None, sha256_file(cpath))

    kw = dict(hf_kwargs)
    # A device_map is transformers' to apply; the quantizer refuses what glyd cannot run (validate_environment).
    kw["device_map"] = str(device) if device_map is None else device_map
    try:
        model = cls.from_pretrained(str(path), **kw)
    except GlydError:
        raise
    except Exception as exc:
        if not edited:
            if _config_builds(path, cls, kw):
                raise  # not the config's fault (out of memory, a device): transformers' own error
            # glyd pack packs such a folder with a warning (unpack gives it back); loading it fails here
            raise FormatError(f"{show_path(path)}: transformers cannot build the model its {CONFIG} describes "
                              f"({cause(exc)})") from exc
        # The config is not the one packed with the weights (check_folder warned): what transformers
        # cannot build from it is that file's fault, said on one line.
        why = " ".join(str(exc).split())
        why = why if len(why) <= 300 else why[:297] + "..."
        raise FormatError(f"{show_path(cpath)}: differs from the config.json recorded in {MANIFEST} and transformers "
                          f"cannot load the model from it ({type(exc).__name__}: {why})") from exc
    set_exact(model, exact)
    return model


def _config_builds(path: Path, cls: Any, kw: dict[str, Any]) -> bool:
    """Whether transformers reads ``path``'s config and builds ``cls`` from it on the meta device (nothing
    allocated): asked after a failed load, to tell a config it cannot build from any other failure."""
    from transformers import AutoConfig

    from glyd.hf.classes import build_empty
    from glyd.hf.pack_plan import safe_creation

    trust = {k: kw[k] for k in ("trust_remote_code",) if k in kw}
    try:
        config = AutoConfig.from_pretrained(str(path), **trust)
        with torch.device("meta"), safe_creation():
            build_empty(cls, config, **trust)
    except Exception:
        return False
    return True


def _wire_kv(model: nn.Module, code: str) -> None:
    try:
        from glyd.kv import generate as kv_generate
    except ImportError:
        kv_generate = None
    if kv_generate is None:
        raise NotImplementedError("kv='lossless' needs glyd.kv.generate, which this build of glyd does not have yet")
    kv_generate.wire(model, code)


def compress(model: nn.Module, *, layout: str = "auto", merge: bool | None = None, exact: bool = False,
             progress: bool = True, memory_limit: int | str | None = None) -> nn.Module:
    """Pack a loaded bf16 model in place (each weight packed where it lives); returns the model.

    Any transformers model (or ``nn.Module``): every ``nn.Linear`` and ``nn.Embedding`` with a 2-D
    weight is packed (``glyd.hf._model``); what is left as it is gets one log line (INFO).
    ``memory_limit`` chooses or checks the layout as :func:`from_pretrained`'s does, before packing.

    >>> import torch, glyd                                                # doctest: +SKIP
    >>> model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)  # doctest: +SKIP
    >>> glyd.compress(model, layout="fixed12")                            # doctest: +SKIP
    >>> encoder = glyd.compress(AutoModel.from_pretrained(path, dtype=torch.bfloat16), exact=True)  # doctest: +SKIP
    """
    check_layout(layout)
    limit = None if memory_limit is None else parse_memory(memory_limit)
    if any(isinstance(m, (GlydLinear, GlydEmbedding, GlydExperts)) for m in model.modules()):
        raise ValueError("this model is already packed by glyd")
    if limit is not None:
        count = WeightsCount.of(model)
        layout = fit_layout(count, layout, limit)
    if merge is None:
        merge = any(p.is_cuda for p in model.parameters())
    packer = Packer(model, layout=layout, merge=bool(merge), exact=exact, device=None)
    todo = [(n, p) for n, p in model.named_parameters(remove_duplicate=False) if packer.wants(n)]
    try:
        for name, p in tqdm(todo, desc="glyd: packing", unit="tensor", disable=not progress):
            if p.is_meta:
                raise FormatError(f"tensor {name!r} is on the meta device: load the model's weights first")
            packer.feed(name, p.detach())
    finally:
        packer.close()
    packer.finish("model")
    if limit is not None:
        check_packed(packer, count, limit)
    note_source(model, source_of(model), None)
    return hooks.wire(model)
