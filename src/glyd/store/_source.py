"""The source of ``glyd pack``: a transformers safetensors folder, read as hostile input.

Everything glyd reads from the source (shards, index, config.json, every file it copies) must lie
inside the folder: a symbolic link is followed only when its target is inside the folder too (the
copy then holds the target's bytes), or when the folder is a snapshot of the Hugging Face cache
(``.../snapshots/<revision>/``, whose files are links to ``.../blobs/``). Any other link, a broken
link, a file that is not a regular file, and a name a checkpoint cannot hold (a backslash, bytes
that are not UTF-8) is refused before anything is written. glyd's own temporaries are never copied.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from pathlib import Path
from typing import Any

from glyd.errors import CorruptError, FormatError, show_path
from glyd.store._atomic import is_glyd_temporary
from glyd.store._manifest import CONFIG, INDEX, KEY_SEP, MANIFEST, SINGLE_SHARD, safe_relpath
from glyd.store._safetensors import Header, load_json, read_header, read_json_bytes

log = logging.getLogger(__name__)

#: Weight files of other formats (top level of a model folder): never copied, never read.
OTHER_WEIGHTS = (
    "pytorch_model*.bin",
    "pytorch_model*.bin.index.json",
    "tf_model*.h5",
    "tf_model*.h5.index.json",
    "flax_model*.msgpack",
    "flax_model*.msgpack.index.json",
    "model*.ckpt*",
    "*.pt",
    "*.pth",
)


def check_inside(src: Path, p: Path) -> None:
    """Raise FormatError unless reading ``p`` reads bytes of the folder ``src`` (see the module's
    docstring for links); ``p`` must exist and be a regular file or a folder."""
    if p.is_symlink():
        try:
            target = p.resolve(strict=True)
        except (OSError, RuntimeError):  # dangling, or a loop of links
            raise FormatError(f"{show_path(p)}: a broken symbolic link ({os.readlink(p)!r}): nothing to copy") from None
        root = src.resolve()
        hf_blobs = root.parent.parent / "blobs" if root.parent.name == "snapshots" else None
        inside = target == root or target.is_relative_to(root)
        if not inside and not (hf_blobs is not None and target.parent == hf_blobs):
            raise FormatError(
                f"{show_path(p)}: a symbolic link to {show_path(target)}, outside {show_path(src)}: glyd reads only "
                "what is inside the folder (copy the file in if you mean it to be part of the model)"
            )
    if not (p.is_file() or p.is_dir()):
        raise FormatError(f"{show_path(p)}: not a regular file or folder (a device, socket or pipe): glyd will not "
                          "read it")


def check_name(src: Path, rel: str) -> None:
    """A relative name a checkpoint's manifest can hold, or FormatError naming the file."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        raise FormatError(f"{src / rel!r}: the file name is not valid UTF-8: a glyd checkpoint cannot hold it "
                          f"(rename or remove it)") from None
    if "\\" in rel:
        raise FormatError(f"{show_path(src / rel)}: the file name has a backslash, which a glyd checkpoint cannot "
                          "hold (it is a path separator on Windows): rename or remove it")
    if safe_relpath(rel) is None:  # pragma: no cover - os.walk gives normalised names
        raise FormatError(f"{show_path(src / rel)}: not a plain relative file name")


def check_utf8_path(path: Path, what: str) -> None:
    """FormatError (the path quoted, on one line) unless ``path`` is valid UTF-8: safetensors opens no
    file at a path that is not, so neither the source's shards nor a packed folder's could be read."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise FormatError(f"{str(path)!r}: the {what} folder's path is not valid UTF-8, and safetensors opens no "
                          f"file there: rename it") from None


def source_shards(src: Path) -> tuple[list[str], dict[str, Header], str | None]:
    """The safetensors files of a transformers folder, in shard order, with checked headers."""
    check_utf8_path(src, "source")
    if not src.exists():
        raise FormatError(f"{show_path(src)}: no such folder")
    if not src.is_dir():
        raise FormatError(f"{show_path(src)}: not a folder (glyd pack reads a transformers model folder)")
    if (src / MANIFEST).exists():
        raise FormatError(f"{show_path(src)}: already a glyd packed checkpoint (it has {MANIFEST}); use glyd unpack")
    index = src / INDEX
    if index.is_file() or index.is_symlink():
        check_inside(src, index)
        wm = load_json(read_json_bytes(index, "a safetensors index"), index, "not a valid safetensors index")
        wm = wm.get("weight_map") if isinstance(wm, dict) else None
        if not isinstance(wm, dict) or not wm or not all(isinstance(v, str) for v in wm.values()):
            raise FormatError(f"{show_path(index)}: weight_map is missing, empty or not a map of tensor -> file")
        files = list(dict.fromkeys(sorted(wm.values())))
        for f in files:
            if safe_relpath(f) is None or "/" in f:
                raise FormatError(f"{show_path(index)}: shard name {f!r} is not a file of the folder")
            if not ((src / f).is_file() or (src / f).is_symlink()):
                raise FormatError(f"{show_path(src / f)}: shard listed in {INDEX} is missing")
        index_name: str | None = INDEX
    elif (src / SINGLE_SHARD).is_file() or (src / SINGLE_SHARD).is_symlink():
        files, wm, index_name = [SINGLE_SHARD], None, None
    else:
        other = sorted(p.name for p in src.iterdir() if any(fnmatch.fnmatch(p.name, pat) for pat in OTHER_WEIGHTS))
        if other:
            raise FormatError(
                f"{show_path(src)}: has {', '.join(other)} but no model.safetensors: glyd reads safetensors only "
                f"(convert the model to safetensors first, e.g. save_pretrained(..., safe_serialization=True))"
            )
        raise FormatError(f"{show_path(src)}: no {SINGLE_SHARD} or {INDEX}: not a transformers safetensors model "
                          "folder")
    for f in files:
        check_inside(src, src / f)
    headers = {f: read_header(src / f) for f in files}
    if wm is not None:
        for name, f in wm.items():
            if name not in headers[f].tensors:
                raise CorruptError(f"{show_path(src / f)}: tensor {name!r} listed in {INDEX} is not in the file")
    seen: dict[str, str] = {}
    for f, h in headers.items():
        for name in h.tensors:
            if name in seen:
                raise FormatError(f"{show_path(src)}: tensor {name!r} is in both {show_path(seen[name])} and "
                                  f"{show_path(f)}")
            if not name or KEY_SEP in name:
                # The packed checkpoint names a packed matrix's arrays NAME_glyd_ARRAY: a source tensor
                # spelled like that would collide with one, or be taken for one when loading.
                raise FormatError(f"{show_path(src / f)}: tensor {name!r}: an empty name or one with {KEY_SEP!r} in "
                                  f"it cannot be stored in a glyd checkpoint ({KEY_SEP!r} marks packed arrays)")
            seen[name] = f
    return files, headers, index_name


def _walk(src: Path):
    """os.walk of ``src`` that follows links to folders inside it (refusing any other, and loops)
    and enters no hidden folder (.git, .cache: not model files) and no glyd temporary."""
    chains = {os.fspath(src): (src.resolve(),)}  # real folders from src down to each folder walked
    for root, dirs, names in os.walk(src, followlinks=True):
        chain = chains.pop(root)
        keep = []
        for d in sorted(dirs):
            p = Path(root) / d
            if d.startswith("."):
                if is_glyd_temporary(d):
                    log.info("not copied: %s (a temporary folder of an interrupted glyd run)", show_path(p))
                continue
            check_inside(src, p)
            real = p.resolve()
            if real in chain:
                raise FormatError(f"{show_path(p)}: a symbolic link to a folder that holds it (a loop): glyd will not "
                                  "copy it")
            chains[os.path.join(root, d)] = (*chain, real)  # the name os.walk will give it
            keep.append(d)
        dirs[:] = keep
        yield root, names


def copy_list(src: Path, weight_files: set[str]) -> tuple[list[tuple[Path, str]], list[str]]:
    """Every file of the folder that is not a weight file: (path, relative name); and skipped names.
    Raises FormatError, before anything is written, for a file glyd must not or cannot copy."""
    keep, skipped = [], []
    for root, names in _walk(src):
        for n in sorted(names):
            p = Path(root) / n
            rel = p.relative_to(src).as_posix()
            if rel in weight_files:
                continue
            if is_glyd_temporary(n):
                log.info("not copied: %s (a temporary file of an interrupted glyd run)", show_path(p))
                continue
            if "/" not in rel and (n.endswith(".safetensors") or any(fnmatch.fnmatch(n, pat) for pat in OTHER_WEIGHTS)):
                # Other formats, or safetensors the index does not use (consolidated copies): the
                # packed folder holds the weights once. Never read, so links are not followed.
                skipped.append(rel)
                continue
            check_name(src, rel)
            check_inside(src, p)
            keep.append((p, rel))
    return keep, skipped


def read_config(src: Path) -> tuple[dict[str, Any], bytes] | None:
    """config.json of the source (parsed, and its bytes as they are), or None; a link must stay
    inside the folder like any file, and its size within what ``glyd unpack`` and the loaders read
    (``MAX_JSON_FILE_BYTES``, checked before it is read)."""
    path = src / CONFIG
    if not (path.is_file() or path.is_symlink()):
        return None
    check_inside(src, path)
    raw = read_json_bytes(path, "a config.json", ": refusing to pack it")
    cfg = load_json(raw, path)
    if not isinstance(cfg, dict):
        raise FormatError(f"{show_path(path)}: not a JSON object")
    return cfg, raw
