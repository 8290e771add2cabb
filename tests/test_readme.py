"""The README's "Python API" section runs as written.

Its ```python blocks are run in order, as one script, by a fresh Python process on the CPU, in a
temporary folder that holds a tiny random bf16 Llama (with a small word-level tokenizer) at the
path the snippet names, ``path/to/bf16-model``, and with the hub switched off (``HF_HUB_OFFLINE``).
Nothing of the snippet is skipped. After it ran, the files it says it writes are checked: the
packed folder and what the ``.glyd`` archive restored, byte for byte.

The default test runs the snippet against this checkout (``src`` on ``PYTHONPATH``); the slow one
does the pip user's path: a wheel of the project, a fresh venv with ``torch==2.13.0`` and
``glyd-lossless[models]`` from that wheel, the snippet run from outside the repository.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SECTION = "## Python API"
#: The model the snippet loads; the test puts a tiny bf16 model there (relative to the snippet's cwd).
MODEL = "path/to/bf16-model"
VOCAB = 320
TORCH_PIN = "torch==2.13.0"


def python_api_blocks(text: str) -> list[str]:
    """The ```python blocks of the README's "Python API" section (up to the next ``## `` heading)."""
    start = text.find(f"\n{SECTION}\n")
    if start < 0:
        raise AssertionError(f"README.md has no {SECTION!r} section")
    end = text.find("\n## ", start + len(SECTION) + 1)
    section = text[start : end if end >= 0 else len(text)]
    return re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)


def test_python_api_blocks_are_found():
    blocks = python_api_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) == 2
    assert "glyd.pack(" in blocks[0] and f'glyd.from_pretrained("{MODEL}")' in blocks[1]
    fake = "# T\n## Python API\n```python\na = 1\n```\n## Next\n```python\nb = 2\n```\n"
    assert python_api_blocks(fake) == ["a = 1\n"]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # the answer letters too: glyd eval scores MMLU by the tokens of " A" .. " D"
    named = ["<pad>", "<s>", "</s>", "<unk>", "Hello", "A", "B", "C", "D"]
    words = named + [f"w{i}" for i in range(VOCAB - len(named))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def write_tiny_model(cwd: Path) -> Path:
    """A random bf16 Llama (2 layers, hidden 64) and its tokenizer, saved at ``cwd / MODEL``."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    dst = cwd / MODEL
    model.save_pretrained(dst)
    _tokenizer().save_pretrained(dst)
    return dst


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def run_snippet(python: str, cwd: Path, env: dict[str, str], timeout: int) -> float:
    """Run the README's Python API blocks with ``python`` in ``cwd``; check what they wrote; return seconds."""
    script = cwd / "readme_python_api.py"
    script.write_text("\n".join(python_api_blocks(README.read_text(encoding="utf-8"))), encoding="utf-8")
    env = {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    t0 = time.monotonic()
    r = subprocess.run([python, script.name], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t0
    assert r.returncode == 0, f"the README snippet failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    assert re.search(r"^12\.0\d*$", r.stdout, flags=re.M), r.stdout  # print(p.bits_per_weight): about 12.003
    packed = cwd / "model-glyd"
    assert (packed / "glyd.json").is_file() and (cwd / "model-glyd.glyd").is_file()
    assert _files(cwd / "restored" / "model-glyd") == _files(packed)
    return took


def _env_without_python_paths() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "TRITON_"))}


def test_readme_python_api_runs_as_written(tmp_path):
    write_tiny_model(tmp_path)
    env = {**_env_without_python_paths(), "PYTHONPATH": str(ROOT / "src")}
    run_snippet(sys.executable, tmp_path, env, timeout=600)


def _pip(python: Path | str, *args: str, cwd: Path, timeout: int = 1800) -> None:
    r = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args], cwd=cwd,
                       env=_env_without_python_paths(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"pip {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A wheel of this checkout installed with ``[models,serve]`` in a fresh venv (``torch==2.13.0``
    first); the venv's python. Built once for the slow tests of this module."""
    root = tmp_path_factory.mktemp("wheel")
    wheels, venv = root / "wheels", root / "venv"
    _pip(sys.executable, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT), cwd=root)
    (wheel,) = wheels.glob("glyd_lossless-*.whl")
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    _pip(py, "install", TORCH_PIN, cwd=root)
    _pip(py, "install", f"{wheel}[models,serve]", cwd=root)
    where = subprocess.run([str(py), "-c", "import glyd, torch; print(glyd.__file__); print(torch.__version__)"],
                           cwd=root, env=_env_without_python_paths(), capture_output=True, text=True, check=True)
    glyd_file, torch_version = where.stdout.split()
    assert Path(glyd_file).is_relative_to(venv) and torch_version.split("+")[0] == TORCH_PIN.split("==")[1]
    return py


@pytest.mark.slow
def test_readme_python_api_from_a_wheel_in_a_fresh_venv(wheel_venv, tmp_path):
    """The pip user's path: wheel, fresh venv, ``pip install <wheel>[models]``, the snippet outside the repo."""
    write_tiny_model(tmp_path)
    took = run_snippet(str(wheel_venv), tmp_path, _env_without_python_paths(), timeout=900)
    print(f"the README snippet from the wheel: {took:.0f} s")


def command_names(text: str) -> set[str]:
    """The ``glyd`` subcommands of the README's "Command line" block."""
    start = text.index("\n## Command line\n")
    block = text[text.index("```bash", start):text.index("```\n", text.index("```bash", start) + 7)]
    return {ln.split()[1] for ln in block.splitlines() if ln.startswith("glyd ")}


def _glyd(py: Path, *args: str, cwd: Path, ok: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**_env_without_python_paths(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([str(py.parent / "glyd"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    if ok:
        assert r.returncode == 0, f"glyd {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _serve_once(py: Path, packed: Path, cwd: Path) -> str:
    """``glyd serve`` on a free loopback port, one /v1/completions request by the venv's openai client, stopped."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**_env_without_python_paths(), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HOME": str(cwd / "hf")}
    log = open(cwd / "serve.log", "wb")
    srv = subprocess.Popen([str(py.parent / "glyd"), "serve", str(packed), "--port", str(port), "--device", "cpu",
                            "--max-tokens", "8"], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    client = (f"import openai, time\nc = openai.OpenAI(base_url='http://127.0.0.1:{port}/v1', api_key='x')\n"
              "for _ in range(600):\n    try:\n        c.models.list(); break\n    except Exception:\n"
              "        time.sleep(0.5)\n"
              "r = c.completions.create(model=c.models.list().data[0].id, prompt='the cat', max_tokens=4)\n"
              "print(repr(r.choices[0].text))\n")
    try:
        r = subprocess.run([str(py), "-c", client], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    finally:
        srv.terminate()
        srv.wait(timeout=60)
        log.close()
    assert r.returncode == 0, f"the client failed:\n{r.stderr[-3000:]}\nserver:\n{(cwd / 'serve.log').read_text()[-3000:]}"
    return r.stdout.strip()


@pytest.mark.slow
def test_readme_command_lines_from_a_wheel_in_a_fresh_venv(wheel_venv, tmp_path):
    """Every README "Command line" subcommand, as a pip user runs it: the installed ``glyd`` on a tiny model."""
    import glyd

    py, cwd = wheel_venv, tmp_path
    src = write_tiny_model(cwd)
    ran = set()
    for layout in (*glyd.LAYOUTS, "auto"):
        _glyd(py, "pack", str(src), f"packed-{layout}", "--layout", layout, cwd=cwd)
    ran.add("pack")
    packed = cwd / "packed-fixed12"
    _glyd(py, "unpack", str(packed), "unpacked", cwd=cwd)
    orig, back = _tensors(src), _tensors(cwd / "unpacked")
    assert orig.keys() == back.keys() and all(
        torch.equal(orig[k].view(torch.int16), back[k].view(torch.int16)) for k in orig if orig[k].dtype == torch.bfloat16)
    _glyd(py, "verify", str(packed), cwd=cwd)
    assert "bits" in _glyd(py, "info", str(packed), cwd=cwd).stdout
    ran |= {"unpack", "verify", "info"}
    out = _glyd(py, "demo", "--model", str(src), "--layout", "fixed12", "--max-new-tokens", "4", "--device", "cpu",
                cwd=cwd).stdout
    assert out.strip()
    ran.add("demo")
    assert "GiB" in _glyd(py, "fit", str(src), "--gpu", "h200", "--context", "8192", cwd=cwd).stdout
    assert "GiB" in _glyd(py, "fit", str(packed), "--gpu", "24GB", cwd=cwd).stdout
    ran.add("fit")
    # eval with the text and MMLU sample the package ships (no repository beside it)
    _glyd(py, "eval", str(src), "--modes", "fixed12,exact", "--device", "cpu", "--ppl-tokens", "256", "--window",
          "128", "--stride", "64", "--mmlu-per-subject", "2", "--subjects", "abstract_algebra", "--no-decode",
          cwd=cwd)
    ran.add("eval")
    assert _serve_once(py, packed, cwd).startswith("'")
    ran.add("serve")
    _glyd(py, "compress", str(packed), "-o", "p.glyd", cwd=cwd)
    _glyd(py, "test", "p.glyd", cwd=cwd)
    _glyd(py, "decompress", "p.glyd", "-o", "restored", cwd=cwd)
    assert _files(cwd / "restored" / packed.name) == _files(packed)
    ran |= {"compress", "test", "decompress"}
    r = _glyd(py, "bench", "--shape", "64x64", "--m", "1", cwd=cwd, ok=False)  # CUDA only: a clear refusal here
    assert r.returncode != 0 and "CUDA" in r.stderr and len(r.stderr.strip().splitlines()) <= 3
    ran.add("bench")
    assert ran == command_names(README.read_text(encoding="utf-8"))


def test_readme_command_block_names_every_subcommand():
    from glyd.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    # the README's block shows every subcommand, and the slow wheel test above runs each one it shows
    assert command_names(README.read_text(encoding="utf-8")) == set(sub.choices)
