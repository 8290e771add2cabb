"""The packed checkpoint format: safetensors shards of packed arrays plus a ``glyd.json`` manifest.

>>> import tempfile, torch, glyd
>>> from glyd.store import CheckpointWriter, CheckpointReader, sha256_tensor
>>> w = torch.randn(8, 8).to(torch.bfloat16)
>>> path = tempfile.mkdtemp() + "/ckpt"
>>> with CheckpointWriter(path, layout="fixed12") as out:
...     out.add_packed("w", glyd.pack(w), sha256_tensor(w))
>>> CheckpointReader(path).verify(progress=False)["tensors"]
1

Whole folders: :func:`pack_folder`, :func:`unpack_folder`, :func:`info` (and ``glyd pack``,
``glyd unpack``, ``glyd verify``, ``glyd info``). Format: ``docs/format.md``, "Packed checkpoints".
"""

from glyd.store._safetensors import sha256_tensor
from glyd.store.checkpoint import FORMAT, MANIFEST, VERSION, CheckpointReader, CheckpointWriter, key_for
from glyd.store.folder import PackSummary, info, pack_folder, unpack_folder

__all__ = [
    "FORMAT",
    "VERSION",
    "MANIFEST",
    "sha256_tensor",
    "key_for",
    "CheckpointWriter",
    "CheckpointReader",
    "PackSummary",
    "pack_folder",
    "unpack_folder",
    "info",
]
