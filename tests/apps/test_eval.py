"""The end-to-end harness (``glyd eval``, benchmarks/e2e.py) on a tiny random model, on the CPU."""

from __future__ import annotations

import io
import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glyd.cli import main
from glyd.errors import FormatError, GlydError
from glyd.apps import evaluate as ev

TEXT = (
    "First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. "
    "First Citizen: You are all resolved rather to die than to famish? All: Resolved. resolved. "
) * 8
REPO = Path(__file__).resolve().parents[2]


def _tokenizer(vocab: int = 300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<s>", "</s>"]
    )
    tok.train_from_iterator([TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A tiny bf16 Llama with random weights and a small BPE tokenizer, saved as a folder."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    folder = tmp_path_factory.mktemp("tiny") / "model"
    tok = _tokenizer()
    cfg = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=len(tok), tie_word_embeddings=True, max_position_embeddings=256,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    (root / "text").mkdir()
    (root / "text" / "small.txt").write_text(TEXT)
    test = root / "mmlu" / "test"
    test.mkdir(parents=True)
    (test / "astronomy_test.csv").write_text(
        "question,choice0,choice1,choice2,choice3,answer\n"
        '"What is the Sun?",A star,A planet,A moon,A comet,0\n'
        '"How many moons has Mars?",0,1,2,3,2\n'
        '"Which planet is largest?",Mars,Venus,Jupiter,Earth,2\n'
    )
    (test / "virology_test.csv").write_text(
        "question,choice0,choice1,choice2,choice3,answer\n"
        '"A virus is made of?","protein, nucleic acid",fat only,sugar,salt,0\n'
    )
    return root


def _cfg(folder, data_dir, **kw):
    base = dict(
        model=str(folder), modes=("fixed12", "exact"), device="cpu", text=str(data_dir / "text" / "small.txt"),
        ppl_tokens=200, window=64, stride=32, mmlu_dir=str(data_dir / "mmlu"), mmlu_per_subject=2, mmlu_batch=2,
        decode_batches=(1, 2), decode_context=16, decode_replays=3,
    )
    base.update(kw)
    return ev.EvalConfig(**base)


def test_evaluate_tiny_model(tiny_folder, data_dir):
    report = ev.evaluate(_cfg(tiny_folder, data_dir))
    assert [r.mode for r in report.results] == ["bf16", "fixed12", "exact"]
    ref, fixed, exact = report.results
    # every scored token counted once: windows of 64 with stride 32 over 200 tokens score 199
    assert ref.ppl_tokens == 199 and ref.ppl > 1 and math.isfinite(ref.ppl)
    assert ref.mmlu_questions == 3  # 2 astronomy (per-subject limit) + 1 virology
    # exact mode: bf16's own products, so everything equals bf16 bit for bit
    assert exact.ppl == ref.ppl
    assert exact.next_token_agree == 1.0 and exact.mmlu_agree == 1.0 and exact.mmlu_max_logit_diff == 0.0
    assert exact.mmlu_acc == ref.mmlu_acc
    assert ref.next_token_agree == 1.0 and ref.mmlu_agree == 1.0
    # the packed model holds fewer weight bytes than bf16
    assert 0 < fixed.weight_bytes < ref.weight_bytes
    assert set(ref.decode_ms) == {1, 2} and all(v > 0 for v in ref.decode_ms.values())
    assert set(fixed.decode_ms) == {1, 2}
    table = report.table()
    assert "| exact |" in table and "MMLU: 3 questions" in table
    assert json.loads(report.to_json())["results"][0]["mode"] == "bf16"


def test_perplexity_matches_a_direct_computation(tiny_folder):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_folder, dtype=torch.bfloat16).eval()
    tokens = torch.randint(0, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(3))
    # one window covering everything: the mean NLL of tokens 1..39 given their prefixes
    ppl, n, preds = ev.perplexity(model, tokens, window=64, stride=64, device="cpu")
    with torch.no_grad():
        logits = model(tokens[None]).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, tokens[1:])
    assert n == 39 and ppl == pytest.approx(math.exp(float(nll)), rel=1e-5)
    assert torch.equal(preds[0], logits.argmax(-1))
    # strided windows score the same 39 tokens, each once
    _, n2, preds2 = ev.perplexity(model, tokens, window=16, stride=8, device="cpu")
    assert n2 == 39 and sum(p.numel() for p in preds2) == 39


def test_decode_like_scoring(tiny_folder, data_dir):
    """--score-chunk: perplexity a few tokens a forward against the KV cache, MMLU answers as a decode step."""
    report = ev.evaluate(_cfg(tiny_folder, data_dir, modes=("exact",), score_chunk=8, decode_batches=()))
    ref, exact = report.results
    whole = ev.evaluate(_cfg(tiny_folder, data_dir, modes=(), decode_batches=())).results[0]
    assert ref.ppl_tokens == whole.ppl_tokens == 199
    # the same model scored another way: equal up to bf16 rounding of different product shapes
    assert ref.ppl == pytest.approx(whole.ppl, rel=2e-2)
    assert exact.ppl == ref.ppl and exact.mmlu_max_logit_diff == 0.0 and exact.next_token_agree == 1.0
    assert "8 tokens a forward" in report.table() and "decode step of the batch" in report.table()


def test_mmlu_decode_step_matches_one_forward(tiny_folder):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32).eval()  # fp32: no rounding noise
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, 200, (n,), generator=gen).tolist() for n in (7, 12, 9)]
    letters = [10, 11, 12, 13]
    a = ev.mmlu_logits(model, prompts, letters, batch=3, device="cpu", pad_id=1)
    b = ev.mmlu_logits(model, prompts, letters, batch=3, device="cpu", pad_id=1, decode_step=True)
    assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()


def test_merged_bf16_is_bitwise_the_unmerged_model(tiny_folder):
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(tiny_folder, dtype=torch.bfloat16).eval()
    b = AutoModelForCausalLM.from_pretrained(tiny_folder, dtype=torch.bfloat16).eval()
    assert ev.merge_bf16(b) == 4  # q|k|v and gate|up in each of 2 layers
    assert type(b.model.layers[0].self_attn.k_proj).__name__ == "_Part"
    ids = torch.randint(0, a.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        la, lb = a(ids).logits, b(ids).logits
    # a merged product computes each output with the same dot products; CPU bf16 GEMM rounds alike
    assert torch.allclose(la.float(), lb.float(), atol=1e-2)
    assert ev.weight_bytes(a) == ev.weight_bytes(b)


def test_mmlu_reading_and_prompt(data_dir):
    qs = ev.read_mmlu(data_dir / "mmlu", ("virology",), 5)
    assert len(qs) == 1 and qs[0]["choices"][0] == "protein, nucleic acid" and qs[0]["answer"] == 0
    prompt = ev.mmlu_prompt(qs[0])
    assert prompt.startswith("The following is a multiple choice question about virology.")
    assert prompt.endswith("D. salt\nAnswer:")
    with pytest.raises(FormatError, match="anatomy"):
        ev.read_mmlu(data_dir / "mmlu", ("anatomy",), 5)
    with pytest.raises(FormatError, match="test/"):
        ev.read_mmlu(data_dir, None, 5)


def test_bad_mmlu_row(tmp_path):
    test = tmp_path / "test"
    test.mkdir()
    (test / "x_test.csv").write_text("question,choice0,choice1,choice2,choice3,answer\nq,a,b,c,d,7\n")
    with pytest.raises(FormatError, match="x_test.csv"):
        ev.read_mmlu(tmp_path, None, 5)


def test_config_validation(tmp_path):
    with pytest.raises(GlydError, match="unknown mode"):
        ev.EvalConfig(model="m", modes=("fixed13",), ppl=False, mmlu=False)
    with pytest.raises(GlydError, match="stride"):
        ev.EvalConfig(model="m", window=8, stride=16, ppl=False, mmlu=False)
    with pytest.raises(FormatError, match="not a model folder"):
        ev.evaluate(ev.EvalConfig(model=str(tmp_path), ppl=False, mmlu=False, modes=(), device="cpu"))


def test_a_mode_given_twice_is_refused():
    # --modes fixed12,fixed12 loaded, scored and printed fixed12 twice
    with pytest.raises(GlydError, match="mode fixed12 is given twice"):
        ev.EvalConfig(model="m", modes=("fixed12", "tiered", "fixed12"), ppl=False, mmlu=False)


def test_a_packed_folder_is_refused(tiny_folder, tmp_path, capsys):
    # a packed folder gives no bf16 to compare with: every row would be the same packed model
    packed = tmp_path / "packed"
    assert main(["pack", str(tiny_folder), str(packed), "--layout", "fixed12"]) == 0
    capsys.readouterr()
    argv = ["eval", str(packed), "--modes", "fixed12", "--device", "cpu", "--no-ppl", "--no-mmlu", "--no-decode"]
    assert main(argv) == 1
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and "packed Glyd folder" in lines[0] and "bf16 source" in lines[0], out.err
    # a config that says quant_method "glyd" is enough, with or without glyd.json
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    cfg = json.loads((tiny_folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "glyd", "layout": "fixed12"}
    (config_only / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match="packed Glyd folder"):
        ev.evaluate(ev.EvalConfig(model=str(config_only), ppl=False, mmlu=False, decode=False, modes=(), device="cpu"))


def test_random_model_from_config_cli(tmp_path, capsys):
    cfg = dict(model_type="qwen2", hidden_size=64, intermediate_size=96, num_hidden_layers=1,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=128, tie_word_embeddings=False)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "report.json"
    code = main(["eval", str(tmp_path / "config.json"), "--random", "--modes", "tiered", "--device", "cpu",
                 "--decode-batches", "1", "--decode-context", "8", "--decode-replays", "2", "--json-out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "(random weights)" in printed and "| tiered |" in printed
    rep = json.loads(out.read_text())
    assert [r["mode"] for r in rep["results"]] == ["bf16", "tiered"]
    assert rep["results"][1]["weight_bytes"] < rep["results"][0]["weight_bytes"]
    # never overwrites
    assert main(["eval", str(tmp_path / "config.json"), "--random", "--json-out", str(out)]) == 1


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _random_eval_argv(tmp_path) -> list[str]:
    cfg = dict(model_type="qwen2", hidden_size=64, intermediate_size=96, num_hidden_layers=1,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=128, tie_word_embeddings=False)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return ["eval", str(tmp_path / "config.json"), "--random", "--modes", "fixed12", "--device", "cpu",
            "--decode-batches", "1", "--decode-context", "8", "--decode-replays", "2"]


def test_eval_progress_and_log(tmp_path, monkeypatch, capsys, caplog):
    # a bar over the modes' steps on a terminal; one log line a mode, never a dataclass repr
    argv = _random_eval_argv(tmp_path)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with caplog.at_level(logging.INFO, logger="glyd"):
        assert main(argv) == 0
    bar = terminal.getvalue()
    assert "glyd eval" in bar and "4/4" in bar and "fixed12: decode step" in bar, bar
    logged = [r.getMessage() for r in caplog.records if r.name == "glyd.apps.evaluate"]
    assert [m.split(":")[0] for m in logged] == ["mode bf16", "mode fixed12"], logged
    assert not any("ModeResult(" in m for m in logged) and "step ms" in logged[1]
    assert capsys.readouterr().out.count("| mode |") == 1  # one table, at the end
    # -q, or a stderr that is not a terminal: no bar
    for quiet, stream in ((True, _Terminal()), (False, io.StringIO())):
        monkeypatch.setattr(sys, "stderr", stream)
        assert main((["-q"] if quiet else []) + argv) == 0
        assert "glyd eval" not in stream.getvalue(), stream.getvalue()


def test_benchmark_script_help():
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "e2e.py"), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--decode-batches" in r.stdout


@pytest.mark.gpu
@pytest.mark.slow  # 23 s on the H200: outside the one-call default GPU set
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_evaluate_on_the_gpu(tiny_folder, data_dir):
    report = ev.evaluate(_cfg(tiny_folder, data_dir, device="cuda", modes=("fixed12", "tiered", "exact"), score_chunk=8))
    ref, fixed, tiered, exact = report.results
    assert exact.ppl == ref.ppl and exact.mmlu_max_logit_diff == 0.0
    for r in (fixed, tiered):
        assert r.next_token_agree >= 0.9 and abs(r.ppl / ref.ppl - 1) < 0.01
        assert r.weight_bytes < ref.weight_bytes
    assert all("CUDA graph" in r.decode_method for r in report.results), [r.decode_method for r in report.results]


@pytest.mark.slow  # about a minute on two cores (inductor compiles the model twice); ran on the H200 2026-12-02
def test_decode_step_under_torch_compile(tiny_folder, data_dir, caplog):
    """--compile: the step is also timed as torch.compile(mode="reduce-overhead") compiles it."""
    torch._dynamo.reset()
    report = ev.evaluate(_cfg(tiny_folder, data_dir, modes=("fixed12",), ppl=False, mmlu=False,
                              decode_batches=(2,), decode_compile=True))
    ref, fixed = report.results
    for r in (ref, fixed):
        assert set(r.compiled_ms) == {2} and r.compiled_ms[2] > 0
        assert "reduce-overhead" in r.compiled_method
    assert "differs from an eager step" not in caplog.text
    assert "compiled ms @2" in report.table()


def test_decode_step_over_the_lossless_cache(tmp_path):
    """--decode-kv lossless: the timed step runs against GlydStaticCache; every replay writes the same
    slot, and the step computes what a bf16 StaticCache holding the same tokens gives (within rounding)."""
    from glyd.apps.eval_timing import _StepRunner
    from glyd.apps.eval_models import build_random

    cfg = dict(model_type="llama", hidden_size=128, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=256)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    report = ev.evaluate(ev.EvalConfig(model=str(tmp_path / "config.json"), random=True, modes=(), device="cpu",
                                       decode_batches=(2,), decode_context=80, decode_replays=2, decode_kv="lossless"))
    assert "GlydStaticCache" in report.results[0].decode_method and report.results[0].decode_ms[2] > 0
    with pytest.raises(GlydError, match="decode_kv"):
        ev.EvalConfig(model="m", random=True, decode_kv="fp8")
    model = build_random(str(tmp_path / "config.json"), "cpu", 0)
    runner = _StepRunner(model, 2, 80, "cpu", kv="lossless")
    runner.reset()
    runner.step()
    runner.fill_cache()
    runner.reset()
    with torch.no_grad():
        a = runner.step().float()
        runner.reset()
        b = runner.step().float()
    pool = runner.cache.pool
    assert torch.equal(a, b) and pool.lens.tolist() == [41, 41]
    ref = _StepRunner(model, 2, 80, "cpu")  # the same tokens in a bf16 StaticCache
    with torch.no_grad():
        ref.reset()
        ref.step()
        for i, layer in enumerate(ref.cache.layers):
            k, v = pool.to_bf16(i)
            layer.keys[:, :, :40], layer.values[:, :, :40] = k[:, :, :40], v[:, :, :40]
        ref.reset()
        want = ref.step().float()
    assert float((a - want).norm() / want.norm()) < 2e-2


def _no_shared_data(monkeypatch, tmp_path):
    """As on a pip install: no $GLYD_DATA and no shared/data beside the working folder or the package."""
    monkeypatch.delenv("GLYD_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ev, "__file__", str(tmp_path / "site-packages" / "glyd" / "apps" / "evaluate.py"))


def test_a_pip_install_scores_the_packaged_sample(monkeypatch, tmp_path):
    _no_shared_data(monkeypatch, tmp_path)
    assert ev.default_data_dir() == ev.PACKAGED_DATA
    cfg = ev.EvalConfig(model="m", modes=())
    assert Path(cfg.text) == ev.PACKAGED_DATA / "text" / "tinyshakespeare-128k.txt" and Path(cfg.text).is_file()
    questions = ev.read_mmlu(Path(cfg.mmlu_dir), None, 20)
    assert len(questions) == 285 and len({q["subject"] for q in questions}) == 57
    assert len(Path(cfg.text).read_text(encoding="utf-8")) > 100_000


def test_the_sample_is_package_data():
    # every file under eval_data matches a package-data glob, so a wheel carries it
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["glyd"]
    pkg = root / "src" / "glyd"
    files = [p.relative_to(pkg).as_posix() for p in (pkg / "apps" / "eval_data").rglob("*") if p.is_file()]
    assert len(files) == 59 and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files)


def test_eval_from_a_pip_install_runs_and_says_its_data(tiny_folder, monkeypatch, tmp_path, capsys):
    _no_shared_data(monkeypatch, tmp_path)
    assert main(["eval", str(tiny_folder), "--modes", "fixed12", "--device", "cpu", "--no-decode",
                 "--ppl-tokens", "512", "--window", "128", "--stride", "64", "--mmlu-per-subject", "1"]) == 0
    out = capsys.readouterr().out
    assert "| fixed12 |" in out and "tinyshakespeare-128k.txt" in out and "57 questions of" in out


def test_a_missing_model_is_named_first(monkeypatch, tmp_path, capsys):
    _no_shared_data(monkeypatch, tmp_path)
    assert main(["eval", "no-such-model", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "model no-such-model: no such folder" in err and "text" not in err.split("no such folder")[0]


@pytest.mark.parametrize("kind, what", [("fifo", "a FIFO (named pipe)"), ("folder", "a folder"), ("broken", "a broken symbolic link")])
def test_an_mmlu_csv_that_is_not_a_file_is_named(tmp_path, kind, what):
    # A FIFO named x_test.csv blocked glyd eval for ever; a folder or a broken link escaped as OSError.
    import os
    import threading

    test = tmp_path / "test"
    test.mkdir()
    path = test / "x_test.csv"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "absent.csv")
    got: list[BaseException] = []
    reader = threading.Thread(target=lambda: got.append(pytest.raises(FormatError, ev.read_mmlu, tmp_path, None, 5).value),
                              daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # blocked in open(): a writer lets it go on, then the test fails
        with open(path, "w"):
            pass
        reader.join(10)
        pytest.fail("read_mmlu blocked on a FIFO")
    assert len(got) == 1 and str(got[0]) == f"{path}: {what}, not an MMLU csv file"


HEAD = "question,choice0,choice1,choice2,choice3,answer\n"


@pytest.mark.parametrize("content, match", [
    ((HEAD + "Q\xff,a,b,c,d,0\n").encode("latin-1"), r"not an MMLU csv file \('utf-8' codec can't decode byte 0xff"),
    ((HEAD + '"' + "x" * 200_000 + '",a,b,c,d,0\n').encode(), r"not an MMLU csv file \(field larger than field limit"),
    (b"answer,question,choice0,choice1,choice2,choice3\n1\n", r"row 1 lacks question, choice0\.\.3 or an integer answer"),
])
def test_a_bad_mmlu_csv_is_one_line(tmp_path, content, match):
    # A csv that is not UTF-8 escaped as UnicodeDecodeError, a field over csv's limit as _csv.Error; a
    # row short of cells gave question None, which mmlu_prompt's .strip() met as an AttributeError.
    test = tmp_path / "test"
    test.mkdir()
    (test / "x_test.csv").write_bytes(content)
    with pytest.raises(FormatError, match=r"x_test\.csv: " + match):
        ev.read_mmlu(tmp_path, None, 5)


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_text_path_that_is_not_a_file_says_what_it_is(tmp_path, monkeypatch, kind):
    # a folder or a FIFO given as --text was "text file for perplexity not found"
    import os

    text = tmp_path / "text"
    text.mkdir() if kind == "folder" else os.mkfifo(text)
    import re

    monkeypatch.setattr(ev, "load_tokenizer", lambda cfg: None)  # the path is checked before any reading
    cfg = ev.EvalConfig(model="m", text=str(text), mmlu=False, device="cpu")
    what = "a folder" if kind == "folder" else "a FIFO (named pipe)"
    with pytest.raises(FormatError, match=re.escape(f"{text}: {what}, not a text file for perplexity") + "$"):
        ev._inputs(cfg)


def test_only_a_prefix_of_a_large_text_is_read(tmp_path, monkeypatch):
    # the whole --text file was read into memory (a corpus of gigabytes: all of it) to tokenize a prefix
    import tracemalloc

    big = tmp_path / "big.txt"
    big.write_text("hello world " * 1_000_000)  # 12 MB

    class Words:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": list(range(len(text.split())))}

    monkeypatch.setattr(ev, "load_tokenizer", lambda cfg: Words())
    cfg = ev.EvalConfig(model="m", text=str(big), mmlu=False, device="cpu", ppl_tokens=100)
    tracemalloc.start()
    try:
        inp = ev._inputs(cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert inp.tokens.tolist() == list(range(100))
    assert peak < 1 << 20, peak


def test_an_mmlu_subject_given_twice_is_refused(tiny_folder, data_dir):
    # --subjects astronomy,astronomy read, scored and counted astronomy's questions twice
    with pytest.raises(GlydError, match="^MMLU subject astronomy is given twice$"):
        _cfg(tiny_folder, data_dir, subjects=("astronomy", "virology", "astronomy"))


@pytest.mark.parametrize("config", ['{}', '{"model_type": "nosuch"}'])
@pytest.mark.parametrize("what, flags", [("tokenizer", []), ("model", ["--no-ppl", "--no-mmlu"])])
def test_a_folder_transformers_refuses_is_one_line(tmp_path, capsys, config, what, flags):
    # transformers' ValueError (no model_type, an unknown one) escaped glyd eval as a traceback
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(config)
    assert main(["eval", str(folder), "--device", "cpu", "--modes", "exact", "--no-decode", *flags]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (transformers logs a warning before it refuses)
    assert err.startswith(f"glyd eval: error: {folder}: transformers cannot load its {what} (ValueError: "), err


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    """A tiny bf16 GPT-2: a learned position table of 32 rows (``transformer.wpe``)."""
    from transformers import AutoModelForCausalLM, GPT2Config

    folder = tmp_path_factory.mktemp("gpt2") / "model"
    tok = _tokenizer()
    cfg = GPT2Config(n_embd=64, n_layer=1, n_head=2, n_positions=32, vocab_size=len(tok),
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kw,what", [
    ({"window": 64, "stride": 32}, "--window 64 needs 64 positions"),
    ({"window": 32, "stride": 16, "decode_context": 128}, "--decode-context 128 needs 65 positions"),
])
def test_positions_past_a_learned_position_table_are_refused_by_name(gpt2_folder, data_dir, kw, what):
    # GPT-2 at positions past its 32-row wpe: an IndexError on the CPU, a device-side assert on a GPU; now refused
    cfg = _cfg(gpt2_folder, data_dir, modes=("fixed12",), mmlu=False, **kw)
    with pytest.raises(FormatError, match=rf"^{what}, but the model's learned position table transformer.wpe holds 32"):
        ev.evaluate(cfg)


def test_a_learned_position_table_within_reach_runs(gpt2_folder, data_dir):
    cfg = _cfg(gpt2_folder, data_dir, modes=("fixed12",), mmlu=False, window=32, stride=16, decode_context=62)
    ref, fixed = ev.evaluate(cfg).results
    assert ref.ppl_tokens == 199 and math.isfinite(fixed.ppl)


def test_a_text_or_mmlu_file_that_cannot_be_read_is_one_line(tmp_path, monkeypatch):
    # no permission to read --text or an MMLU csv (as any user but root) was a PermissionError traceback
    import builtins

    import glyd.apps.eval_mmlu as mm

    text = tmp_path / "text.txt"
    text.write_text("some words " * 20)
    test = tmp_path / "mmlu" / "test"
    test.mkdir(parents=True)
    (test / "astronomy_test.csv").write_text("question,choice0,choice1,choice2,choice3,answer\nq,a,b,c,d,0\n")

    def refuse(path, *a, **k):
        if str(path).endswith((".txt", ".csv")):
            raise PermissionError(13, "Permission denied", str(path))
        return builtins.open(path, *a, **k)

    monkeypatch.setattr(ev, "open", refuse, raising=False)
    monkeypatch.setattr(mm, "open", refuse, raising=False)
    monkeypatch.setattr(ev, "load_tokenizer", lambda cfg: None)
    with pytest.raises(FormatError, match=r"text.txt: cannot read this text file \(Permission denied\)$"):
        ev._inputs(ev.EvalConfig(model="m", text=str(text), mmlu=False, device="cpu"))
    with pytest.raises(FormatError, match=r"astronomy_test.csv: cannot read this MMLU csv file \(Permission denied\)$"):
        mm.read_mmlu(tmp_path / "mmlu", None, 2)
