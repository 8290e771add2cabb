"""``glyd serve`` and ``transformers serve`` as commands, each in a process of its own, on a packed folder.

``transformers serve --trust-remote-code PACKED`` runs in a process that never imports glyd: the
folder's ``auto_map`` (``glyd_loader.py``, written by ``glyd pack``) is what brings glyd in. Both
answer the ``openai`` client with the tokens ``generate()`` gives greedily; both are stopped at the end.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

import glyd  # noqa: E402
from glyd.apps.cli_serve import config_from_args  # noqa: E402
from glyd.cli import build_parser  # noqa: E402
from glyd.store import pack_folder  # noqa: E402
from serve_model import build_chat_model  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
MESSAGES = [{"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-cmd")
    return pack_folder(build_chat_model(root / "bf16"), root / "packed", layout="fixed12", progress=False).dst


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expected(folder: Path, n: int) -> str:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = glyd.from_pretrained(folder, device="cpu", progress=False)
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[0, len(ids):]
    return tok.decode(out, skip_special_tokens=True)


def _serve(argv: list[str], tmp_path: Path, port: int, model: str, n: int) -> str:
    """Run ``argv`` as a server, ask one chat completion, stop it; returns the answer."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
               HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", HF_HUB_DISABLE_UPDATE_CHECK="1")
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        end = time.monotonic() + 120
        while True:
            try:
                r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=n, temperature=0)
                return r.choices[0].message.content
            except openai.APIConnectionError:
                if proc.poll() is not None or time.monotonic() > end:
                    pytest.fail(f"the server did not answer (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
                time.sleep(0.25)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_transformers_serve_loads_a_packed_folder_through_its_auto_map(packed, tmp_path):
    port = _free_port()
    argv = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(packed), "--trust-remote-code",
            "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
    assert _serve(argv, tmp_path, port, str(packed), 10) == _expected(packed, 10)


@pytest.mark.slow  # the same server as tests/apps/test_serve.py's, started by the command line in a process of its own
def test_glyd_serve_command_answers(packed, tmp_path):
    port = _free_port()
    argv = [sys.executable, "-m", "glyd.cli", "serve", str(packed), "--name", "tiny", "--device", "cpu",
            "--port", str(port)]
    assert _serve(argv, tmp_path, port, "tiny", 10) == _expected(packed, 10)


def test_command_line_becomes_a_config():
    args = build_parser().parse_args(["serve", "m", "--layout", "tiered", "--kv", "lossless", "--port", "0",
                                      "--temperature", "0.5", "--top-p", "0.9", "--max-tokens", "64"])
    cfg = config_from_args(args)
    assert (cfg.model, cfg.layout, cfg.kv, cfg.port, cfg.temperature, cfg.top_p, cfg.max_tokens, cfg.batching) == \
        ("m", "tiered", "lossless", 0, 0.5, 0.9, 64, False)
    assert cfg.cuda_graphs is None
    graphs = [config_from_args(build_parser().parse_args(["serve", "m", "--cuda-graphs", v])).cuda_graphs
              for v in ("on", "off", "auto")]
    assert graphs == [True, False, None]


def test_bad_option_is_one_line(capsys):
    from glyd.cli import main

    assert main(["serve", "m", "--kv", "lossless", "--num-blocks", "4"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "glyd serve: error:" in err and "one at a time" in err


def test_missing_serving_package_names_the_extra(monkeypatch, capsys):
    from glyd.cli import main

    monkeypatch.setitem(sys.modules, "fastapi", None)  # "import fastapi" now fails
    assert main(["serve", "no-such-folder"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == 'glyd serve: error: the package fastapi is not installed; install it with: pip install "glyd-lossless[serve]"'


@pytest.mark.parametrize("version", ["5.16.1", "5.18.0", "5.25.0"])
def test_transformers_outside_the_tested_serving_api_is_refused(monkeypatch, capsys, version):
    # a fresh `pip install transformers` gave 5.25.0, whose model manager takes no device=: glyd serve
    # died in a TypeError traceback before this check had an upper bound
    from glyd.cli import main

    # the module glyd serve will import now (another test may have put a fresh one in sys.modules)
    monkeypatch.setattr(sys.modules["transformers"], "__version__", version)
    assert main(["serve", "no-such-folder"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"this is transformers {version}" in err and "<5.18" in err


@pytest.mark.parametrize("kind, words", [("missing", "no such model folder"), ("file", "not a folder"),
                                         ("empty", "no config.json"), ("no-tokenizer", "tokenizer could not be loaded")])
def test_a_model_argument_that_is_not_a_model_folder_is_one_line(tmp_path, capsys, kind, words):
    # each was a traceback from transformers' tokenizer loader (OSError, ValueError)
    from glyd.cli import main

    path = tmp_path / "model"
    if kind == "file":
        path.write_text("")
    elif kind != "missing":
        path.mkdir()
        if kind == "no-tokenizer":
            (path / "config.json").write_text('{"model_type": "mistral"}')
    assert main(["serve", str(path), "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"glyd serve: error: {path}") and words in err


def test_a_port_in_use_is_a_glyd_error(packed, capsys):
    # uvicorn logged its bind error and ended the command with SystemExit(3), not glyd's one line and status 1
    from glyd.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(packed), "--device", "cpu", "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"glyd serve: error: could not listen on 127.0.0.1:{port}")
