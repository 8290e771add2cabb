"""End-to-end comparison of a model in bf16 and with Glyd, in one run (``glyd eval``, ``benchmarks/e2e.py``).

For every mode (``bf16`` first, then Glyd layouts such as ``fixed12``, ``tiered``, ``exact``):

* **weight memory**: bytes of the model's parameters and persistent buffers (shared ones once);
* **perplexity** on a text file, over strided windows (``window`` tokens, a new window every
  ``stride`` tokens; each token is scored once, with at least ``window - stride`` tokens of context),
  and **next-token agreement**: the share of those positions where the mode's argmax equals bf16's;
* **MMLU**, 0-shot: the answer is the letter among `` A``/`` B``/`` C``/`` D`` with the largest
  logit after ``Answer:``; reported as accuracy and as agreement with bf16's answer;
* **decode step time** at several batch sizes: one decode step of the whole model (static KV cache of
  ``decode_context`` positions, 4-D attention mask, position ids fixed) captured in a CUDA graph and
  replayed; the median of the replays' GPU time (CUDA events). Where capture fails the step runs
  eagerly and the method column says so; on the CPU it is wall time of eager steps.

The model is a bf16 transformers folder (``smollm2``: the embedded SmolLM2-135M, see
``glyd.apps.smollm2``), or, with ``random=True``, a model with random weights
(normal, std = the config's initializer_range) built from a config: a known name (``glyd fit``'s
table, for example ``qwen2.5-7b``) or a config.json. Random models have no tokenizer: only
weight memory and decode time are measured for them.

Perplexity and MMLU compare with bf16 as transformers runs it (separate q, k, v, gate and up
products: ``exact`` mode reproduces those bit for bit). For decode timing, bf16 runs with q|k|v and
gate|up merged into one product each when ``merge`` is on, as Glyd does, so the products match.

>>> from glyd.apps.evaluate import EvalConfig, evaluate      # doctest: +SKIP
>>> report = evaluate(EvalConfig(model="qwen2.5-7b", random=True, modes=("fixed12",)))  # doctest: +SKIP
>>> print(report.table())                                  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from glyd import _env
from glyd.apps.eval_mmlu import letter_ids, mmlu_logits, mmlu_prompt, read_mmlu
from glyd.apps.eval_models import (build_random, check_model_folder, check_modes_fit, check_positions, merge_bf16,
                                   weight_bytes)
from glyd.apps.eval_timing import time_decode, time_decode_compiled
from glyd.apps.layouts import eval_modes
from glyd.errors import FormatError, GlydError, cause, not_a_file, show_path
from glyd.hf.memory import parse_memory

log = logging.getLogger(__name__)

#: The small text and MMLU sample shipped in the package (``eval_data/README.md`` says what they are).
PACKAGED_DATA = Path(__file__).resolve().parent / "eval_data"
PACKAGED_TEXT = "tinyshakespeare-128k.txt"


def default_data_dir() -> Path:
    """``$GLYD_DATA``, else the first ``shared/data`` found beside the working folder or the source
    tree, else the package's own small sample (what a pip install has)."""
    env = _env.settings().data
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for base in (Path.cwd(), Path.cwd().parent, *here.parents):
        cand = base / "shared" / "data"
        if (cand / "mmlu").is_dir() or (cand / "text").is_dir():
            return cand
    return PACKAGED_DATA


def _default_text(data: Path) -> Path:
    return data / "text" / (PACKAGED_TEXT if data == PACKAGED_DATA else "tinyshakespeare.txt")


@dataclass
class EvalConfig:
    """What ``evaluate`` measures; every field has a CLI option of the same name."""

    model: str
    random: bool = False
    modes: tuple[str, ...] = ("fixed12", "tiered", "exact")
    device: str | None = None
    seed: int = 0
    merge: bool = True
    # perplexity
    ppl: bool = True
    text: str | None = None
    ppl_tokens: int = 32768
    window: int = 1024
    stride: int = 512
    #: >0: score like decoding (perplexity: this many tokens a forward after a prefill; MMLU: the
    #: answer position as one decode step of the batch), so the fused decode kernels do the products.
    score_chunk: int = 0
    # MMLU
    mmlu: bool = True
    mmlu_dir: str | None = None
    subjects: tuple[str, ...] | None = None
    mmlu_per_subject: int = 20
    mmlu_batch: int = 16
    # decode timing
    decode: bool = True
    decode_batches: tuple[int, ...] = (1, 8, 32, 64)
    decode_context: int = 512
    decode_replays: int = 30
    cuda_graphs: bool = True
    #: the static cache of the decode step: ``bf16`` (transformers' StaticCache) or ``lossless``
    #: (``glyd.kv.GlydStaticCache``: a static pool of kvf12 pages, the fused attention)
    decode_kv: str = "bf16"
    #: also time the step under ``torch.compile(mode="reduce-overhead")`` (compiles the model: slow)
    decode_compile: bool = False
    #: the most each Glyd mode's packed weights may take (``glyd.from_pretrained``'s ``memory_limit``):
    #: ``auto`` takes the fastest layout that fits; a layout mode that does not fit stops before packing
    memory_limit: int | str | None = None

    def __post_init__(self) -> None:
        self.modes = tuple(m for m in self.modes if m != "bf16")
        modes = eval_modes()
        bad = [m for m in self.modes if m not in modes]
        if bad:
            raise GlydError(f"unknown mode(s) {', '.join(bad)}; choose from {', '.join(modes)}")
        twice = [m for i, m in enumerate(self.modes) if m in self.modes[:i]]
        if twice:
            raise GlydError(f"mode {twice[0]} is given twice")
        twice = [s for i, s in enumerate(self.subjects or ()) if s in self.subjects[:i]]
        if twice:  # its questions were read, scored and counted twice
            raise GlydError(f"MMLU subject {twice[0]} is given twice")
        for name in ("ppl_tokens", "window", "stride", "mmlu_per_subject", "mmlu_batch", "decode_context", "decode_replays"):
            if int(getattr(self, name)) <= 0:
                raise GlydError(f"{name} must be positive, got {getattr(self, name)}")
        if self.score_chunk < 0:
            raise GlydError(f"score_chunk must be 0 or positive, got {self.score_chunk}")
        if self.stride > self.window:
            raise GlydError(f"stride ({self.stride}) must not exceed window ({self.window})")
        if any(int(b) <= 0 for b in self.decode_batches):
            raise GlydError(f"decode batch sizes must be positive, got {self.decode_batches}")
        if self.decode_context < 2:
            raise GlydError("decode_context must be at least 2")
        if self.decode_kv not in ("bf16", "lossless"):
            raise GlydError(f"decode_kv must be bf16 or lossless, got {self.decode_kv!r}")
        if self.memory_limit is not None:
            self.memory_limit = parse_memory(self.memory_limit)
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.random:  # no tokenizer: nothing to read or answer
            self.ppl = self.mmlu = False
        data = default_data_dir()
        if self.ppl and self.text is None:
            self.text = str(_default_text(data))
        if self.mmlu and self.mmlu_dir is None:
            self.mmlu_dir = str(data / "mmlu")


@dataclass
class ModeResult:
    mode: str
    weight_bytes: int = 0
    load_s: float = 0.0
    ppl: float | None = None
    ppl_tokens: int = 0
    next_token_agree: float | None = None
    mmlu_acc: float | None = None
    mmlu_agree: float | None = None
    mmlu_questions: int = 0
    mmlu_max_logit_diff: float | None = None
    decode_ms: dict[int, float] = field(default_factory=dict)
    decode_method: str = ""
    compiled_ms: dict[int, float] = field(default_factory=dict)
    compiled_method: str = ""

    def summary(self) -> str:
        """One line of what was measured (for the log; the table has everything)."""
        parts = [f"weights {self.weight_bytes / 1e6:.1f} MB", f"loaded in {self.load_s:.1f} s"]
        if self.ppl is not None:
            parts.append(f"perplexity {self.ppl:.4f}, next-token agreement {_pct(self.next_token_agree)}")
        if self.mmlu_acc is not None:
            parts.append(f"MMLU {_pct(self.mmlu_acc)}, agreement {_pct(self.mmlu_agree)}")
        for what, ms in (("step", self.decode_ms), ("compiled step", self.compiled_ms)):
            if ms:
                parts.append(f"{what} ms " + ", ".join(f"{t:.3f} @{b}" for b, t in sorted(ms.items())))
        return f"mode {self.mode}: " + "; ".join(parts)


@dataclass
class Report:
    config: dict[str, Any]
    environment: dict[str, Any]
    results: list[ModeResult]

    def by_mode(self, mode: str) -> ModeResult:
        for r in self.results:
            if r.mode == mode:
                return r
        raise KeyError(mode)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)

    def table(self) -> str:
        """A markdown table: one row a mode, ratios against bf16."""
        ref = self.results[0]
        batches = sorted({b for r in self.results for b in r.decode_ms})
        head = ["mode", "weights MB", "x bf16"]
        if ref.ppl is not None:
            head += ["ppl", "ppl diff", "next-token agree"]
        if ref.mmlu_acc is not None:
            head += ["MMLU acc", "MMLU agree"]
        head += [f"step ms @{b}" for b in batches]
        compiled = sorted({b for r in self.results for b in r.compiled_ms})
        head += [f"compiled ms @{b}" for b in compiled]
        rows = []
        for r in self.results:
            row = [r.mode, f"{r.weight_bytes / 1e6:.1f}", f"{r.weight_bytes / ref.weight_bytes:.3f}"]
            if ref.ppl is not None:
                diff = "" if r is ref or r.ppl is None else f"{100 * (r.ppl / ref.ppl - 1):+.4f}%"
                row += [f"{r.ppl:.4f}" if r.ppl is not None else "-", diff or "-", _pct(r.next_token_agree)]
            if ref.mmlu_acc is not None:
                row += [_pct(r.mmlu_acc), _pct(r.mmlu_agree)]
            row += _times(r.decode_ms, ref.decode_ms if r is not ref else {}, batches)
            row += _times(r.compiled_ms, ref.compiled_ms if r is not ref else {}, compiled)
            rows.append(row)
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        notes = []
        chunk = int(self.config.get("score_chunk") or 0)
        if ref.ppl is not None:
            how = f"{chunk} tokens a forward after a prefill" if chunk else "one forward a window"
            notes.append(f"perplexity over {ref.ppl_tokens} scored tokens of {self.config.get('text')} ({how}); "
                         "next-token agreement with bf16's argmax")
        if ref.mmlu_acc is not None:
            how = "answer position as a decode step of the batch" if chunk else "prompts in one forward"
            notes.append(f"MMLU: {ref.mmlu_questions} questions of {self.config.get('mmlu_dir')}, 0-shot, answer-letter "
                         f"logits ({how}); agreement with bf16's answer")
        methods = sorted({m for r in self.results for m in (r.decode_method, r.compiled_method) if m})
        if methods:
            notes.append("decode step: " + "; ".join(methods))
        return "\n".join(lines + [""] + notes)


def _times(ms: dict[int, float], ref: dict[int, float], batches: list[int]) -> list[str]:
    """Table cells: each batch size's time, with its ratio to bf16's where there is one."""
    cells = []
    for b in batches:
        t = ms.get(b)
        if t is None:
            cells.append("-")
        else:
            cells.append(f"{t:.3f} ({t / ref[b]:.2f}x)" if b in ref else f"{t:.3f}")
    return cells


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


# --------------------------------------------------------------------------- models


def load_bf16(cfg: EvalConfig) -> nn.Module:
    if cfg.random:
        return build_random(cfg.model, cfg.device, cfg.seed)
    from transformers import AutoModelForCausalLM

    folder = Path(cfg.model)  # checked by evaluate(): a bf16 model folder
    with _transformers_errors(folder, "model"):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, device_map=cfg.device)
    return model.eval()


def load_glyd(cfg: EvalConfig, mode: str) -> nn.Module:
    import glyd

    layout, exact = eval_modes()[mode]
    if cfg.random:  # packed as each random weight is made: the bf16 model is never held whole
        return build_random(cfg.model, cfg.device, cfg.seed, layout=layout, exact=exact, merge=cfg.merge,
                            memory_limit=cfg.memory_limit)
    model = glyd.from_pretrained(cfg.model, layout=layout, exact=exact, device=cfg.device, merge=cfg.merge, progress=False,
                                 memory_limit=cfg.memory_limit)
    return model.eval()


def load_tokenizer(cfg: EvalConfig):
    from transformers import AutoTokenizer

    with _transformers_errors(Path(cfg.model), "tokenizer"):
        return AutoTokenizer.from_pretrained(cfg.model)


@contextlib.contextmanager
def _transformers_errors(folder: Path, what: str):
    """transformers' refusals of a folder (no or an unknown model_type, a missing file: a ValueError
    or OSError of several lines) as one FormatError line naming the folder."""
    try:
        yield
    except (OSError, ValueError, KeyError) as exc:
        raise FormatError(f"{show_path(folder)}: transformers cannot load its {what} ({cause(exc)})") from exc


# --------------------------------------------------------------------------- measurements


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _forward_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, use_cache=False).logits


def _chunked_logits(model: nn.Module, ids: torch.Tensor, first: int, chunk: int) -> torch.Tensor:
    """Logits at positions ``first .. L-2`` of ``ids`` [1, L]: positions before ``first`` go in as one
    prefill, the rest ``chunk`` tokens a forward against the KV cache (as decoding runs them)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    if first > 0:
        model(input_ids=ids[:, :first], past_key_values=cache, use_cache=True, logits_to_keep=1)
    out = []
    last = ids.shape[1] - 1  # the last token is only a target
    for s in range(first, last, chunk):
        e = min(s + chunk, last)
        out.append(model(input_ids=ids[:, s:e], past_key_values=cache, use_cache=True).logits[0])
    return torch.cat(out)


@torch.no_grad()
def perplexity(
    model: nn.Module, tokens: torch.Tensor, window: int, stride: int, device: str, chunk: int = 0
) -> tuple[float, int, list[torch.Tensor]]:
    """(perplexity, scored tokens, argmax predictions a window) over strided windows of ``tokens``.

    ``chunk`` = 0 scores a window in one forward; ``chunk`` > 0 feeds the window's context as one
    prefill and its scored tokens ``chunk`` at a time against the KV cache, so the products run at
    M = ``chunk`` rows (the decode kernels) rather than at M = window (the prefill path).
    """
    n = tokens.numel()
    nll, count, preds = 0.0, 0, []
    prev_end = 0
    for begin in range(0, n - 1, stride):
        end = min(begin + window, n)
        ids = tokens[begin:end].to(device).unsqueeze(0)
        targets = ids[0, 1:]
        # Score only tokens not scored by an earlier window (each once, with the most context).
        first = max(prev_end - begin - 1, 0)
        if chunk > 0:
            logits = _chunked_logits(model, ids, first, chunk).float()
        else:
            logits = _forward_logits(model, ids)[0, first:-1].float()
        lp = torch.log_softmax(logits, dim=-1)
        nll += float(-lp.gather(1, targets[first:, None]).sum())
        count += targets.numel() - first
        preds.append(logits.argmax(dim=-1).cpu())
        prev_end = end
        if end == n:
            break
    return math.exp(nll / max(count, 1)), count, preds


# --------------------------------------------------------------------------- the run


def _environment(device: str) -> dict[str, Any]:
    import platform

    import glyd

    env: dict[str, Any] = {"glyd": glyd.__version__, "torch": torch.__version__, "python": platform.python_version()}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name()
    else:
        env["cpu_threads"] = torch.get_num_threads()
    return env


@dataclass
class _Inputs:
    """What every mode is scored on, prepared once: perplexity tokens and encoded MMLU prompts."""

    tokens: torch.Tensor | None = None
    encoded: list[list[int]] | None = None
    letters: list[int] | None = None
    answers: torch.Tensor | None = None
    pad_id: int = 0


def _inputs(cfg: EvalConfig) -> _Inputs:
    inp = _Inputs()
    if not (cfg.ppl or cfg.mmlu):
        return inp
    tokenizer = load_tokenizer(cfg)
    if cfg.ppl:
        path = Path(cfg.text)
        what = not_a_file(path)  # a folder or a FIFO was "not found"
        if what == "missing":
            raise FormatError(f"{show_path(path)}: text file for perplexity not found")
        if what is not None:
            raise FormatError(f"{show_path(path)}: {what}, not a text file for perplexity")
        # Read and tokenize a prefix long enough for the tokens asked for (about 4 characters a
        # token), not the whole file: --text may name a corpus of gigabytes.
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(8 * cfg.ppl_tokens + 1024)
        except OSError as exc:  # no permission to read it, an I/O error
            raise FormatError(f"{show_path(path)}: cannot read this text file ({exc.strerror or exc})") from None
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        inp.tokens = torch.tensor(ids[: cfg.ppl_tokens], dtype=torch.long)
        if inp.tokens.numel() < 2:
            raise FormatError(f"{show_path(path)}: too little text for perplexity")
    if cfg.mmlu:
        questions = read_mmlu(Path(cfg.mmlu_dir), cfg.subjects, cfg.mmlu_per_subject)
        inp.encoded = [tokenizer.encode(mmlu_prompt(q), add_special_tokens=True) for q in questions]
        inp.letters = letter_ids(tokenizer)
        inp.answers = torch.tensor([q["answer"] for q in questions])
        inp.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return inp


def _steps(cfg: EvalConfig, inp: _Inputs) -> list[str]:
    """The steps of one mode, in order (the progress bar counts them)."""
    steps = ["load"]
    steps += ["perplexity"] if inp.tokens is not None else []
    steps += ["MMLU"] if inp.encoded is not None else []
    steps += ["decode step"] if cfg.decode and cfg.decode_batches else []
    steps += ["compiled step"] if cfg.decode and cfg.decode_batches and cfg.decode_compile else []
    return steps


class _Progress:
    """Moves the bar on by one step as the next step (or the mode's end) comes."""

    def __init__(self, bar) -> None:
        self.bar, self.running = bar, False

    def begin(self, mode: str, name: str) -> None:
        self.end()
        self.running = True
        self.bar.set_postfix_str(f"{mode}: {name}")
        log.debug("mode %s: %s", mode, name)

    def end(self) -> None:
        if self.running:
            self.bar.update(1)
        self.running = False


def _check_positions(cfg: EvalConfig, inp: _Inputs, model: nn.Module) -> None:
    """Refuse, naming the option, a run that would index past the model's learned position table."""
    if inp.tokens is not None:
        check_positions(model, min(cfg.window, len(inp.tokens)), f"--window {cfg.window}")
    if inp.encoded:
        check_positions(model, max(len(e) for e in inp.encoded), "the longest MMLU prompt")
    if cfg.decode and cfg.decode_batches:  # the timed step writes position context // 2
        check_positions(model, cfg.decode_context // 2 + 1, f"--decode-context {cfg.decode_context}")


def _run_mode(cfg: EvalConfig, mode: str, inp: _Inputs, ref: dict[str, Any], step: Callable[[str], None]) -> ModeResult:
    """Load and measure one mode; ``ref`` holds bf16's predictions (filled by the first mode);
    ``step(name)`` is called as each step begins."""
    step("load")
    t = time.perf_counter()
    model = load_bf16(cfg) if mode == "bf16" else load_glyd(cfg, mode)
    _sync(cfg.device)
    res = ModeResult(mode=mode, weight_bytes=weight_bytes(model), load_s=time.perf_counter() - t)
    _check_positions(cfg, inp, model)
    if inp.tokens is not None:
        step("perplexity")
        res.ppl, res.ppl_tokens, preds = perplexity(model, inp.tokens, cfg.window, cfg.stride, cfg.device, cfg.score_chunk)
        ref.setdefault("preds", preds)
        same = sum(int((a == b).sum()) for a, b in zip(preds, ref["preds"]))
        res.next_token_agree = same / max(res.ppl_tokens, 1)
    if inp.encoded is not None:
        step("MMLU")
        logits = mmlu_logits(model, inp.encoded, inp.letters, cfg.mmlu_batch, cfg.device, inp.pad_id,
                             decode_step=cfg.score_chunk > 0)
        choice = logits.argmax(dim=-1)
        ref.setdefault("letters", choice)
        ref.setdefault("logits", logits)
        res.mmlu_questions = len(inp.encoded)
        res.mmlu_acc = float((choice == inp.answers).float().mean())
        res.mmlu_agree = float((choice == ref["letters"]).float().mean())
        res.mmlu_max_logit_diff = float((logits - ref["logits"]).abs().max())
    if cfg.decode and cfg.decode_batches:
        if mode == "bf16" and cfg.merge:
            # Quality is compared with the model as transformers runs it (exact mode reproduces
            # that bit for bit); speed with bf16 merged as Glyd is, so the products match.
            merge_bf16(model)
        step("decode step")
        res.decode_ms, res.decode_method = time_decode(
            model, tuple(cfg.decode_batches), cfg.decode_context, cfg.decode_replays, cfg.device, cfg.cuda_graphs,
            kv=cfg.decode_kv,
        )
        if cfg.decode_compile:
            step("compiled step")
            torch._dynamo.reset()  # every mode compiles its own model
            res.compiled_ms, res.compiled_method = time_decode_compiled(
                model, tuple(cfg.decode_batches), cfg.decode_context, cfg.decode_replays, cfg.device, kv=cfg.decode_kv)
    return res


def _local_model(model: str) -> Path:
    """A model folder for ``model``: as given, or a hub id fetched (or found in the cache) as
    ``glyd.from_pretrained`` does; errors name the model."""
    path = Path(model)
    if path.exists() or model.count("/") != 1 or model.startswith((".", "/", "~")):
        return path
    from glyd.hf.bf16 import resolve

    return resolve(model, {})


def evaluate(cfg: EvalConfig, on_result: Callable[[Report], Any] | None = None, progress: bool = False) -> Report:
    """Run every measurement of ``cfg`` for bf16 and each Glyd mode; see the module docstring.

    ``on_result`` is called with the report so far after each mode (to save partial results).
    ``progress``: a tqdm bar over the modes' steps (shown only on a terminal); each finished mode is
    also logged as one line."""
    from tqdm.auto import tqdm

    if not cfg.random and cfg.model.lower() in ("smollm2", "smollm2-135m") and not Path(cfg.model).exists():
        from glyd.apps import smollm2

        cfg.model = str(smollm2.bf16_folder())  # the embedded default model, converted once
    if not cfg.random:
        cfg.model = str(_local_model(cfg.model))
        check_model_folder(Path(cfg.model))  # before the tokenizer: a packed folder is refused at once
    if cfg.memory_limit is not None:
        check_modes_fit(cfg.model, [eval_modes()[m][0] for m in cfg.modes], cfg.memory_limit)
    inp = _inputs(cfg)
    modes = ("bf16", *cfg.modes)
    results: list[ModeResult] = []
    ref: dict[str, Any] = {}
    total = len(modes) * len(_steps(cfg, inp))
    with tqdm(total=total, desc="glyd eval", unit="step", disable=None if progress else True) as bar:
        steps = _Progress(bar)
        for mode in modes:
            res = _run_mode(cfg, mode, inp, ref, lambda name, mode=mode: steps.begin(mode, name))
            steps.end()
            results.append(res)
            log.info("%s", res.summary())
            if on_result is not None:
                on_result(Report(config=asdict(cfg), environment=_environment(cfg.device), results=list(results)))
            gc.collect()
            if cfg.device.startswith("cuda"):
                torch.cuda.empty_cache()
    return Report(config=asdict(cfg), environment=_environment(cfg.device), results=results)
