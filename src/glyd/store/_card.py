"""The model card every packed checkpoint folder gets: what the folder is, how to load it, its
layout and sizes, and that every weight is the original's bit for bit.

The card is documentation, not part of the checkpoint: glyd.json does not list it, a reader
tolerates it (as it does any ``README*``), ``glyd verify`` does not hash it and ``glyd unpack``
does not copy it, so the unpacked folder is the original one. It is written as ``README.md``;
when the source's own ``README.md`` is one of the checkpoint's files (copied, verified, given back
by ``glyd unpack``), the card goes beside it as ``README.glyd.md``.

>>> m = {"layout": "fixed12", "tensors": {"w": {"kind": "packed", "dtype": "bfloat16", "shape": [64, 64],
...      "layout": "fixed12", "arrays": {"lo": {"dtype": "uint8", "shape": [64, 64]},
...      "code": {"dtype": "uint8", "shape": [64, 32]}}}}, "files": {}}
>>> "bit for bit" in card_text(m, "tiny")
True
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

#: The card's name, and its name beside a source README.md the checkpoint keeps.
CARD = "README.md"
CARD_BESIDE = "README.glyd.md"

_ITEMSIZE = {"bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "int16": 2, "uint16": 2,
             "bfloat16": 2, "float16": 2, "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8,
             "float64": 8}


def human_bytes(n: float) -> str:
    """Bytes in decimal units: ``203.36 MB``."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    raise AssertionError  # unreachable


def card_name(files: dict[str, str]) -> str:
    """Where the card goes, given the checkpoint's listed files."""
    return CARD_BESIDE if CARD in files else CARD


def _bytes(spec: dict[str, Any]) -> int:
    return math.prod(spec["shape"]) * _ITEMSIZE.get(spec["dtype"], 0)


def _sizes(manifest: dict[str, Any]) -> dict[str, Any]:
    layouts: Counter = Counter()
    s = {"weights": 0, "packed": 0, "raw": 0, "raw_bytes": 0}
    for entry in manifest["tensors"].values():
        if entry["kind"] == "packed":
            layouts[entry["layout"]] += 1
            s["weights"] += math.prod(entry["shape"])
            s["packed"] += sum(_bytes(a) for a in entry["arrays"].values())
        else:
            s["raw"] += 1
            s["raw_bytes"] += _bytes(entry)
    s["layouts"] = layouts
    return s


def card_text(manifest: dict[str, Any], title: str, cls: str | None = None, library: str = "transformers",
              loader: str | None = None) -> str:
    """The card of a checkpoint whose manifest is ``manifest`` (as ``CheckpointWriter`` writes it);
    ``cls``: the model's class (config.json's ``architectures[0]`` or diffusers' ``_class_name``),
    ``library``: ``"transformers"`` or ``"diffusers"``; ``loader``: the loader module config.json's
    ``auto_map`` names, if any."""
    s = _sizes(manifest)
    lay = ", ".join(f"`{k}` ({n} matrices)" for k, n in sorted(s["layouts"].items())) or "none"
    bits = 8 * s["packed"] / s["weights"] if s["weights"] else 0.0
    cls = cls or ("AutoModelForCausalLM" if library == "transformers" else "the model's class")
    how = (f", and so does a process that never imports it, with `trust_remote_code=True` (config.json's "
           f"`auto_map` names `{loader}`)") if loader else ""
    original = 2 * s["weights"] + s["raw_bytes"]
    stored = s["packed"] + s["raw_bytes"]
    return f"""---
library_name: {library}
tags:
- glyd
- lossless
---

# {title}, packed losslessly with Glyd

This folder holds the weights of {title} packed by Glyd (`pip install glyd-lossless`), a lossless
codec for bf16 weights: **every weight is the original's, bit for bit**. Nothing is quantized or
rounded. `glyd.json` records the sha256 of every original tensor; `glyd verify` unpacks every matrix
and checks it against that hash.

| | |
|---|---|
| layout | {lay} |
| packed matrices | {s["weights"]:,} weights: {human_bytes(2 * s["weights"])} in bf16, {human_bytes(s["packed"])} packed ({bits:.3f} bits a weight) |
| other tensors | {s["raw"]}, kept as they are ({human_bytes(s["raw_bytes"])}) |
| all weights | {human_bytes(original)} -> {human_bytes(stored)} ({stored / original if original else 0:.3f} of the original) |

## Load it

```bash
pip install "glyd-lossless[models]"
```

```python
import glyd

model = glyd.from_pretrained("path/to/this/folder")              # products straight from the packed weights
model = glyd.from_pretrained("path/to/this/folder", exact=True)  # bf16's own products: logits equal bf16's bit for bit
```

Once `glyd` is imported, {library} loads the folder too (`{cls}.from_pretrained(...)`){how}; without
glyd installed it does not load the packed weights.

## The bf16 model back

```bash
glyd verify path/to/this/folder                   # every tensor against its sha256
glyd unpack path/to/this/folder path/to/bf16      # the original safetensors, bit for bit
```

This card is documentation: glyd.json does not list it and `glyd unpack` does not copy it.
"""
