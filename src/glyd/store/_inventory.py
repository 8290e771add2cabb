"""What a checkpoint folder holds, checked against its manifest, in both directions.

Every shard and every entry of the index must be accounted for by glyd.json, and so must every
file that a loader finds by name and that changes the model: weights of any format (``*.safetensors``,
``*.bin``, ...), indexes, ``config.json`` (and ``glyd.source_config.json``, the one ``glyd unpack``
gives back) and code (``*.py``, run by ``trust_remote_code``). Other files may be added after
packing (a tokenizer saved into the folder, a model card written by ``push_to_hub``): they are not
part of the checkpoint, so they are logged, never verified and never copied by ``glyd unpack``.
Hidden entries (``.gitattributes``, ``.git/``, ``.cache/``) are skipped.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from pathlib import Path

from glyd.errors import CorruptError, FormatError, not_a_file, show_path
from glyd.store._card import CARD, CARD_BESIDE
from glyd.store._config import SOURCE_CONFIG
from glyd.store._manifest import CONFIG, MANIFEST, index_name, shard_base, shard_name
from glyd.store._safetensors import Header, load_json, read_json_bytes, short

log = logging.getLogger(__name__)

#: Unlisted files that are only documentation (logged at INFO), matched on the lower-cased name.
DOC_PATTERNS = ("readme*", "license*", "licence*", "notice*", "copying*", "*.md")
#: Names that are never ignored: weights of any format, indexes, configs, code.
STRICT_PATTERNS = (
    "*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.gguf", "*.onnx",
    "*.npz", "*.npy", "*.pkl", "*.pickle", "*.index.json", CONFIG, SOURCE_CONFIG, "*.py",
)

_SHARD_NUM_RE = re.compile(r"(?:model|diffusion_pytorch_model)-(\d{5})-of-(\d{5})\.safetensors")


def check_shard_names(path: Path, shards: set[str]) -> tuple[bool, str]:
    """The shards glyd.json uses must be exactly those a writer makes: ``model.safetensors`` alone,
    or ``model-00001-of-0000N`` ... ``model-0000N-of-0000N`` (N > 1), every one used; or the same
    named after ``diffusion_pytorch_model`` (diffusers' name), never a mix. Returns whether the
    checkpoint is sharded, and the base name of its shards."""
    bases = {shard_base(s) for s in shards}
    base = bases.pop() if len(bases) == 1 else None
    if base is None:
        raise FormatError(f"{show_path(path / MANIFEST)}: tensors name shards {', '.join(sorted(shards))}: not one "
                          "set of model*.safetensors or diffusion_pytorch_model*.safetensors")
    single = shard_name(1, 1, base)
    if shards == {single}:
        return False, base
    nums = [_SHARD_NUM_RE.fullmatch(s) for s in sorted(shards)]
    counts = {int(m.group(2)) for m in nums if m}
    if single in shards or len(counts) != 1 or counts == {1}:
        raise FormatError(f"{show_path(path / MANIFEST)}: tensors name shards {', '.join(sorted(shards))}: not one "
                          f"set of {single} or {base}-0000i-of-0000N.safetensors (N > 1)")
    (n,) = counts
    missing = [shard_name(i, n, base) for i in range(1, n + 1) if shard_name(i, n, base) not in shards]
    if missing:
        raise FormatError(f"{show_path(path / MANIFEST)}: no tensor is listed in shard(s) {', '.join(missing[:5])} of "
                          f"{n} (a shard was dropped from the manifest, or the checkpoint is incomplete)")
    return True, base


def check_index(path: Path, claimed: dict[str, set[str]], headers: dict[str, Header], sharded: bool,
                base: str = "model") -> None:
    """The index (named after the shards' ``base``) must exist exactly when the checkpoint is sharded
    and map every key of every shard, and nothing else, to its shard."""
    index = path / index_name(base)
    if not sharded:
        if index.exists() or index.is_symlink():
            raise FormatError(f"{show_path(index)}: a single-shard checkpoint has no index; {MANIFEST} does not "
                              "account for it")
        return
    what = not_a_file(index)
    if what is not None:
        raise CorruptError(f"{show_path(index)}: {what}{'' if what == 'missing' else ', not a regular file'} (a "
                           "sharded checkpoint cannot load without its index)")
    doc = load_json(read_json_bytes(index, "a safetensors index"), index)
    wm = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wm, dict):
        raise FormatError(f"{show_path(index)}: not a safetensors index (JSON with a weight_map)")
    where = {key: file for file, keys in claimed.items() for key in keys}
    for key, file in wm.items():
        if not isinstance(file, str) or file not in claimed:
            raise FormatError(f"{show_path(index)}: maps {short(key)} to {short(file)}, which is not a shard of this "
                              "checkpoint")
        if key not in where:
            raise FormatError(f"{show_path(index)}: lists key {short(key)}, which {MANIFEST} does not have")
        if where[key] != file:
            raise FormatError(f"{show_path(index)}: maps {short(key)} to {show_path(file)} but it is in "
                              f"{show_path(where[key])}")
    absent = sorted(set(where) - set(wm))
    if absent:
        raise FormatError(f"{show_path(index)}: has no entry for {', '.join(map(short, absent[:5]))} (in "
                          f"{where[absent[0]]})")
    total = sum(h.file_size - h.data_start for h in headers.values())
    meta = doc.get("metadata")
    got = meta.get("total_size") if isinstance(meta, dict) else None
    if got != total or isinstance(got, bool):
        raise FormatError(f"{show_path(index)}: metadata.total_size is {short(got)}, the shards hold {total} bytes of "
                          "tensors")


def _kind(rel: str) -> str:
    """'strict' (never ignored), 'ignored' (documentation, hidden) or 'other' (ignored, with a warning)."""
    name = rel.rsplit("/", 1)[-1].lower()
    if any(fnmatch.fnmatchcase(name, p) for p in STRICT_PATTERNS):
        return "strict"
    if any(part.startswith(".") for part in rel.split("/")) or any(fnmatch.fnmatchcase(name, p) for p in DOC_PATTERNS):
        return "ignored"
    return "other"


def check_unlisted(path: Path, listed: set[str]) -> list[str]:
    """Raise FormatError for the first entry of the folder that ``listed`` does not account for
    (hidden folders are not entered). Returns the unlisted files that are ignored."""
    ignored: list[str] = []
    added: list[str] = []
    under = {p.rsplit("/", 1)[0] for p in listed if "/" in p}
    parents = {"/".join(d.split("/")[: i + 1]) for d in under for i in range(d.count("/") + 1)}
    chains = {os.fspath(path): (path.resolve(),)}  # real folders from the top down, to stop loops
    for root, dirs, names in os.walk(path, followlinks=True):
        chain = chains.pop(root)
        base = Path(root).relative_to(path).as_posix()
        prefix = "" if base == "." else base + "/"
        for d in list(dirs):
            full = os.path.join(root, d)
            if d.startswith("."):
                dirs.remove(d)  # .git, .cache/huggingface: not part of any model
            elif os.path.islink(full) and (prefix + d not in parents or Path(full).resolve() in chain):
                raise FormatError(f"{show_path(path / (prefix + d))}: a link to a folder that {MANIFEST} does not "
                                  "account for")
            else:
                chains[full] = (*chain, Path(full).resolve())
        for n in sorted(names):
            rel = prefix + n
            if rel in listed:
                continue
            kind = _kind(rel)
            if kind != "strict":
                (ignored if kind == "ignored" else added).append(rel)
                continue
            base = rel.rsplit("/", 1)[-1].lower()
            what = base if base in (CONFIG, SOURCE_CONFIG) else "code" if base.endswith(".py") else "weights or an index"
            raise FormatError(
                f"{show_path(path / rel)}: {what} that {MANIFEST} does not list: a checkpoint holds only what its "
                "manifest accounts for (remove it, or pack the model again)"
            )
    said = [rel for rel in ignored if rel not in (CARD, CARD_BESIDE)]  # glyd's own model card goes unsaid
    if said:
        log.info("%s: not part of the checkpoint (documentation or hidden), not verified: %s",
                 show_path(path), ", ".join(show_path(r) for r in said[:8]))
    if added:
        log.warning("%s: file(s) added after packing, not part of the checkpoint and not verified: %s",
                    show_path(path),
                    ", ".join(show_path(r) for r in added[:8]) + (f" and {len(added) - 8} more" if len(added) > 8 else ""))
    return ignored + added
