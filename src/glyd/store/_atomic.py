"""Writing a folder atomically: a hidden temporary sibling that is renamed into place when complete."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import weakref
from pathlib import Path

from glyd.errors import DestinationExistsError
from glyd.store._manifest import MANIFEST, TMP_SUFFIX


def check_destination(dst: Path, overwrite: bool) -> None:
    """Raise DestinationExistsError unless ``dst`` may be written (``overwrite`` replaces only a
    glyd checkpoint or an empty folder: never anything else)."""
    if not (dst.exists() or dst.is_symlink()):
        return
    if not overwrite:
        raise DestinationExistsError(f"{dst} already exists; glyd never overwrites (remove it or choose another name)")
    if dst.is_symlink() or not dst.is_dir() or not ((dst / MANIFEST).is_file() or not any(dst.iterdir())):
        raise DestinationExistsError(f"{dst} exists and is not a glyd checkpoint or an empty folder: refusing to replace it")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class AtomicDir:
    """A temporary sibling folder of ``dst`` that is renamed to ``dst`` by :meth:`commit` and
    removed by :meth:`abort` (or when the object is garbage-collected without a commit)."""

    def __init__(self, dst: str | os.PathLike, overwrite: bool = False):
        self.dst = Path(dst).absolute()
        self.overwrite = overwrite
        check_destination(self.dst, overwrite)
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.dst.name}.", suffix=TMP_SUFFIX, dir=self.dst.parent))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.tmp), True)
        self.done = False

    def commit(self) -> Path:
        check_destination(self.dst, self.overwrite)
        # mkdtemp and safetensors create owner-only entries: give the result the usual umask modes.
        umask = _umask()
        for root, dirs, files in os.walk(self.tmp):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o777 & ~umask)
            for f in files:
                os.chmod(os.path.join(root, f), 0o666 & ~umask)
        os.chmod(self.tmp, 0o777 & ~umask)
        old = None
        if self.dst.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{self.dst.name}.", suffix=".glyd-old", dir=self.dst.parent))
            os.rename(self.dst, old / "old")
        try:
            os.rename(self.tmp, self.dst)
        except BaseException:
            if old is not None:
                os.rename(old / "old", self.dst)
                shutil.rmtree(old, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._cleanup.detach()
        self.done = True
        return self.dst

    def abort(self) -> None:
        self._cleanup()
        self.done = True


def copy_hashed(src: str | os.PathLike, dst: Path, chunk: int = 1 << 20) -> str:
    """Copy ``src`` to ``dst`` and return the sha256 of the bytes copied."""
    h = hashlib.sha256()
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while block := fi.read(chunk):
            h.update(block)
            fo.write(block)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------
# glyd's temporary names

#: Every temporary name a glyd writer makes next to its destination (hidden, ``.DST.`` first):
#: a checkpoint being written (``.DST.<random>.glyd-tmp``), a checkpoint moved aside while it is
#: replaced (``.DST.<random>.glyd-old``), and a file being decompressed (``.DST.<pid>.<8 hex>.tmp``,
#: glyd.filecodec).
_TMP_RE = re.compile(r"\.(?P<dst>.+)\.[a-z0-9_]{8}\.glyd-(?:tmp|old)")
_FILECODEC_TMP_RE = re.compile(r"\.(?P<dst>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp")


def is_glyd_temporary(name: str) -> bool:
    """Whether ``name`` (a file or folder name) is one of glyd's temporary names."""
    return _TMP_RE.fullmatch(name) is not None or _FILECODEC_TMP_RE.fullmatch(name) is not None
