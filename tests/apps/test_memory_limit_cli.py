"""``--memory-limit`` where a command loads a model (demo, eval, serve): parsed on the command line,
passed to ``glyd.from_pretrained`` (or the random model of ``eval --random``), the layout said."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch

import glyd
from glyd.apps.fit import run_fit
from glyd.cli import build_parser, main
from glyd.errors import GlydError

transformers = pytest.importorskip("transformers")

RANDOM_CFG = dict(model_type="qwen2", hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=128, tie_word_embeddings=False)


def _parse(*argv: str):
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("argv", [("demo",), ("eval", "m"), ("serve", "m")])
def test_commands_that_load_take_a_memory_limit(argv, capsys):
    assert _parse(*argv, "--memory-limit", "40GiB").memory_limit == 40 * 2**30
    assert _parse(*argv, "--memory-limit", "1.5 GB").memory_limit == 1_500_000_000
    assert _parse(*argv).memory_limit is None
    with pytest.raises(SystemExit):
        _parse(*argv, "--memory-limit", "40")  # no unit: GB or GiB is not guessed
    err = capsys.readouterr().err
    assert "--memory-limit 40: give a size with its unit" in err and "int of bytes" not in err


def test_the_help_says_what_the_limit_does(capsys):
    with pytest.raises(SystemExit):
        _parse("demo", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "--memory-limit SIZE" in text and "fastest layout that fits" in text


def test_serve_config_checks_the_limit_before_loading():
    from glyd.apps.serve import ServeConfig

    assert ServeConfig("m", memory_limit="2GiB").memory_limit == "2GiB"
    with pytest.raises(ValueError, match="memory_limit='lots'"):
        ServeConfig("m", memory_limit="lots")


@pytest.fixture
def random_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(RANDOM_CFG))
    return path


def _need(config, layout: str) -> int:
    return run_fit(str(config), "80GB", context=16, layout=layout)[0].weights_glyd  # glyd fit's weights


def test_eval_random_auto_takes_the_layout_that_fits(random_config, tmp_path, caplog):
    out = tmp_path / "report.json"
    limit = _need(random_config, "fixed12") - 1
    argv = ["eval", str(random_config), "--random", "--modes", "auto", "--device", "cpu", "--no-decode",
            "--memory-limit", f"{limit / 1000:.3f}KB", "--json-out", str(out)]
    with caplog.at_level(logging.INFO, logger="glyd.hf.memory"):
        assert main(argv) == 0
    assert "layout auto: dense11 (fixed12 needs" in caplog.text
    rep = json.loads(out.read_text())
    assert [r["mode"] for r in rep["results"]] == ["bf16", "auto"]


def test_eval_refuses_a_layout_mode_over_the_limit(random_config, capsys):
    limit = _need(random_config, "fixed12") - 1
    argv = ["eval", str(random_config), "--random", "--modes", "fixed12", "--device", "cpu", "--no-decode",
            "--memory-limit", f"{limit / 1000:.3f}KB"]
    assert main(argv) == 1
    assert "layout fixed12: its weights need" in capsys.readouterr().err


def test_eval_refuses_a_mode_over_the_limit_before_measuring_bf16(random_config, capsys, monkeypatch):
    # the refusal came when the mode's turn came, after bf16's whole run (hours for MMLU on a 7B)
    from glyd.apps import evaluate

    ran = []
    monkeypatch.setattr(evaluate, "_run_mode", lambda cfg, mode, *a: ran.append(mode))
    limit = _need(random_config, "fixed12") - 1
    argv = ["eval", str(random_config), "--random", "--modes", "auto,fixed12", "--device", "cpu", "--no-decode",
            "--memory-limit", f"{limit / 1000:.3f}KB"]
    assert main(argv) == 1
    assert "layout fixed12: its weights need" in capsys.readouterr().err and ran == []


def test_eval_runs_when_its_config_cannot_be_counted_before(random_config, monkeypatch):
    # a config glyd fit cannot build (custom code): the modes are checked as they load, as before
    from glyd.apps import fit_meta
    from glyd.errors import FormatError

    def refuse(cfg):
        raise FormatError("config: cannot be built on the meta device")

    monkeypatch.setattr(fit_meta, "model_shape", refuse)
    argv = ["eval", str(random_config), "--random", "--modes", "auto", "--device", "cpu", "--no-decode",
            "--memory-limit", "1GiB"]
    assert main(argv) == 0


def test_demo_says_the_layout_auto_chose(tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path / "model"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["the sea is wide and deep"] * 4, trainers.BpeTrainer(
        vocab_size=270, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<s>", "</s>"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=len(tok), tie_word_embeddings=False,
                                   bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                   pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(folder)
    tok.save_pretrained(folder)
    limit = _need(folder, "fixed12") - 1  # dense11 fits: packed, saved, reloaded, checked, generating
    assert main(["demo", "--model", str(folder), "--max-new-tokens", "2", "--device", "cpu",
                 "--memory-limit", f"{limit / 1000:.3f}KB"]) == 0
    out = capsys.readouterr().out
    assert "packed (auto: dense11) on cpu" in out and "bit-exact: all" in out


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from serve_model import build_chat_model

    return build_chat_model(tmp_path_factory.mktemp("pack-limit") / "bf16")


def _folder_need(folder, layout: str) -> int:
    """The source's weights at ``layout``'s planning bits, counted here from the tensors themselves."""
    from safetensors import safe_open

    from glyd.hf.memory import weights_bytes

    packable = other = 0
    rows: dict[int, int] = {}
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            for name in h.keys():
                t = h.get_tensor(name)
                if t.dtype == torch.bfloat16 and t.dim() == 2:
                    packable += t.numel()
                    rows[t.shape[1]] = rows.get(t.shape[1], 0) + t.shape[0]
                else:
                    other += t.numel() * t.element_size()
    return weights_bytes(packable, other, layout, tuple(sorted(rows.items())))


def _packed_layouts(dst) -> set[str]:
    from glyd.store.checkpoint import CheckpointReader

    r = CheckpointReader(dst)
    return {r.entry(n).get("layout") for n in r.names() if r.entry(n).get("layout")}


def test_pack_takes_a_memory_limit(capsys):
    assert _parse("pack", "s", "d", "--memory-limit", "12GiB").memory_limit == 12 * 2**30
    assert _parse("pack", "s", "d").memory_limit is None
    with pytest.raises(SystemExit):
        _parse("pack", "s", "d", "--memory-limit", "12")
    assert "--memory-limit 12: give a size with its unit" in capsys.readouterr().err


@pytest.mark.parametrize("below, chosen", [("fixed12", "dense11"), ("dense11", "tiered")])
def test_pack_auto_takes_the_fastest_layout_that_fits(chat_folder, tmp_path, caplog, below, chosen):
    limit = _folder_need(chat_folder, below) - 1
    dst = tmp_path / "packed"
    with caplog.at_level(logging.INFO):
        assert main(["-q", "pack", str(chat_folder), str(dst), "--layout", "auto",
                     "--memory-limit", f"{limit}B"]) == 0
    said = next(line for line in caplog.text.splitlines() if "layout auto:" in line)
    assert f"layout auto: {chosen} (fixed12 needs" in said and f"{below} needs" in said
    assert _packed_layouts(dst) == {chosen}
    assert json.loads((dst / "config.json").read_text())["quantization_config"]["layout"] == chosen


def test_pack_auto_with_room_for_fixed12_packs_fixed12(chat_folder, tmp_path):
    dst = tmp_path / "packed"
    assert main(["-q", "pack", str(chat_folder), str(dst), "--layout", "auto", "--memory-limit", "1GB"]) == 0
    assert _packed_layouts(dst) == {"fixed12"}


@pytest.mark.parametrize("layout, limit_of, says", [
    ("fixed12", "fixed12", "layout fixed12: its weights need"),
    ("auto", "tiered", "no layout fits the weights; the smallest, tiered, needs"),
])
def test_pack_over_the_limit_is_refused_before_writing(chat_folder, tmp_path, capsys, layout, limit_of, says):
    limit = _folder_need(chat_folder, limit_of) - 1000
    dst = tmp_path / "packed"
    assert main(["pack", str(chat_folder), str(dst), "--layout", layout,
                 "--memory-limit", f"{limit}B"]) == 1
    err = capsys.readouterr().err.strip()
    assert says in err and "(nothing was packed)" in err and "\n" not in err
    assert not dst.exists() and list(tmp_path.iterdir()) == []


def test_pack_warns_when_the_stored_weights_pass_the_limit(chat_folder, tmp_path, caplog, monkeypatch):
    # a plan under what is stored (dense11 planned without its per-row tables, as before
    # Layout.row_bytes: its escape offsets on 64-column rows weigh more than the planning bits): said, not hidden
    dst = tmp_path / "packed"
    planned = _folder_need(chat_folder, "dense11")
    monkeypatch.setitem(glyd.LAYOUTS, "dense11", dataclasses.replace(glyd.LAYOUTS["dense11"], row_bytes=None))
    limit = _folder_need(chat_folder, "dense11")
    assert limit < planned
    with caplog.at_level(logging.WARNING):
        assert main(["-q", "pack", str(chat_folder), str(dst), "--layout", "dense11", "--memory-limit",
                     f"{limit}B"]) == 0
    from safetensors import safe_open

    stored = 0
    for f in dst.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            stored += sum(h.get_tensor(n).numel() * h.get_tensor(n).element_size() for n in h.keys())
    assert stored > limit and "more than the" in caplog.text and "--memory-limit allows" in caplog.text
    assert stored <= planned  # the plan with the tables holds it


def test_the_commands_messages_name_the_option_not_the_python_argument(chat_folder, random_config, tmp_path, capsys):
    # said "memory_limit allows" (from_pretrained's argument) to a user who typed --memory-limit
    limit = _folder_need(chat_folder, "fixed12") - 1000
    assert main(["pack", str(chat_folder), str(tmp_path / "packed"), "--layout", "fixed12",
                 "--memory-limit", f"{limit}B"]) == 1
    err = capsys.readouterr().err
    assert "its weights need" in err and "--memory-limit allows" in err and "memory_limit" not in err, err
    assert main(["pack", str(chat_folder), str(tmp_path / "packed"), "--layout", "auto", "--memory-limit", "1KiB"]) == 1
    err = capsys.readouterr().err
    assert "--memory-limit 1.00 KiB: no layout fits" in err and "memory_limit" not in err, err
    limit = _need(random_config, "fixed12") - 1
    assert main(["eval", str(random_config), "--random", "--modes", "fixed12", "--device", "cpu", "--no-decode",
                 "--memory-limit", f"{limit / 1000:.3f}KB"]) == 1
    err = capsys.readouterr().err
    assert "--memory-limit allows" in err and "memory_limit" not in err, err
    # the Python API keeps naming its argument, after a command ran in the same process
    from glyd.hf.memory import WeightsCount, fit_layout

    with pytest.raises(GlydError, match="its weights need .*, memory_limit allows"):
        fit_layout(WeightsCount(packable=2**20, other_bytes=0), "fixed12", 2**10)



def test_pack_and_the_loader_count_a_stored_tied_head_alike(tmp_path, monkeypatch):
    # config.json ties lm_head to the embedding and the folder stores lm_head.weight too (equal): glyd pack
    # stores and counts it packed; the loader shares it when equal but counts it packed as well (an upper
    # bound: it packs it apart when the values differ), so both apply the same limit to this folder
    from safetensors.torch import load_file, save_file

    import glyd
    from glyd.hf import bf16, memory

    src = tmp_path / "llama"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, tie_word_embeddings=True)).to(torch.bfloat16).save_pretrained(src)
    state = load_file(str(src / "model.safetensors"))
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(src / "model.safetensors"), metadata={"format": "pt"})
    needs = []
    real = memory.fit_layout

    def spy(count, layout, limit):
        needs.append({name: count.need(name) for name in memory.SPEED_ORDER})
        return real(count, layout, limit)

    monkeypatch.setattr(memory, "fit_layout", spy)  # glyd pack imports it from there when it runs
    monkeypatch.setattr(bf16, "fit_layout", spy)
    assert main(["-q", "pack", str(src), str(tmp_path / "packed"), "--memory-limit", "1GB"]) == 0
    glyd.from_pretrained(src, device="cpu", memory_limit="1GB", progress=False)
    assert len(needs) == 2 and needs[0] == needs[1], needs
    # every stored tensor counted, the copy too
    assert needs[0] == {name: _folder_need(src, name) for name in memory.SPEED_ORDER}
