"""The ``.glyd`` file archive: files (checkpoints or anything else) compressed for storage and
transfer and restored byte for byte.

An archive is a header with a file table, then every file as a run of independent chunks (each
with a CRC-32), a per-file end record with the file's sha256, and an end marker. safetensors files
are parsed and each tensor of a float dtype is coded by :mod:`glyd.filecodec.floats`; the header,
the gaps and every other byte go through zstd. The byte layout is in ``docs/format.md`` ("File
archives"), its records are written and checked by :mod:`glyd.filecodec.records`;
``docs/filecodec.md`` is the user guide.

Memory stays bounded by a few chunks whatever the file sizes: chunks are read with ``os.pread``,
coded on ``jobs`` threads (numpy and zstd release the GIL) with at most ``2 * jobs`` in flight, and
written in order. Outputs are written under temporary names and renamed only once everything has
been checked, so a failed run leaves nothing behind.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import stat
import struct
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path, PurePosixPath

from glyd.errors import CorruptError, DestinationExistsError, FormatError, GlydError, not_a_file, show_path
from glyd.filecodec.names import check_table
from glyd.filecodec.plan import plan_file

# the layout's names are imported here too: callers and tests address them as archive.X
from glyd.filecodec.records import (  # noqa: F401
    CODEC_FLOAT,
    CODEC_NAMES,
    CODEC_STORE,
    CODEC_ZSTD,
    MAGIC,
    MAX_CHUNK_BYTES,
    MAX_TABLE_BYTES,
    VERSION,
    _CHUNK,
    _END,
    _HEAD,
    _TAIL,
    Entry,
    _Reader,
    _decode_record,
    _encode_piece,
    _read_table,
    _record,
    _records,
)

log = logging.getLogger(__name__)

SUFFIX = ".glyd"

#: progress bars are shown for work of this many bytes or more
PROGRESS_MIN_BYTES = 64 << 20


@dataclasses.dataclass
class Report:
    """What :func:`test`, :func:`decompress` and :func:`compress_files` saw."""

    entries: list[Entry]
    archive_bytes: int
    chunks: int

    @property
    def original_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def ratio(self) -> float:
        """Archive size / original size."""
        return self.archive_bytes / max(self.original_bytes, 1)


# ----------------------------------------------------------------------------- sources


_Read = Callable[[int, int], bytes]


@dataclasses.dataclass
class _Source:
    path: str  # name inside the archive
    size: int
    #: -> (read(offset, n), close): called when the file's turn comes, so that only the few
    #: files in flight are open (a folder may hold more files than a process may open)
    open: Callable[[], tuple[_Read, Callable[[], None]]]
    label: str  # for messages


def _file_source(path: Path, name: str) -> _Source:
    size = os.stat(path).st_size

    def open_file() -> tuple[_Read, Callable[[], None]]:
        fd = os.open(path, os.O_RDONLY)
        now = os.fstat(fd).st_size
        if now != size:
            os.close(fd)
            raise GlydError(f"{path}: changed while being compressed ({size} bytes when listed, {now} now)")

        def read(off: int, n: int) -> bytes:
            b = os.pread(fd, n, off)
            if len(b) != n:
                raise GlydError(f"{path}: changed while being compressed (short read at {off})")
            return b

        return read, lambda: os.close(fd)

    return _Source(name, size, open_file, str(path))


def _collect(paths: Sequence[str | os.PathLike]) -> list[tuple[Path, str]]:
    """(file on disk, name in the archive) for files and, recursively, folders (sorted)."""
    out: list[tuple[Path, str]] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            base = p.resolve().name or "root"
            for f in sorted(q for q in p.rglob("*") if q.is_symlink() or not q.is_dir()):
                # a FIFO, a device, a broken link or a link to a folder is refused, never skipped
                _refuse_not_a_file(f)
                out.append((f, str(PurePosixPath(base, *f.relative_to(p).parts))))
        else:
            _refuse_not_a_file(p)
            out.append((p, p.name))
    return out


def _refuse_not_a_file(p: Path) -> None:
    what = not_a_file(p)
    if what == "missing":
        raise GlydError(f"{show_path(p)}: no such file or folder")
    if what is not None:
        raise GlydError(f"{show_path(p)}: {what}; only regular files and folders can be archived")


# ----------------------------------------------------------------------------- writing


def _ordered_map(fn, items: Iterable[tuple], jobs: int) -> Iterator[tuple]:
    """``fn(item)`` for the items tagged ``"chunk"`` (``item[0]``), on ``jobs`` threads with at
    most ``2 * jobs`` items in flight; every other item passes through unchanged; all in order.

    One pool serves a whole archive: with a pool a file, thread starts and joins took most of
    the time of an archive of many small files."""
    if jobs <= 1:
        for it in items:
            yield fn(it) if it[0] == "chunk" else it
        return
    with cf.ThreadPoolExecutor(jobs, thread_name_prefix="glyd-fc") as ex:
        pending: deque = deque()  # Futures, and the pass-through items between them
        try:
            for it in items:
                pending.append(ex.submit(fn, it) if it[0] == "chunk" else it)
                if len(pending) >= 2 * jobs:
                    done = pending.popleft()
                    yield done.result() if isinstance(done, cf.Future) else done
            while pending:
                done = pending.popleft()
                yield done.result() if isinstance(done, cf.Future) else done
        finally:
            for f in pending:
                if isinstance(f, cf.Future):
                    f.cancel()


def _table_bytes(sources: list[_Source], label: str) -> bytes:
    """The file table of an archive of ``sources``, once the reader's rules accept it (whatever
    compress writes, decompress must restore): a name it would refuse is a one-line error naming
    the input file, before anything is written."""
    check_table([(s.path, s.size) for s in sources], lambda i: sources[i].label)
    table = json.dumps({"files": [{"path": s.path, "size": s.size} for s in sources]}, separators=(",", ":")).encode()
    if len(table) > MAX_TABLE_BYTES:
        raise FormatError(
            f"{label}: the file table would take {len(table):,} bytes, over the {MAX_TABLE_BYTES:,} an archive "
            "may hold (too many files or too long names)"
        )
    return table


def _write(out, sources: list[_Source], table: bytes, jobs: int, progress: bool = False) -> int:
    """Write an archive of ``sources`` (``table``: from :func:`_table_bytes`) to the binary file
    object ``out``; returns the chunk count."""
    out.write(_HEAD.pack(MAGIC, VERSION, 0, len(table)))
    out.write(table)
    out.write(struct.pack("<I", zlib.crc32(table)))

    closers: dict[int, Callable[[], None]] = {}  # the files open now

    def jobs_of_sources() -> Iterator[tuple]:
        for fi, src in enumerate(sources):
            read, closers[fi] = src.open()
            pieces = plan_file(src.size, read)
            log.debug("%s: %d chunks, %d of them float tensors", src.label, len(pieces), sum(1 for p in pieces if p.dtype))
            yield ("file",)
            for ci, piece in enumerate(pieces):
                yield ("chunk", fi, ci, piece, read)
            yield ("end", fi, len(pieces))

    def work(item: tuple) -> tuple:
        _, fi, ci, piece, read = item
        data = read(piece.offset, piece.length)
        codec, payload = _encode_piece(piece, data)
        return ("data", data, _record(fi, ci, codec, piece.length, payload))

    total = 0
    sha = hashlib.sha256()
    # the bar is closed on errors too, so that the CLI's error line is not glued to it; the
    # files are closed only once the pool has stopped (closing the map joins its threads)
    try:
        with _bar(sum(s.size for s in sources), "compress", progress) as bar, contextlib.closing(
            _ordered_map(work, jobs_of_sources(), jobs)
        ) as results:
            for item in results:
                if item[0] == "data":
                    _, data, rec = item
                    sha.update(data)
                    for part in rec:
                        out.write(part)
                    bar.update(len(data))
                elif item[0] == "file":
                    sha = hashlib.sha256()
                else:
                    _, fi, n = item
                    closers.pop(fi)()
                    out.write(_END.pack(b"E", fi, n, sha.digest()))
                    total += n
    finally:
        for close in closers.values():
            close()
    out.write(_TAIL.pack(b"Z", len(sources), MAGIC))
    return total


def _bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=not enabled or total < PROGRESS_MIN_BYTES)


def _default_jobs(jobs: int | None) -> int:
    return max(1, jobs if jobs else min(8, os.cpu_count() or 1))


def compress_files(
    paths: Sequence[str | os.PathLike] | str | os.PathLike,
    archive: str | os.PathLike,
    *,
    jobs: int | None = None,
    progress: bool = False,
) -> Report:
    """Compress files and folders (recursively) into a new ``.glyd`` archive.

    A folder ``model/`` is stored as ``model/...``; a file by its name. The archive is written to a
    temporary name next to ``archive`` and renamed when complete; an existing ``archive`` is never
    overwritten.

    >>> import pathlib, tempfile, glyd.filecodec as fc
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.txt").write_text("hello " * 100)
    >>> r = fc.compress_files([d / "a.txt"], d / "a.glyd")
    >>> [e.path for e in r.entries]
    ['a.txt']
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    archive = Path(archive)
    _refuse_existing(archive, "already exists")
    sources = [_file_source(path, name) for path, name in _collect(paths)]
    table = _table_bytes(sources, str(archive))
    tmp = _tmp_name(archive)
    try:
        with open(tmp, "xb") as f:
            chunks = _write(f, sources, table, _default_jobs(jobs), progress)
            f.flush()
            os.fsync(f.fileno())
        _refuse_existing(archive, "appeared while compressing")
        os.replace(tmp, archive)
    except BaseException:
        _unlink(tmp)
        raise
    return Report([Entry(s.path, s.size) for s in sources], archive.stat().st_size, chunks)


def compress_bytes(data: bytes, name: str = "data", *, jobs: int | None = 1) -> bytes:
    """Compress ``data`` (any bytes; safetensors content is recognized) into an archive in memory.

    >>> import glyd.filecodec as fc
    >>> fc.decompress_bytes(fc.compress_bytes(b"abc" * 1000)) == b"abc" * 1000
    True
    """
    mv = memoryview(data).cast("B") if not isinstance(data, bytes) else data

    def read(off: int, n: int):
        return mv[off : off + n]

    sources = [_Source(name, len(mv), lambda: (read, lambda: None), f"name {name!r}")]
    buf = io.BytesIO()
    _write(buf, sources, _table_bytes(sources, "<bytes>"), _default_jobs(jobs))
    return buf.getvalue()


# ----------------------------------------------------------------------------- reading


def _iter_archive(
    f,
    label: str,
    jobs: int,
    on_entry: Callable[[int, Entry], None],
    on_data,
    on_end,
    progress: bool = False,
    desc: str = "decompress",
) -> Report:
    """Read and check a whole archive, calling ``on_entry(file_index, entry)``, then
    ``on_data(file_index, bytes)`` for each chunk, then ``on_end(file_index)``, file by file;
    ``desc`` names the progress bar."""
    r = _Reader(f, label)
    entries = _read_table(r)
    nchunks = fi = 0
    sha = hashlib.sha256()
    with _bar(sum(e.size for e in entries), desc, progress) as bar:  # closed on errors too
        for item in _ordered_map(_decode_record, _records(r, entries), jobs):
            if item[0] == "data":
                data = item[1]
                sha.update(data)
                on_data(fi, data)
                nchunks += 1
                bar.update(len(memoryview(data).cast("B")))
            elif item[0] == "file":
                fi = item[1]
                on_entry(fi, entries[fi])
                sha = hashlib.sha256()
            else:
                if sha.digest() != item[2]:
                    raise CorruptError(f"{label}: file {entries[fi].path!r}: sha256 mismatch")
                on_end(fi)
    tail = r.read(_TAIL.size, "end marker")
    if tail[:1] != b"Z" or _TAIL.unpack(tail)[1:] != (len(entries), MAGIC):
        raise CorruptError(f"{label}: bad end marker")
    if f.read(1):
        raise CorruptError(f"{label}: data after the end marker")
    return Report(entries, r.pos, nchunks)


def test(archive: str | os.PathLike, *, jobs: int | None = None, progress: bool = False) -> Report:
    """Decode and check every chunk and file hash of ``archive`` without writing anything.

    Raises :class:`glyd.errors.CorruptError` (naming the file and chunk) or
    :class:`glyd.errors.FormatError` (not an archive, unknown version).
    """
    with _open_archive(archive) as f:
        return _iter_archive(
            f, str(archive), _default_jobs(jobs), lambda *a: None, lambda *a: None, lambda *a: None, progress, "test"
        )


def decompress(
    archive: str | os.PathLike, outdir: str | os.PathLike = ".", *, jobs: int | None = None, progress: bool = False
) -> Report:
    """Restore every file of ``archive`` under ``outdir``, byte for byte (sha256 checked).

    All files are written under temporary names and renamed only once the whole archive has been
    checked; on any error nothing is left behind. Existing files are never overwritten, and nothing
    is written through a symbolic link below ``outdir`` (``outdir`` itself may be one).
    """
    outdir = Path(outdir)
    label = str(archive)
    temps: dict[int, tuple[list[str], str, Path, io.BufferedWriter]] = {}  # parts, temporary name, dest, file
    made_dirs: list[Path] = []
    placed: list[list[str]] = []

    def on_entry(fi: int, entry: Entry) -> None:
        parts = entry.path.split("/")
        dest = outdir.joinpath(*parts)
        _make_root(outdir, made_dirs)
        with _folder_fd(outdir, parts[:-1], made_dirs) as fd:
            _refuse_existing_at(parts[-1], fd, dest, "already exists")
            tmp = _tmp_name(dest).name
            # O_EXCL already refuses any existing name, a link included; O_NOFOLLOW states it twice
            fh = open(tmp, "xb", opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW, 0o666, dir_fd=fd))
        temps[fi] = (parts, tmp, dest, fh)

    def on_data(fi: int, data) -> None:
        temps[fi][3].write(data)

    def on_end(fi: int) -> None:
        temps[fi][3].close()

    try:
        with _open_archive(archive) as f:
            report = _iter_archive(f, label, _default_jobs(jobs), on_entry, on_data, on_end, progress)
        for parts, _, dest, _ in temps.values():
            with _folder_fd(outdir, parts[:-1]) as fd:  # a folder on the way turned into a link since: refused
                _refuse_existing_at(parts[-1], fd, dest, "appeared while decompressing")
        for parts, tmp, dest, _ in temps.values():
            _place(outdir, parts, tmp, dest)
            placed.append(parts)
        return report
    except BaseException:
        for parts in placed:  # all or nothing: the files already renamed go too
            _unlink_below(outdir, parts[:-1], parts[-1])
        for parts, tmp, _, fh in temps.values():
            fh.close()
            _unlink_below(outdir, parts[:-1], tmp)
        for d in reversed(made_dirs):
            try:
                d.rmdir()
            except OSError:
                pass
        raise


def decompress_bytes(blob: bytes, *, jobs: int | None = 1) -> bytearray:
    """Inverse of :func:`compress_bytes`: the one file of an in-memory archive (a bytearray)."""
    # the output is preallocated up to a bound the archive's own size justifies (a hostile file
    # table may claim any size), and grows past it only with checked chunks
    out = bytearray()
    pos = 0

    def on_entry(fi: int, e: Entry) -> None:
        nonlocal out
        if fi:
            raise FormatError("<bytes>: archive holds more than one file, expected 1")
        out = bytearray(min(e.size, 64 * len(blob)))

    def on_data(fi: int, d) -> None:
        nonlocal pos
        mv = memoryview(d).cast("B")
        n = len(mv)
        if pos + n > len(out):
            out.extend(bytes(pos + n - len(out)))
        with memoryview(out) as dst:
            dst[pos : pos + n] = mv
        pos += n

    report = _iter_archive(io.BytesIO(blob), "<bytes>", _default_jobs(jobs), on_entry, on_data, lambda fi: None)
    if len(report.entries) != 1:
        raise FormatError(f"<bytes>: archive holds {len(report.entries)} files, expected 1")
    del out[pos:]
    return out


def list_entries(archive: str | os.PathLike) -> list[Entry]:
    """The file table of ``archive`` (reads only the header)."""
    with _open_archive(archive) as f:
        return _read_table(_Reader(f, str(archive)))


# ----------------------------------------------------------------------------- helpers


def _open_archive(archive: str | os.PathLike) -> io.BufferedReader:
    """``archive`` opened for reading, once it is a regular file: a FIFO would block the read and
    a device never end; FormatError says what the path is instead."""
    what = not_a_file(archive)
    if what == "missing":
        raise FormatError(f"{archive}: no such file")
    if what is not None:
        raise FormatError(f"{archive}: {what}, not a .glyd archive file")
    return open(archive, "rb")


def _tmp_name(dest: Path) -> Path:
    """A temporary name in ``dest``'s folder. It does not grow with ``dest``'s name: a file whose
    name is as long as the file system allows must restore too."""
    return dest.with_name(f".glyd-{os.urandom(6).hex()}.tmp")


def _refuse_existing(dest: Path, what: str) -> None:
    """Nothing is ever overwritten: not a file, a folder, nor a symbolic link, even a dangling one
    (``Path.exists`` follows links and would let the rename replace it)."""
    if os.path.lexists(dest):
        raise DestinationExistsError(f"{dest}: {what}")


def _make_root(outdir: Path, made: list[Path]) -> None:
    """Create ``outdir`` and its missing parents (noted in ``made``, for the rollback); the user
    named this path, so links on the way to it are followed."""
    missing = []
    d = outdir
    while not d.exists():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        d.mkdir()
        made.append(d)


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)


@contextlib.contextmanager
def _folder_fd(outdir: Path, parts: Sequence[str], made: list[Path] | None = None) -> Iterator[int]:
    """An fd of the folder ``outdir/parts...``, reached one folder at a time with ``O_NOFOLLOW``
    so that no link below ``outdir`` is followed (a link swapped in after a check is not either);
    with ``made``, missing folders are created and noted in it. A link or a file on the way raises
    :class:`DestinationExistsError` naming it."""
    fd = os.open(outdir, _DIR_FLAGS)
    try:
        for i, part in enumerate(parts):
            if made is not None:
                try:
                    os.mkdir(part, dir_fd=fd)
                    made.append(outdir.joinpath(*parts[: i + 1]))
                except FileExistsError:
                    pass
            try:
                sub = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                _refuse_not_a_folder(outdir.joinpath(*parts[: i + 1]), exc)
                raise
            os.close(fd)
            fd = sub
        yield fd
    finally:
        os.close(fd)


def _refuse_not_a_folder(path: Path, exc: OSError) -> None:
    """Raise the one-line refusal for ``path``, a folder on the way to a destination that could not
    be opened (``exc``), when it is a symbolic link or not a folder; else return."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise DestinationExistsError(
            f"{show_path(path)}: a symbolic link (to {show_path(os.readlink(path))}); decompress never writes "
            "through a link below the output folder"
        ) from exc
    if not stat.S_ISDIR(st.st_mode):
        raise DestinationExistsError(f"{show_path(path)}: exists and is not a folder") from exc


def _refuse_existing_at(name: str, dir_fd: int, dest: Path, what: str) -> None:
    """:func:`_refuse_existing` for ``name`` in the folder ``dir_fd`` (``dest`` names it)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    raise DestinationExistsError(f"{show_path(dest)}: {what}")


def _place(outdir: Path, parts: list[str], tmp: str, dest: Path) -> None:
    """Rename the finished temporary file ``tmp`` to ``outdir/parts...``, inside a folder reached
    without following links, once nothing is there."""
    with _folder_fd(outdir, parts[:-1]) as fd:
        # checked again before each rename: on a case-insensitive file system "A" and "a" are
        # one file, and the rename would replace the file restored just before
        _refuse_existing_at(parts[-1], fd, dest, "appeared while decompressing")
        os.replace(tmp, parts[-1], src_dir_fd=fd, dst_dir_fd=fd)


def _unlink_below(outdir: Path, folder: Sequence[str], name: str) -> None:
    """Remove ``name`` from ``outdir/folder...`` for a rollback; a folder that has become a link
    since is not followed, even to clean up (what lies beyond it is not ours)."""
    try:
        with _folder_fd(outdir, folder) as fd:
            os.unlink(name, dir_fd=fd)
    except OSError:  # gone already, or no longer reachable without a link
        pass


def _unlink(p: Path) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass
