"""``device_map`` for packed models: which placements glyd runs, and where each tensor goes.

A packed layer's buffers go wherever its module goes, as any parameter would. What glyd does not
run is offloading: a packed layer kept on the CPU or on disk and brought to a GPU for each
product (accelerate's hooks would move buffers glyd's ops read in place). A map that asks for it
(``"disk"``, or ``"cpu"`` next to an accelerator) is refused with :class:`UnsupportedError`.

>>> from glyd.hf.placement import normalize_map, device_of
>>> m = normalize_map({"model.embed_tokens": "cpu", "model.layers": "cpu", "lm_head": "cpu"})
>>> str(device_of(m, "model.layers.0.mlp.up_proj.weight"))
'cpu'
>>> normalize_map("auto")
'auto'
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

from glyd.errors import UnsupportedError
from glyd.hf._model import pick_device

#: The device_map strings that ask accelerate to compute the map.
AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def _name(value: Any, key: str) -> str:
    """A device_map value as a device name: ``0`` is ``"cuda:0"``, ``"disk"`` stays ``"disk"``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return f"cuda:{value}"
    if isinstance(value, (str, torch.device)):
        return str(value)
    raise UnsupportedError(f"device_map[{key!r}] = {value!r} is not a device")


def _device(value: str, key: str) -> torch.device:
    try:
        return pick_device(value)
    except ValueError:
        raise UnsupportedError(f"device_map[{key!r}] = {value!r} is not a device") from None
    except RuntimeError as exc:  # a GPU this machine lacks
        why = str(exc).split(": ", 1)[-1]
        raise UnsupportedError(f"device_map[{key!r}] = {value!r}: {why}") from None


def normalize_map(device_map: Any) -> dict[str, torch.device] | str:
    """``device_map`` as transformers takes it, as ``{module prefix: device}`` (or one of
    :data:`AUTO_MAPS`, left for the caller to compute); placements glyd cannot run are refused."""
    if isinstance(device_map, str) and device_map in AUTO_MAPS:
        return device_map
    if isinstance(device_map, Mapping):
        if not device_map:
            raise UnsupportedError("device_map={} places no module")
        names = {str(k): _name(v, str(k)) for k, v in device_map.items()}
    elif isinstance(device_map, (str, int, torch.device)) and not isinstance(device_map, bool):
        names = {"": _name(device_map, "")}
    else:
        raise UnsupportedError(f"device_map={device_map!r}: expected a device, one of {', '.join(AUTO_MAPS)}, or a "
                               f"dict of module names to devices")
    check_placement(names)
    return {k: _device(v, k) for k, v in names.items()}


def check_placement(device_map: Mapping[str, Any]) -> None:
    """Refuse offloading: a packed layer on ``"disk"``, or on the CPU while others are on a GPU."""
    values = {k: str(v) for k, v in device_map.items()}
    disk = [k for k, v in values.items() if v == "disk"]
    if disk:
        raise UnsupportedError(f"device_map puts {_what(disk[0])} on 'disk': glyd does not offload packed "
                               f"layers to disk (put every module on a device)")
    try:
        kinds = {k: torch.device(v).type for k, v in values.items()}
    except RuntimeError:
        bad = next(k for k, v in values.items() if not _is_device(v))
        raise UnsupportedError(f"device_map[{bad!r}] = {values[bad]!r} is not a device") from None
    cpu = [k for k, t in kinds.items() if t == "cpu"]
    other = sorted({values[k] for k, t in kinds.items() if t != "cpu"})
    if cpu and other:
        raise UnsupportedError(f"device_map puts {_what(cpu[0])} on the cpu and other modules on "
                               f"{', '.join(other)}: glyd does not offload packed layers to the CPU (put the whole "
                               f"model on the CPU, or every module on an accelerator)")


def _what(key: str) -> str:
    return repr(key) if key else "the whole model"


def _is_device(name: str) -> bool:
    try:
        torch.device(name)
    except RuntimeError:
        return False
    return True


def device_of(device_map: Mapping[str, torch.device], name: str) -> torch.device | None:
    """The device of tensor or module ``name``: the map's longest key that is ``name`` or a prefix of it."""
    best = None
    for key, dev in device_map.items():
        if key == "" or name == key or name.startswith(key + "."):
            if best is None or len(key) > len(best[0]):
                best = (key, dev)
    return None if best is None else best[1]


def check_covers(device_map: Mapping[str, torch.device], names: Iterable[str]) -> None:
    """Every tensor of the model must have a device in the map (none is placed by default)."""
    left = [n for n in names if device_of(device_map, n) is None]
    if left:
        more = f" and {len(left) - 3} more" if len(left) > 3 else ""
        raise UnsupportedError(f"device_map places no module for {', '.join(left[:3])}{more}")


def infer_map(model: torch.nn.Module, device_map: str, max_memory: dict | None) -> dict[str, torch.device]:
    """accelerate's map for ``"auto"`` and the like, from the (meta) bf16 model: an upper bound of
    the packed sizes. On a machine without an accelerator it puts every module on the CPU."""
    from accelerate.utils import get_balanced_memory, get_max_memory, infer_auto_device_map

    no_split = sorted(getattr(model, "_no_split_modules", None) or [])
    if device_map == "sequential":
        memory = get_max_memory(max_memory)
    else:
        memory = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split,
                                     dtype=torch.bfloat16, low_zero=device_map == "balanced_low_0")
    found = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split, dtype=torch.bfloat16)
    return normalize_map(found)
