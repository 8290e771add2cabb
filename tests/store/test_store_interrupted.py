"""Interrupted runs: SIGTERM and Ctrl-C clean up; what SIGKILL leaves is removed by the next run,
never a temporary another live writer is still filling."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from store_helpers import leftovers, make_model_folder

import glyd
import glyd.cli
from glyd.cli import main
from glyd.store import CheckpointReader, CheckpointWriter, pack_folder
from glyd.store import _atomic

SRC_DIR = str(Path(__file__).resolve().parents[2] / "src")
HOUR = 3600

WRITER = """
import os, signal, sys, torch
from glyd.store import CheckpointWriter
w = CheckpointWriter(sys.argv[1], layout="fixed12")
w.add_tensor("a", torch.zeros(1000))
w.flush()
print(w._dir.tmp, flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()  # stay alive, writing, until told
"""


def _python(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env={**os.environ, "PYTHONPATH": SRC_DIR},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _temp(parent: Path, name: str, age_s: float = 0.0) -> Path:
    """A fake temporary ``name`` whose contents last changed ``age_s`` ago."""
    p = parent / name
    if name.endswith(".tmp"):
        p.write_bytes(b"half a decompressed file")
        entries = [p]
    else:
        p.mkdir()
        (p / ".shard-00001.safetensors").write_bytes(b"half a shard")
        entries = [p / ".shard-00001.safetensors", p]
    t = time.time() - age_s
    for e in entries:
        os.utime(e, (t, t))
    return p


def test_sigkill_leftovers_go_and_a_live_writers_stay(tmp_path):
    make_model_folder(tmp_path / "src")
    dst = tmp_path / "out"
    live = _python(WRITER, str(dst), "live")
    killed = _python(WRITER, str(dst), "kill")
    try:
        live_tmp, dead_tmp = Path(live.stdout.readline().strip()), Path(killed.stdout.readline().strip())
        assert killed.wait(timeout=60) == -signal.SIGKILL
        assert live_tmp.is_dir() and dead_tmp.is_dir() and live_tmp != dead_tmp
        assert f".out.{killed.pid}-" in dead_tmp.name  # the owner is in the name

        pack_folder(tmp_path / "src", dst, progress=False)
        assert not dead_tmp.exists()  # its owner is gone: removed
        assert live_tmp.is_dir() and (live_tmp / ".shard-00001.safetensors").is_file()  # still being written
        assert set(CheckpointReader(dst).files) == {"config.json", "glyd_loader.py", "glyd.source_config.json",
                                                    "tokenizer.json"}
    finally:
        live.stdin.close()
        assert live.wait(timeout=60) == 0
        killed.kill()
    assert not live_tmp.exists()  # the live writer cleaned up after itself at exit
    assert leftovers(tmp_path) == []


def test_which_temporaries_are_stale(tmp_path, caplog):
    make_model_folder(tmp_path / "src")
    dead, me, here = _dead_pid(), os.getpid(), _atomic._host_tag()
    other_host = "0" * 8 if here != "0" * 8 else "1" * 8
    gone = [
        _temp(tmp_path, f".out.{dead}-{here}.abcdefgh.glyd-tmp"),  # owner gone, this machine
        _temp(tmp_path, f".out.{dead}-{other_host}.bbcdefgh.glyd-tmp", 25 * HOUR),  # untouched for a day
        _temp(tmp_path, ".out.cbcdefgh.glyd-tmp", 25 * HOUR),  # old naming (no owner), a day old
        _temp(tmp_path, f".out.{dead}.1badf00d.tmp", 11 * 60),  # filecodec: owner gone, idle 11 min
    ]
    kept = [
        _temp(tmp_path, f".out.{me}-{here}.dbcdefgh.glyd-tmp", 23 * HOUR),  # its owner is running
        _temp(tmp_path, f".out.{dead}-{other_host}.ebcdefgh.glyd-tmp"),  # another machine's pid: unknown
        _temp(tmp_path, ".out.fbcdefgh.glyd-tmp", 23 * HOUR),  # no owner named, not a day old yet
        _temp(tmp_path, f".out.{dead}.2badf00d.tmp", 60),  # filecodec: no host, touched a minute ago
        _temp(tmp_path, f".out.{me}.3badf00d.tmp", 11 * 60),  # filecodec: its owner is running
        _temp(tmp_path, f".other.{dead}-{here}.gbcdefgh.glyd-tmp"),  # another destination's
        _temp(tmp_path, ".out.hbcdefgh.not-glyd"),  # not glyd's naming
    ]
    old = _temp(tmp_path, f".out.{dead}-{here}.ibcdefgh.glyd-old")  # the only copy of a replaced checkpoint
    with caplog.at_level(logging.INFO, logger="glyd"):
        pack_folder(tmp_path / "src", tmp_path / "out", progress=False)
    assert [p.name for p in gone if p.exists()] == []
    assert [p.name for p in kept if not p.exists()] == []
    assert old.exists() and f"{old / 'old'} holds the checkpoint an interrupted run was replacing" in caplog.text
    assert f"removed {gone[0]}, left by an interrupted glyd run" in caplog.text
    # Once the destination exists again, the moved-aside copy is only a leftover.
    import torch

    with CheckpointWriter(tmp_path / "out", layout="fixed12", overwrite=True) as w:
        w.add_tensor("a", torch.zeros(2))
    assert not old.exists()


class _NotHandled(Exception):
    pass


@pytest.fixture
def sigterm_guard():
    """Without the CLI's own handler a SIGTERM sent by a test would end pytest: fail the test instead."""

    def guard(signum, frame):
        raise _NotHandled("SIGTERM reached the test: the CLI did not handle it")

    previous = signal.signal(signal.SIGTERM, guard)
    yield guard
    signal.signal(signal.SIGTERM, previous)


def _sigterm_on_second_matrix(monkeypatch):
    from glyd.store import folder

    real, calls = folder.codec_pack, []

    def pack(w, layout="fixed12"):
        calls.append(1)
        if len(calls) == 2:  # a shard is written, more to come
            os.kill(os.getpid(), signal.SIGTERM)
        return real(w, layout)

    monkeypatch.setattr(folder, "codec_pack", pack)
    return calls


def test_sigterm_cleans_up_and_exits_143(tmp_path, capsys, monkeypatch, sigterm_guard):
    make_model_folder(tmp_path / "src", sharded=True)
    calls = _sigterm_on_second_matrix(monkeypatch)
    before = signal.getsignal(signal.SIGTERM)
    assert before is sigterm_guard
    rc = main(["-q", "pack", str(tmp_path / "src"), str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 143 and err == "glyd pack: terminated" and len(calls) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    assert signal.getsignal(signal.SIGTERM) == before  # the CLI puts the old handler back


def test_sigterm_from_another_process(tmp_path):
    make_model_folder(tmp_path / "src", sharded=True)
    child = _python("""
        import sys, time, glyd.cli
        from glyd.store import folder
        real = folder.codec_pack
        def slow(w, layout="fixed12"):
            p = real(w, layout)
            print("ready", flush=True)
            time.sleep(60)
            return p
        folder.codec_pack = slow
        sys.exit(glyd.cli.main(["-q", "pack", sys.argv[1], sys.argv[2]]))
    """, str(tmp_path / "src"), str(tmp_path / "out"))
    try:
        assert child.stdout.readline().strip() == "ready"
        assert leftovers(tmp_path)  # writing: its temporary is there
        child.send_signal(signal.SIGTERM)
        rc = child.wait(timeout=60)
    finally:
        child.kill()
    # the toy config builds no transformers model: a warning says loadability was not checked
    err = [ln for ln in child.stderr.read().strip().splitlines() if not ln.startswith("WARNING")]
    assert rc == 143 and err == ["glyd pack: terminated"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("how, rc, line", [("ctrl-c", 130, "glyd: interrupted"), ("sigterm", 143, "glyd: terminated")])
def test_an_interrupted_start_up_is_one_line(monkeypatch, capsys, sigterm_guard, how, rc, line):
    def slow_import(name):
        if how == "ctrl-c":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal arrives here, as it would during a long import

    monkeypatch.setattr(glyd.cli.importlib, "import_module", slow_import)
    try:
        got = main(["verify", "somewhere"])
    except KeyboardInterrupt:  # re-raised, it would stop the whole pytest run
        pytest.fail("KeyboardInterrupt escaped glyd.cli.main")
    assert got == rc
    assert capsys.readouterr().err.strip() == line
