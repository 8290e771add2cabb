"""Writing a folder atomically: a hidden temporary sibling that is renamed into place when complete.

A temporary is named after its owner (``.DST.<pid>-<host>.<random>.glyd-tmp``), so that one left
by a killed run (SIGKILL, a crash, a power cut) can be told from one being written: before it
writes, a writer removes the stale temporaries of its destination (:func:`remove_stale`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import socket
import tempfile
import time
import weakref
from pathlib import Path

from glyd.errors import DestinationExistsError, UnsupportedError, show_path
from glyd.store._manifest import MANIFEST, TMP_SUFFIX

log = logging.getLogger(__name__)

#: A temporary nothing has touched for this long is stale whoever owns it (a live writer adds a file
#: at least each time it has packed one shard, 2 GiB at most: far more often than this).
STALE_AGE_S = 24 * 3600
#: A temporary whose name gives a pid but no host (glyd.filecodec's) is stale once that pid is not
#: running here and nothing has touched it for this long (its writer might be on another host).
UNKNOWN_HOST_IDLE_S = 600
#: Suffix of the folder a destination is moved into while a writer replaces it (``overwrite=True``).
OLD_SUFFIX = ".glyd-old"


def check_destination(dst: Path, overwrite: bool) -> None:
    """Raise DestinationExistsError unless ``dst`` may be written (``overwrite`` replaces only a
    glyd checkpoint or an empty folder: never anything else)."""
    if not (dst.exists() or dst.is_symlink()):
        return
    if not overwrite:
        raise DestinationExistsError(f"{show_path(dst)} already exists; glyd never overwrites (remove it or choose "
                                     "another name)")
    if dst.is_symlink() or not dst.is_dir() or not ((dst / MANIFEST).is_file() or not any(dst.iterdir())):
        raise DestinationExistsError(f"{show_path(dst)} exists and is not a glyd checkpoint or an empty folder: "
                                     "refusing to replace it")


def check_outside(src: Path, dst: Path) -> None:
    """Raise UnsupportedError unless ``dst`` lies outside the folder ``src`` (links resolved): an
    output written into its input would change the folder being read, and end up part of it."""
    inner, outer = dst.absolute().resolve(), src.resolve()
    if inner == outer or inner.is_relative_to(outer):
        raise UnsupportedError(f"{show_path(dst)} is inside {show_path(src)}: glyd does not write into the folder it "
                               f"reads (choose a destination outside {show_path(src)})")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _check_parents(given: Path, dst: Path) -> None:
    """The nearest existing folder above ``dst`` must be a folder: mkdir's own error for a file there
    ("File exists", "Not a directory") does not say which part of the path is at fault."""
    for parent in dst.parents:
        if os.path.lexists(parent):
            if not parent.is_dir():
                raise UnsupportedError(f"{show_path(given)}: {show_path(parent)} is a file, not a folder")
            return


class AtomicDir:
    """A temporary sibling folder of ``dst`` that is renamed to ``dst`` by :meth:`commit` and
    removed by :meth:`abort` (or when the object is garbage-collected without a commit)."""

    def __init__(self, dst: str | os.PathLike, overwrite: bool = False):
        self.dst = Path(dst).absolute()
        self.overwrite = overwrite
        check_destination(self.dst, overwrite)
        _check_parents(Path(dst), self.dst)
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(self.dst)
        self.tmp = Path(tempfile.mkdtemp(prefix=_prefix(self.dst), suffix=TMP_SUFFIX, dir=self.dst.parent))
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
            old = Path(tempfile.mkdtemp(prefix=_prefix(self.dst), suffix=OLD_SUFFIX, dir=self.dst.parent))
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
# glyd's temporary names, and stale ones

#: Temporary names a glyd writer makes next to its destination DST (all hidden): a checkpoint
#: being written (``.DST.<pid>-<host>.<random>.glyd-tmp``; ``.DST.<random>.glyd-tmp`` before the
#: owner was named), a checkpoint moved aside while it is replaced (same, ``.glyd-old``), a file
#: being decompressed (``.DST.<pid>.<8 hex>.tmp``, glyd.filecodec).
_TMP_RE = re.compile(r"\.(?P<dst>.+?)\.(?:(?P<pid>\d+)-(?P<host>[0-9a-f]{8})\.)?[a-z0-9_]{8}\.glyd-(?P<kind>tmp|old)")
_FILECODEC_TMP_RE = re.compile(r"\.(?P<dst>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp")
_STEM = 120  # characters of DST's name in a temporary's name (NAME_MAX is 255)


def is_glyd_temporary(name: str) -> bool:
    """Whether ``name`` (a file or folder name) is one of glyd's temporary names."""
    return _TMP_RE.fullmatch(name) is not None or _FILECODEC_TMP_RE.fullmatch(name) is not None


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode("utf-8", "surrogateescape")).hexdigest()[:8]


def _prefix(dst: Path) -> str:
    return f".{dst.name[:_STEM]}.{os.getpid()}-{_host_tag()}."


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (only asked on POSIX, where signal 0 is a probe)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    except (OverflowError, ValueError, OSError):  # not a pid any process can have
        return False
    return True


def _idle_s(path: Path) -> float:
    """Seconds since anything in ``path`` (a file, or a folder and everything in it) last changed."""
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):
            for n in (*dirs, *files):
                try:
                    newest = max(newest, os.lstat(os.path.join(root, n)).st_mtime)
                except OSError:
                    continue
    return time.time() - newest


def _stale(path: Path) -> bool:
    """Whether the glyd temporary ``path`` was left by a run that is over (never one being written)."""
    m = _TMP_RE.fullmatch(path.name) or _FILECODEC_TMP_RE.fullmatch(path.name)
    pid, host = m.group("pid"), m.groupdict().get("host")
    idle = _idle_s(path)
    if idle >= STALE_AGE_S:
        return True
    if pid is None or os.name != "posix":
        return False
    if host is not None:
        return host == _host_tag() and not _running(int(pid))
    return idle >= UNKNOWN_HOST_IDLE_S and not _running(int(pid))


def remove_stale(dst: Path) -> list[Path]:
    """Remove the stale glyd temporaries next to ``dst`` (see :func:`_stale`); returns them.

    A ``.glyd-old`` folder holds the checkpoint an interrupted overwrite moved aside: it is removed
    only once ``dst`` exists again, else kept with a warning (it may be the only copy)."""
    removed = []
    stem = dst.name[:_STEM]
    try:
        entries = sorted(dst.parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _TMP_RE.fullmatch(p.name) or _FILECODEC_TMP_RE.fullmatch(p.name)
        if m is None or m.group("dst") not in (stem, dst.name):
            continue
        try:
            if not _stale(p):
                continue
        except OSError:  # vanished meanwhile: its owner finished
            continue
        if m.groupdict().get("kind") == "old" and not dst.exists():
            log.warning("%s holds the checkpoint an interrupted run was replacing at %s: move it back "
                        "(mv %s %s) or remove %s", *map(show_path, (p / "old", dst, p / "old", dst, p)))
            continue
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        except OSError as exc:  # another user's, or removed meanwhile by another run
            if p.exists() or p.is_symlink():
                log.warning("cannot remove %s, left by an interrupted glyd run: %s", show_path(p), exc.strerror or exc)
                continue
        log.info("removed %s, left by an interrupted glyd run", show_path(p))
        removed.append(p)
    return removed
