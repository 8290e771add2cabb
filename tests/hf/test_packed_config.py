"""config.json of a packed folder: ``model_type: "glyd"``, so transformers without glyd refuses it.

Before, a packed folder kept the model's own model_type and plain transformers (no ``import glyd``)
only warned "Unknown quantization type" and returned a model of random weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import glyd
from glyd.errors import FormatError
from glyd.hf.checks import check_folder
from glyd.store import MANIFEST
from glyd.store._config import LOADER_CLASS, LOADER_FILE, LOADER_SOURCE, ORIGINAL_KEY, PACKED_MODEL_TYPE, plain_config
from glyd.store.folder import pack_folder, unpack_folder

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2ForCausalLM  # noqa: E402

SRC = str(Path(glyd.__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def packed(tiny_model_folder, tmp_path_factory):
    model = glyd.from_pretrained(tiny_model_folder("qwen2"), device="cpu", progress=False)
    return glyd.save_pretrained(model, tmp_path_factory.mktemp("packed-config") / "glyd", progress=False)


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _bits(model, ids):
    with torch.no_grad():
        return model(ids).logits.view(torch.int16)


def test_every_writer_says_glyd(packed, tiny_model_folder, tmp_path):
    by_cli = pack_folder(tiny_model_folder("qwen2"), tmp_path / "cli", progress=False).dst
    for folder in (packed, by_cli):
        cfg = _config(folder)
        assert cfg["model_type"] == PACKED_MODEL_TYPE
        assert cfg["quantization_config"][ORIGINAL_KEY] == "qwen2"
        assert cfg["auto_map"] == {"AutoConfig": LOADER_CLASS} and (folder / LOADER_FILE).read_text() == LOADER_SOURCE


def test_plain_transformers_refuses_a_packed_folder(packed):
    # A child that never imports glyd: transformers alone. It does not run the folder's loader
    # (glyd_loader.py, its auto_map) unless trusted; trusted with glyd missing, the loader names the package.
    # One child tries both in turn (untrusted first; starting a child takes seconds), a line each.
    code = ("import sys; from transformers import AutoModelForCausalLM\n"
            "for trust in ('no', 'trust'):\n"
            "    if trust == 'trust':\n        sys.modules['glyd'] = None\n"
            "    try:\n        AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=trust == 'trust')\n"
            "    except (ValueError, ImportError) as e:\n        print(trust, 'REFUSED', ' '.join(str(e).split()))\n"
            "    else:\n        print(trust, 'LOADED')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(packed.parent / "hf-modules")
    out = subprocess.run([sys.executable, "-c", code, str(packed)], capture_output=True, text=True,
                         env=env, timeout=300, cwd=str(packed), stdin=subprocess.DEVNULL)
    lines = {ln.partition(" ")[0]: ln.partition(" ")[2] for ln in out.stdout.splitlines() if ln.startswith(("no ", "trust "))}
    for trust, words in (("no", "trust_remote_code=True"), ("trust", "pip install 'glyd-lossless[models]'")):
        said = lines.get(trust, "")
        assert said.startswith("REFUSED"), (trust, out.stdout + out.stderr[-2000:])
        assert words in said, (trust, said)


def test_glyd_loads_it_every_way(packed, tiny_model_folder, input_ids):
    want = _bits(glyd.from_pretrained(tiny_model_folder("qwen2"), device="cpu", progress=False), input_ids)
    config = AutoConfig.from_pretrained(packed)
    assert type(config).__name__ == "Qwen2Config" and config.quantization_config["quant_method"] == "glyd"
    for load in (lambda: glyd.from_pretrained(packed, device="cpu", progress=False),
                 lambda: AutoModelForCausalLM.from_pretrained(packed),
                 lambda: Qwen2ForCausalLM.from_pretrained(packed)):
        model = load()
        assert type(model).__name__ == "Qwen2ForCausalLM"
        assert torch.equal(_bits(model, input_ids), want)


def test_saved_again_it_says_glyd(packed, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(packed)
    model.save_pretrained(tmp_path / "again")
    cfg = _config(tmp_path / "again")
    assert cfg["model_type"] == PACKED_MODEL_TYPE and cfg["quantization_config"][ORIGINAL_KEY] == "qwen2"


def test_unpack_gives_the_models_own_config(packed, tiny_model_folder, tmp_path):
    unpack_folder(packed, tmp_path / "plain", progress=False)
    cfg = _config(tmp_path / "plain")
    assert cfg["model_type"] == "qwen2" and "quantization_config" not in cfg
    assert cfg == plain_config(_config(packed))


def test_a_folder_of_the_earlier_convention_still_loads(packed, tmp_path, input_ids):
    # Written before: the model's own model_type at the top, none in quantization_config.
    old = tmp_path / "old"
    shutil.copytree(packed, old)
    cfg = _config(old)
    cfg["model_type"] = cfg["quantization_config"].pop(ORIGINAL_KEY)
    (old / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    m = json.loads((old / MANIFEST).read_text())
    m["files"]["config.json"] = hashlib.sha256((old / "config.json").read_bytes()).hexdigest()
    (old / MANIFEST).write_text(json.dumps(m))
    want = _bits(glyd.from_pretrained(packed, device="cpu", progress=False), input_ids)
    assert torch.equal(_bits(AutoModelForCausalLM.from_pretrained(old), input_ids), want)


@pytest.mark.parametrize("own", [None, "", "glyd", 7])
def test_glyd_type_without_the_models_own_is_refused(packed, tmp_path, own):
    bad = tmp_path / "bad"
    shutil.copytree(packed, bad)
    cfg = _config(bad)
    if own is None:
        del cfg["quantization_config"][ORIGINAL_KEY]
    else:
        cfg["quantization_config"][ORIGINAL_KEY] = own
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match=r"config\.json: model_type is 'glyd' but quantization_config\."
                                          r"original_model_type .* does not name the model's own type"):
        check_folder(bad, verify=False)
    with pytest.raises(FormatError, match="original_model_type"):
        AutoConfig.from_pretrained(bad)


def test_without_transformers_loading_a_folder_is_one_glyd_error(packed, monkeypatch):
    # Before, a plain ImportError: a library caller's except GlydError missed it.
    from glyd.errors import GlydError, MissingDependencyError
    from glyd.hf import loading

    monkeypatch.setattr(loading, "register", lambda: False)
    with pytest.raises(MissingDependencyError, match=r"glyd: loading a glyd folder needs transformers \(pip install "
                                                     r"'glyd-lossless\[models\]'\)") as got:
        glyd.from_pretrained(packed, device="cpu", progress=False)
    assert isinstance(got.value, GlydError) and isinstance(got.value, ImportError)
