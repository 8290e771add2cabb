"""MMLU for ``glyd eval``: reading the csv files, the 0-shot prompt, the answer-letter logits."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch
from torch import nn

from glyd.errors import FormatError, not_a_file, show_path

LETTERS = ("A", "B", "C", "D")


def read_mmlu(folder: Path, subjects: tuple[str, ...] | None, per_subject: int) -> list[dict[str, Any]]:
    """Questions of ``folder/test/<subject>_test.csv`` (columns question, choice0..3, answer)."""
    test = folder / "test"
    if not test.is_dir():
        raise FormatError(f"{show_path(folder)}: no test/ folder of MMLU csv files")
    available = sorted(p.name[: -len("_test.csv")] for p in test.glob("*_test.csv"))
    chosen = available if not subjects else list(subjects)
    missing = [s for s in chosen if s not in available]
    if missing:
        raise FormatError(f"{test}: no MMLU subject(s) {', '.join(missing)}")
    out = []
    for subject in chosen:
        path = test / f"{subject}_test.csv"
        what = not_a_file(path)  # a FIFO would block the read for ever; a folder raised IsADirectoryError
        if what is not None:
            raise FormatError(f"{show_path(path)}: {what}, not an MMLU csv file")
        try:
            out += _read_csv(path, subject, per_subject)
        except (UnicodeDecodeError, csv.Error) as exc:  # not UTF-8; a field over csv's limit of 131072
            raise FormatError(f"{show_path(path)}: not an MMLU csv file ({exc})") from None
        except OSError as exc:  # no permission to read it, an I/O error
            raise FormatError(f"{show_path(path)}: cannot read this MMLU csv file ({exc.strerror or exc})") from None
    if not out:
        raise FormatError(f"{test}: no MMLU questions selected")
    return out


def _read_csv(path: Path, subject: str, per_subject: int) -> list[dict[str, Any]]:
    """The first ``per_subject`` questions of one subject's csv file, each row checked."""
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if i >= per_subject:
                break
            try:
                q = {
                    "subject": subject,
                    "question": row["question"],
                    "choices": [row[f"choice{j}"] for j in range(4)],
                    "answer": int(row["answer"]),
                }
            except (KeyError, ValueError, TypeError) as exc:
                raise FormatError(f"{show_path(path)}: row {i + 1} lacks question, choice0..3 or an integer "
                                  "answer") from exc
            if not all(isinstance(t, str) for t in (q["question"], *q["choices"])):  # a row short of cells: None
                raise FormatError(f"{show_path(path)}: row {i + 1} lacks question, choice0..3 or an integer answer")
            if not 0 <= q["answer"] < 4:
                raise FormatError(f"{show_path(path)}: row {i + 1} has answer {q['answer']} (expected 0..3)")
            out.append(q)
    return out


def mmlu_prompt(q: dict[str, Any]) -> str:
    subject = q["subject"].replace("_", " ")
    lines = [f"The following is a multiple choice question about {subject}.", "", q["question"].strip()]
    lines += [f"{letter}. {str(c).strip()}" for letter, c in zip(LETTERS, q["choices"])]
    lines.append("Answer:")
    return "\n".join(lines)


def letter_ids(tokenizer) -> list[int]:
    ids = []
    for letter in LETTERS:
        enc = tokenizer.encode(" " + letter, add_special_tokens=False)
        if not enc:
            raise FormatError(f"tokenizer gives no token for ' {letter}'")
        ids.append(enc[-1])
    if len(set(ids)) != 4:
        raise FormatError(f"tokenizer maps the answer letters to {ids}: not four distinct tokens")
    return ids


@torch.no_grad()
def mmlu_logits(
    model: nn.Module, encoded: list[list[int]], letters: list[int], batch: int, device: str, pad_id: int,
    decode_step: bool = False,
) -> torch.Tensor:
    """The four answer-letter logits (fp32) after each prompt, prompts batched by similar length.

    Default: right-padded prompts in one forward each batch, only the last real position through the
    output projection. ``decode_step``: left-padded, every token but the last as a prefill, the last
    one as a decode step of the whole batch (M = batch rows, as serving computes an answer).
    """
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    out = torch.empty(len(encoded), 4)
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    letter_index = torch.tensor(letters, device=device)
    for s in range(0, len(order), batch):
        idx = order[s : s + batch]
        width = max(len(encoded[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):
            row = torch.tensor(encoded[i])
            if decode_step:
                ids[r, width - len(row) :], mask[r, width - len(row) :] = row, 1
            else:
                ids[r, : len(row)], mask[r, : len(row)] = row, 1
        ids, mask = ids.to(device), mask.to(device)
        if decode_step:
            pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
            pre = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=pos[:, :-1],
                        use_cache=True, logits_to_keep=1)
            step = model(input_ids=ids[:, -1:], attention_mask=mask, position_ids=pos[:, -1:],
                         past_key_values=pre.past_key_values, use_cache=True)
            logits = step.logits[:, -1]
        else:
            hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            last = mask.sum(dim=1) - 1
            logits = head(hidden[torch.arange(len(idx), device=device), last])
        out[idx] = logits.index_select(-1, letter_index).float().cpu()
    return out
