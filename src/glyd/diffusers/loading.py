"""Pack and load diffusers models (FLUX, SD3, DiT transformers, any ``diffusers.ModelMixin``).

* :func:`compress` packs a loaded bf16 diffusers model in place (the same packer as transformers
  models: every ``nn.Linear`` and ``nn.Embedding`` by type and shape, ``glyd.hf.packer``).
* :func:`from_pretrained` loads a glyd folder written by :func:`glyd.diffusers.save_pretrained`
  (nothing is packed again), or a bf16 diffusers folder, packing each weight as it streams in.

The model is built from config.json on the meta device and filled one tensor at a time on
``device``: neither the host nor the GPU ever holds the whole bf16 model.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from glyd.diffusers._detect import folder_config, is_diffusers_class, is_diffusers_config, is_diffusers_model
from glyd.diffusers.save import WEIGHTS_NAME, wire
from glyd.errors import FormatError, MissingDependencyError, UnsupportedError, cause
from glyd.hf._model import check_layout, note_source, pick_device, set_tensor
from glyd.hf.checks import check_counts, check_folder
from glyd.hf.integrity import verify_files, verify_model
from glyd.hf.loading import compress as _compress_any
from glyd.hf.memory import WeightsCount, check_packed, check_stored, fit_layout, parse_memory
from glyd.hf.packer import Packer
from glyd.hf.skeleton import finish_skeleton, prepare_skeleton
from glyd.nn.modules import set_exact
from glyd.store import MANIFEST
from glyd.store._config import already_quantized, plain_config, pipeline_hint
from glyd.store._safetensors import load_json, read_header, read_json_bytes

log = logging.getLogger(__name__)

__all__ = ["compress", "from_pretrained"]

#: Keyword arguments that only say where to fetch a Hub folder from.
HUB_KWARGS = ("revision", "token", "cache_dir")


def _diffusers() -> Any:
    try:
        import diffusers
    except ImportError:
        raise MissingDependencyError("diffusers models need diffusers (pip install 'glyd-lossless[diffusion]')") from None
    return diffusers


def compress(model: nn.Module, *, layout: str = "auto", exact: bool = False, progress: bool = True,
             memory_limit: int | str | None = None) -> nn.Module:
    """Pack a loaded bf16 diffusers model in place; returns the model, ready for its pipeline.

    Every ``nn.Linear`` / ``nn.Embedding`` is packed; the rest (norms, convolutions) is left as it is
    (one INFO line says what). ``exact=True``: every product as bf16 computes it, so a pipeline's
    image equals bf16's bit for bit for the same seed. ``model.save_pretrained(dir)`` then writes a
    glyd folder in diffusers' layout. ``memory_limit``: as ``glyd.hf.compress``'s (``glyd.hf.memory``).

    >>> import torch, glyd                                                   # doctest: +SKIP
    >>> pipe = FluxPipeline.from_pretrained(path, torch_dtype=torch.bfloat16)  # doctest: +SKIP
    >>> glyd.compress(pipe.transformer, exact=True)                          # doctest: +SKIP
    >>> image = pipe("a lighthouse at dusk", generator=torch.Generator().manual_seed(0)).images[0]  # doctest: +SKIP
    """
    if not is_diffusers_model(model):
        raise TypeError(f"glyd.diffusers.compress takes a diffusers model (ModelMixin), got {type(model).__name__}")
    # No merging: diffusers names its projections to_q/to_k/to_v, which glyd does not merge.
    _compress_any(model, layout=layout, merge=False, exact=exact, progress=progress, memory_limit=memory_limit)
    return wire(model)


def from_pretrained(name_or_path: str | os.PathLike, *, subfolder: str | None = None, model_class: Any = None,
                    layout: str = "auto", exact: bool = False, verify: bool = False,
                    device: str | torch.device | None = None, progress: bool = True,
                    memory_limit: int | str | None = None, **hub_kwargs: Any) -> nn.Module:
    """Load a diffusers model with packed weights, for use in its pipeline unchanged.

    ``name_or_path``: a glyd folder in diffusers' layout (:func:`glyd.diffusers.save_pretrained`;
    loaded as it is), or a bf16 diffusers model folder (packed as it streams in, with ``layout``),
    or a pipeline folder (or Hub id) with ``subfolder="transformer"``. ``model_class``: the diffusers
    class or its name (default: config.json's ``_class_name``). ``exact=True`` computes every
    product as bf16 does; ``verify=True`` re-hashes every weight. ``device``: default the GPU if any.
    ``revision=``, ``token=``, ``cache_dir=`` are for fetching a Hub id. ``memory_limit``: the layout
    chosen or checked before packing, as ``glyd.hf.from_pretrained``'s (``glyd.hf.memory``).

    >>> import glyd, diffusers                                             # doctest: +SKIP
    >>> transformer = glyd.from_pretrained("flux-glyd", subfolder="transformer", exact=True)  # doctest: +SKIP
    >>> pipe = diffusers.FluxPipeline.from_pretrained("FLUX.1-dev", transformer=transformer)  # doctest: +SKIP
    """
    _diffusers()
    check_layout(layout)
    limit = None if memory_limit is None else parse_memory(memory_limit)
    bad = sorted(set(hub_kwargs) - set(HUB_KWARGS))
    if bad:
        raise TypeError(f"from_pretrained got unexpected keyword argument(s) {', '.join(bad)} for a diffusers model")
    dev = pick_device(device)
    path = _resolve(name_or_path, subfolder, hub_kwargs)
    config = folder_config(path)
    if not config:
        raise FormatError(f"{path}: no readable config.json: not a diffusers model folder{pipeline_hint(path)}")
    cls = pick_class(model_class, config, path)
    if (path / MANIFEST).is_file():
        model = _load_glyd(path, cls, dev, exact=exact, verify=verify, limit=limit)
    else:
        model = _load_bf16(path, cls, config, dev, layout=layout, exact=exact, progress=progress, limit=limit)
    if verify:
        verify_model(model, progress=progress)
        if (path / MANIFEST).is_file():
            verify_files(path)
    return wire(model.eval())


def _resolve(name_or_path: str | os.PathLike, subfolder: str | None, hub_kwargs: dict[str, Any]) -> Path:
    if subfolder is not None and (not isinstance(subfolder, str) or not subfolder or ".." in Path(subfolder).parts
                                  or Path(subfolder).is_absolute()):  # p / "/abs" would be "/abs"
        raise ValueError(f"subfolder={subfolder!r} must name a folder inside the model folder")
    p = Path(name_or_path)
    if not p.is_dir():
        s = str(name_or_path)
        if p.exists() or s.count("/") != 1 or s.startswith((".", "/", "~")):
            raise FormatError(f"{s}: no such model folder")
        from huggingface_hub import snapshot_download

        pattern = f"{subfolder}/*" if subfolder else "*"
        try:
            p = Path(snapshot_download(s, allow_patterns=[pattern], **hub_kwargs))
        except Exception as exc:
            raise FormatError(f"{s}: not a local folder and it could not be fetched from the Hub ({exc})") from exc
    path = p / subfolder if subfolder else p
    if not path.is_dir():
        raise FormatError(f"{path}: no such folder (subfolder={subfolder!r})")
    return path


def pick_class(choice: Any, config: dict[str, Any], path: Path) -> type:
    """The diffusers model class: ``choice`` (a class or its name), else config.json's ``_class_name``."""
    diffusers = _diffusers()
    if choice is None:
        if not is_diffusers_config(config):
            raise FormatError(f"{path / 'config.json'}: not a diffusers config (no _class_name or _diffusers_version); "
                              f"pass model_class=")
        choice = config.get("_class_name")
    cls = getattr(diffusers, choice, None) if isinstance(choice, str) else choice
    if not is_diffusers_class(cls):
        raise UnsupportedError(f"model_class={choice!r}: not a diffusers model class (e.g. FluxTransformer2DModel, "
                               f"SD3Transformer2DModel)")
    named = config.get("_class_name")
    if isinstance(named, str) and named != cls.__name__:
        log.info("%s: config.json names %s; building %s as asked", path, named, cls.__name__)
    return cls


def _build_empty(cls: type, config: dict[str, Any], path: Path) -> nn.Module:
    from accelerate import init_empty_weights

    try:
        with init_empty_weights(include_buffers=False):
            return cls.from_config(plain_config(config))
    # a negative width (RuntimeError from torch), a class without from_config (ModelMixin itself)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, RuntimeError, ArithmeticError) as exc:
        raise FormatError(f"{path / 'config.json'}: {cls.__name__} cannot be built from it ({cause(exc)})") from exc


def _finish(model: nn.Module, device: torch.device, path: Path) -> nn.Module:
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise FormatError(f"{path}: the checkpoint lacks tensor(s) the model needs: {', '.join(left[:5])}")
    # As diffusers' from_pretrained(torch_dtype=torch.bfloat16): buffers built from the config are bf16 too.
    stored = set(model.state_dict())
    for name, b in list(model.named_buffers()):
        if name not in stored and b.is_floating_point():
            set_tensor(model, name, b.to(torch.bfloat16))
    return model.to(device)


def _load_glyd(path: Path, cls: type, device: torch.device, *, exact: bool, verify: bool,
               limit: int | None = None) -> nn.Module:
    """A glyd folder: the model on the meta device, packed modules of the stored shapes, filled."""
    from safetensors import safe_open

    reader = check_folder(path, verify=verify)
    config = reader.config or {}
    model = _build_empty(cls, config, path)
    manifest = prepare_skeleton(model, path, exact=exact)
    files = sorted({e["file"] for e in manifest["tensors"].values()})
    if limit is not None:
        check_stored(path, files, limit)
    for f in files:
        with safe_open(str(path / f), framework="pt", device=str(device)) as st:
            for key in read_header(path / f).keys_in_file_order():
                try:
                    t = st.get_tensor(key)
                except Exception as exc:  # safetensors' own error types
                    raise FormatError(f"{path / f}: tensor {key!r}: cannot read: {exc}") from exc
                try:
                    placed = set_tensor(model, key, t)
                except FormatError as exc:  # another shape than the model's
                    raise FormatError(f"{path / f}: {exc}") from None
                if not placed:
                    raise FormatError(f"{path / f}: tensor {key!r} has no place in {cls.__name__}")
    model = _finish(model, device, path)
    finish_skeleton(model, path, manifest)
    set_exact(model, exact)
    return model


def _load_bf16(path: Path, cls: type, config: dict[str, Any], device: torch.device, *, layout: str, exact: bool,
               progress: bool, limit: int | None = None) -> nn.Module:
    """A bf16 diffusers folder: each weight packed on ``device`` as it streams in (the layout chosen or
    checked for ``limit`` bytes first)."""
    from glyd.hf.bf16 import _stream

    q = config.get("quantization_config")
    if q is not None:
        method = q.get("quant_method") if isinstance(q, dict) else q
        raise already_quantized(path, method)
    files = _bf16_files(path)
    headers = {f: read_header(f) for f in files}
    keys = {f: h.keys_in_file_order() for f, h in headers.items()}
    # before diffusers builds a block for each: a layer count bounded by the tensors stored
    check_counts(config, [list(i.shape) for h in headers.values() for i in h.tensors.values()], path / "config.json")
    model = _build_empty(cls, config, path)
    if limit is not None:
        count = WeightsCount.of(model)
        layout = fit_layout(count, layout, limit)
    packer = Packer(model, layout=layout, merge=False, exact=exact, device=device)
    try:
        _stream(path, keys, model, packer, progress)
    finally:
        packer.close()
    packer.finish(str(path))
    if limit is not None:
        check_packed(packer, count, limit)
    model = _finish(model, device, path)
    note_source(model, path, None)
    return model



def _bf16_files(path: Path) -> list[Path]:
    """diffusers' weight files: those its index names, else ``diffusion_pytorch_model.safetensors``."""
    index = path / f"{WEIGHTS_NAME}.safetensors.index.json"
    if index.is_file():
        what = "not a safetensors index (JSON with a weight_map)"
        # not read whole past the store's bound; load_json: nesting bounded (json.loads raised
        # RecursionError), a duplicate key refused
        doc = load_json(read_json_bytes(index, "a safetensors index"), index, what)
        try:
            names = sorted(set(doc["weight_map"].values()))
        except (KeyError, TypeError, AttributeError) as exc:
            raise FormatError(f"{index}: {what}: {exc}") from exc
        bad = [n for n in names if not isinstance(n, str) or (path / n).parent != path or not (path / n).is_file()]
        if bad:
            raise FormatError(f"{index}: names shard {bad[0]!r}, which is not a file of the folder")
        return [path / n for n in names]
    if (path / f"{WEIGHTS_NAME}.safetensors").is_file():
        return [path / f"{WEIGHTS_NAME}.safetensors"]
    raise FormatError(f"{path}: no {WEIGHTS_NAME}.safetensors or its index: not a diffusers safetensors model folder "
                      f"(glyd reads safetensors only; it never unpickles)")
