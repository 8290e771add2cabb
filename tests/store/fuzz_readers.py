"""Run every reader of a packed folder on a hostile copy and judge each outcome.

Outcomes (``Outcome.kind``):

* ``error``: a :class:`glyd.errors.GlydError`, one line, naming the folder (the file, tensor or
  field is inside the message: every glyd message starts with the path at fault);
* ``same``: success, and everything read is the pristine folder's, bit for bit;
* ``silent``: success with other bits, where that is documented: a reader that does not verify
  (``CheckpointReader.get``, ``info``; ``verify=False`` loading) given a folder whose only change
  is bytes inside the stored arrays' data (the store readers also: a packed matrix's true width
  in glyd.json moved within its 64-column padding, see ``Case.unverified_ok``);
* ``warned``: success with a documented difference that a warning names: a file the manifest
  does not list is not part of the checkpoint (logged, never copied by unpack); an edited
  config.json loaded with ``verify=False`` (tests/hf/test_fuzz_loading.py);
* ``foreign``: natively, a config.json that no longer names glyd's quantizer is loaded by
  transformers alone (tests/hf/test_fuzz_loading.py);
* ``defect``: anything else: another exception (a traceback), a message of several lines or
  naming no file, other bits without an error, something left behind by a failed write.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import shutil
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import torch

import glyd.cli
from glyd.codec import Packed, PackedExperts
from glyd.errors import GlydError
from glyd.store import CheckpointReader, info, key_for, unpack_folder
from glyd.store._safetensors import dtype_name, tensor_bytes_view

from fuzz_cases import Case

KINDS = ("error", "same", "silent", "warned", "foreign", "defect")


@dataclass
class Outcome:
    case: str
    reader: str
    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"[{self.reader}] {self.case}: {self.kind}: {' '.join(self.detail.split())}"


def signature(t: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    """dtype, shape and raw bytes of a tensor: equal signatures are equal bits."""
    return dtype_name(t.dtype), tuple(t.shape), bytes(tensor_bytes_view(t))


def where(exc: BaseException) -> str:
    """file:line of the innermost frame of the traceback (for a defect's report)."""
    tb = traceback.extract_tb(exc.__traceback__)
    return f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?"


def judge_error(exc: Exception, folder: Path) -> tuple[str, str]:
    msg = str(exc)
    what = f"{type(exc).__name__}: {msg[:300]}"
    if not isinstance(exc, GlydError):
        return "defect", f"not a GlydError: {what} (at {where(exc)})"
    if "\n" in msg:
        return "defect", f"not one line: {what}"
    if str(folder) not in msg:
        return "defect", f"names no file of the folder: {what}"
    return "error", what


def read_tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` -> its bytes; a link or special file is reported as such."""
    out: dict[str, bytes] = {}
    for dirpath, dirs, files in os.walk(root):
        for n in [*dirs, *files]:
            p = Path(dirpath) / n
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = b"<symlink>"
            elif p.is_file():
                out[rel] = p.read_bytes()
    return out


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".glyd-" in p.name)


@dataclass
class Pristine:
    """What every reader gives for the untouched folder."""

    tensors: dict[str, Any]  # name -> signature of the original tensor
    arrays: dict[str, Any]  # safetensors key -> signature of the stored array
    unpacked: dict[str, bytes]  # unpack_folder's output, file -> bytes
    info: list[dict[str, Any]]  # glyd.store.info's rows


def read_all(r: CheckpointReader) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every tensor of an open checkpoint, as originals and as stored arrays (no hash checked)."""
    tensors, arrays = {}, {}
    for name in r.names():
        t = r.get(name)
        if isinstance(t, (Packed, PackedExperts)):
            arrays.update({key_for(name, a): signature(x) for a, x in t.arrays.items()})
            t = r.get_original(name)
        else:
            arrays[name] = signature(t)
        tensors[name] = signature(t)
    return tensors, arrays


def pristine(folder: Path, scratch: Path) -> Pristine:
    r = CheckpointReader(folder)
    r.verify(progress=False)
    tensors, arrays = read_all(r)
    dst = scratch / f"{folder.name}-unpacked"
    unpack_folder(folder, dst, progress=False)
    tree = read_tree(dst)
    shutil.rmtree(dst)
    return Pristine(tensors, arrays, tree, info(folder)[0])


@functools.cache
def _parser():
    return _build_parser()


_build_parser = glyd.cli.build_parser


def _cli(*argv: str) -> tuple[int | None, str, Exception | None]:
    out, err = io.StringIO(), io.StringIO()
    try:
        # One parser for the whole campaign: building it (every area's sub-commands) is most of a
        # failing command's time, and main() does nothing else with it than parse.
        with redirect_stdout(out), redirect_stderr(err), mock.patch.object(glyd.cli, "build_parser", _parser):
            rc = glyd.cli.main(["-q", *argv])
    except Exception as exc:  # a traceback out of the CLI
        return None, err.getvalue(), exc
    return rc, err.getvalue(), None


class Judge:
    """Runs the store readers for one case and collects their outcomes."""

    def __init__(self, case: Case, folder: Path, scratch: Path, base: Pristine):
        self.case, self.folder, self.scratch, self.base = case, folder, scratch, base
        self.outcomes: list[Outcome] = []
        self.verdicts: dict[str, bool] = {}  # reader -> succeeded
        self.warnings: list[str] = []  # glyd's warnings while the readers ran

    def add(self, reader: str, kind: str, detail: str = "") -> None:
        self.outcomes.append(Outcome(self.case.id, reader, kind, detail))

    def attempt(self, reader: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn``; an exception is judged (and None returned), a success returns its value."""
        try:
            value = fn()
        except Exception as exc:
            self.add(reader, *judge_error(exc, self.folder))
            self.verdicts[reader] = False
            return None
        self.verdicts[reader] = True
        return value if value is not None else True

    def compare(self, reader: str, got: Any, want: Any, silent_ok: bool, what: str) -> None:
        """``silent_ok``: the reader does not verify, so ``case.unverified_ok`` allows other bits."""
        if got == want:
            self.add(reader, "same")
        elif silent_ok and self.case.unverified_ok:
            self.add(reader, "silent", what)
        else:
            self.add(reader, "defect", f"succeeded with other bits: {what}")

    def no_leftovers(self, reader: str, dst: Path) -> None:
        left = leftovers(self.scratch)
        if left or (dst.exists() and not self.verdicts.get(reader)):
            self.add(reader, "defect", f"left on disk after an error: {left or [dst.name]}")
            shutil.rmtree(dst, ignore_errors=True)

    def unpacked(self, reader: str, dst: Path) -> None:
        tree = read_tree(dst)
        diff = sorted(k for k in tree.keys() | self.base.unpacked.keys() if tree.get(k) != self.base.unpacked.get(k))
        left_out = [k for k in diff if k not in tree and any(k in w and "not part of the checkpoint" in w
                                                             for w in self.warnings)]
        if diff and left_out == diff:
            self.add(reader, "warned", f"not copied, as a warning said: {diff[:4]}")
        else:
            self.compare(reader, tree, self.base.unpacked, False, f"unpacked files differ: {diff[:4]}")

    def run_store(self) -> None:
        r = self.attempt("get", lambda: CheckpointReader(self.folder))
        if r is not None:
            got = self.attempt("get", lambda: read_all(r))
            if got is not None:
                self.compare("get", got, (self.base.tensors, self.base.arrays), True, _diff(got, self.base))
        r = self.attempt("verify", lambda: CheckpointReader(self.folder))
        if r is not None and self.attempt("verify", lambda: r.verify(progress=False)) is not None:
            got = self.attempt("verify", lambda: read_all(r))
            if got is not None:
                self.compare("verify", got, (self.base.tensors, self.base.arrays), False, _diff(got, self.base))
        rows = self.attempt("info", lambda: info(self.folder)[0])
        if rows is not None:
            self.compare("info", sorted(rows, key=_name), sorted(self.base.info, key=_name), True, "other rows")
        dst = self.scratch / "unpacked"
        if self.attempt("unpack", lambda: unpack_folder(self.folder, dst, progress=False)) is not None:
            self.unpacked("unpack", dst)
        self.no_leftovers("unpack", dst)
        shutil.rmtree(dst, ignore_errors=True)
        for cmd in ("verify", "info", "unpack"):
            self.run_cli(cmd)

    def run_cli(self, cmd: str) -> None:
        reader = f"cli {cmd}"
        dst = self.scratch / "cli-unpacked"
        argv = [cmd, str(self.folder)] + ([str(dst)] if cmd == "unpack" else [])
        rc, err, exc = _cli(*argv)
        errors = [line for line in err.splitlines() if ": error: " in line]
        if exc is not None:
            self.add(reader, "defect", f"traceback: {type(exc).__name__}: {str(exc)[:300]} (at {where(exc)})")
        elif rc == 0 and not errors:
            self.verdicts[reader] = True
            if cmd == "unpack":
                self.unpacked(reader, dst)
            elif cmd == "verify":  # what verify accepted must be the pristine folder: the API read it
                self.add(reader, "same" if self.verdicts.get("verify") else "defect", "accepted")
            else:
                self.add(reader, "same")
        elif rc == 1 and len(errors) == 1 and err.rstrip().endswith(errors[0]) and str(self.folder) in errors[0]:
            self.verdicts[reader] = False
            self.add(reader, "error", errors[0][:300])
        else:
            self.add(reader, "defect", f"exit {rc}, stderr {err[-400:]!r}")
        if self.verdicts.get(reader) != self.verdicts.get(cmd):
            self.add(reader, "defect", f"the CLI and the API disagree (cli ok: {self.verdicts.get(reader)}, "
                                       f"API ok: {self.verdicts.get(cmd)})")
        if cmd == "unpack":
            self.no_leftovers(reader, dst)
            shutil.rmtree(dst, ignore_errors=True)


def _name(row: dict[str, Any]) -> str:
    return row["name"]


class _Collect(logging.Handler):
    def __init__(self, into: list[str]):
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


def _diff(got: tuple[dict, dict], base: Pristine) -> str:
    tensors, arrays = got
    bad = sorted(k for k in tensors.keys() | base.tensors.keys() if tensors.get(k) != base.tensors.get(k))
    bad_arrays = sorted(k for k in arrays.keys() | base.arrays.keys() if arrays.get(k) != base.arrays.get(k))
    return f"tensors {bad[:3]}, arrays {bad_arrays[:3]}"


def run_cases(cases: list[Case], base_folder: Path, base: Pristine, tmp: Path,
              extra: Callable[[Judge], None] | None = None) -> list[Outcome]:
    """Apply each case to a fresh copy of ``base_folder`` and run every reader; returns all outcomes."""
    outcomes: list[Outcome] = []
    for i, case in enumerate(cases):
        root = tmp / f"case-{i:05d}"
        folder, outside = root / "ckpt", root / "outside"
        shutil.copytree(base_folder, folder, symlinks=True)
        outside.mkdir()
        case.mutate(folder, outside)
        judge = Judge(case, folder, root, base)
        handler = _Collect(judge.warnings)
        glyd_log = logging.getLogger("glyd")
        glyd_log.addHandler(handler)
        try:
            judge.run_store()
            if extra is not None:
                extra(judge)  # more readers, adding to judge.outcomes
            outcomes += judge.outcomes
        finally:
            glyd_log.removeHandler(handler)
        shutil.rmtree(root, ignore_errors=True)
    return outcomes


def tally(outcomes: list[Outcome]) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0)
    for o in outcomes:
        counts[o.kind] += 1
    return counts


def report(outcomes: list[Outcome], limit: int = 30) -> str:
    """The defects, one a line (at most ``limit``); with GLYD_FUZZ_LOG=FILE, every outcome is
    also appended to FILE."""
    if os.environ.get("GLYD_FUZZ_LOG"):
        with open(os.environ["GLYD_FUZZ_LOG"], "a", encoding="utf-8") as f:
            f.writelines(f"{o}\n" for o in outcomes)
    defects = [o for o in outcomes if o.kind == "defect"]
    lines = [str(o) for o in defects[:limit]]
    if len(defects) > limit:
        lines.append(f"... and {len(defects) - limit} more")
    return "\n".join(lines)


STORE_READERS = {"get", "verify", "info", "unpack", "cli verify", "cli info", "cli unpack"}


def check_campaign(cases: list[Case], outcomes: list[Outcome], readers: set[str] = STORE_READERS) -> dict[str, int]:
    """Every case ran every reader once; no defect. Returns the count of each kind of outcome."""
    assert cases, "the generator made no case"
    assert len({c.id for c in cases}) == len(cases), "two cases with one name"
    per_case: dict[str, list[str]] = {}
    for o in outcomes:
        per_case.setdefault(o.case, []).append(o.reader)
    counts = tally(outcomes)
    defects = report(outcomes)  # (and the log, when asked for)
    assert counts["defect"] == 0, f"{counts['defect']} defect(s) in {len(outcomes)} outcomes:\n{defects}"
    assert set(per_case) == {c.id for c in cases}, "a case ran no reader"
    odd = [c for c, r in per_case.items() if sorted(r) != sorted(readers)]
    assert not odd, f"{len(odd)} case(s) did not run each reader once, e.g. {odd[0]}: {sorted(per_case[odd[0]])}"
    return counts
