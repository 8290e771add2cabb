"""Checkpoint tensors that transformers converts while loading (MoE experts stored one matrix per
expert, fused into one 3-D tensor): gathered as they stream in, converted by transformers' own
operations, then handed on, one target tensor at a time.

glyd's bf16 loader reads a checkpoint one tensor at a time. For a key that transformers' conversion
mapping fuses (``glyd.hf.keys.checkpoint_resolver``), the tensors of its target are kept until the
last of them has been read (how many is known beforehand from the shard headers), then the
converter (a copy of transformers' ``WeightConverter``, its operations in order, the sources in
transformers' own order: natural order of their keys) makes the target, and the sources are
dropped. Memory: the sources of the targets being gathered, usually one layer's experts.

>>> from torch import nn
>>> conv = Conversions(nn.Linear(2, 2), ["weight", "bias"], "folder")
>>> [name for name, _ in conv.take("weight", torch.zeros(2, 2))]
['weight']
"""

from __future__ import annotations

import copy
import logging
import re
from collections import Counter
from typing import Any

import torch
from torch import nn

from glyd.errors import FormatError, show_path
from glyd.hf.keys import checkpoint_resolver

log = logging.getLogger(__name__)

__all__ = ["Conversions"]


def _natural(key: str) -> list:
    try:
        from transformers.core_model_loading import dot_natural_key
    except ImportError:  # pragma: no cover - only reached with a converter, which needs transformers
        return [key]
    return dot_natural_key(key)


def _stacks_experts(converter: Any) -> bool:
    """Whether ``converter`` stacks one tensor an expert (transformers' ``MergeModulelist``)."""
    return any(type(op).__name__ == "MergeModulelist" for op in getattr(converter, "operations", ()) or ())


def _expert_text(key: str, pattern: str | None) -> str | None:
    r"""What the ``*`` of ``pattern`` (a converter's source pattern, a regular expression:
    ``.experts.*.w1.weight``, ``\.experts.*.w1.weight``) stands for in ``key``, matched as transformers
    matches it (``*.`` is ``.*\.``); None for a pattern of another form.

    >>> _expert_text("model.layers.1.block_sparse_moe.experts.7.w1.weight", ".experts.*.w1.weight")
    '7'
    >>> _expert_text("layers.0.ffn.experts.x.w1.weight", r"\.experts.*.w1.weight")
    'x'
    """
    if not pattern or pattern.count("*.") != 1 or pattern.count("*") != 1:
        return None
    try:
        m = re.search(pattern.replace("*.", r"(.*)\."), key)
    except re.error:
        return None
    return m.group(1) if m else None


class Conversions:
    """The checkpoint ``keys`` of ``model`` (every key the loader will read), resolved at once.

    :meth:`take` gets each tensor as it is read and returns the model tensors that are ready:
    ``[(name, tensor)]``, the tensor itself for a plain key, the converted targets when the last
    source of a conversion arrives, else nothing; :meth:`check_done` says what never completed.
    """

    def __init__(self, model: nn.Module, keys: list[str], where: str) -> None:
        self.model = model
        self.where = where
        resolve = checkpoint_resolver(model, set(model.state_dict(keep_vars=True).keys()), where)
        self._plan = {k: resolve(k) for k in keys}
        self._expected = Counter(name for name, conv, _ in self._plan.values() if conv is not None)
        self._got: dict[str, list[tuple[str, str, torch.Tensor]]] = {}
        self._check_given_once()
        self._check_expert_numbers()
        if self._expected:
            log.info("%s: %d tensors are converted by transformers' conversion mapping into %d", show_path(where),
                     sum(self._expected.values()), len(self._expected))

    def _check_given_once(self) -> None:
        # two sources for one model tensor: one would be used and the other dropped, whichever differed
        plain: dict[str, str] = {}
        for key, (name, conv, _) in self._plan.items():
            if conv is not None:
                continue
            if name in plain:
                raise FormatError(f"{show_path(self.where)}: model tensor {name!r} is given twice: by {plain[name]!r} "
                                  f"and by {key!r}")
            if name in self._expected:
                raise FormatError(f"{show_path(self.where)}: model tensor {name!r} is given twice: by {key!r} and by "
                                  f"transformers' conversion of {self._expected[name]} checkpoint tensors")
            plain[name] = key

    def _check_expert_numbers(self) -> None:
        # transformers stacks whatever a converter's pattern matches, in key order: experts 0, 1, 2, 7
        # (or 1 twice and no 3) of a 4-expert model made a tensor of 4 with the wrong experts in place
        state = self.model.state_dict(keep_vars=True)
        seen: dict[tuple[str, str, int], str] = {}
        for key, (name, conv, pattern) in self._plan.items():
            number = _expert_text(key, pattern) if conv is not None and _stacks_experts(conv) else None
            if number is None:
                continue
            where = f"{show_path(self.where)}: checkpoint tensor {key!r}"
            if not re.fullmatch(r"0|[1-9][0-9]{0,17}", number):
                raise FormatError(f"{where} names expert {number!r} of {name!r}: not an expert number")
            n, target = int(number), state.get(name)
            if target is not None and target.dim() >= 1 and n >= target.shape[0]:
                raise FormatError(f"{where} is expert {n} of {name!r}, which has {target.shape[0]} experts")
            other = seen.setdefault((name, pattern, n), key)
            if other != key:
                raise FormatError(f"{show_path(self.where)}: checkpoint tensors {other!r} and {key!r} are both "
                                  f"expert {n} of {name!r}")

    def name_of(self, key: str) -> str:
        """The model tensor that ``key`` fills (or helps make)."""
        return self._plan[key][0]

    def take(self, key: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        name, converter, pattern = self._plan[key]
        if converter is None:
            return [(name, tensor)]
        got = self._got.setdefault(name, [])
        got.append((key, pattern, tensor))
        if len(got) < self._expected[name]:
            return []
        del self._got[name]
        return self._convert(name, converter, got)

    def _convert(self, name: str, converter: Any, got: list[tuple[str, str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        c = copy.deepcopy(converter)  # one instance a target, as transformers' loader does
        for key, pattern, t in sorted(got, key=lambda g: _natural(g[0])):
            c.add_tensor(name, key, pattern, t)
        got.clear()
        try:
            out = c.convert(name, model=self.model, config=getattr(self.model, "config", None))
        except Exception as exc:  # transformers' operations raise anything on tensors that do not fit
            raise FormatError(f"{show_path(self.where)}: transformers' conversion of {self._expected[name]} "
                              f"checkpoint tensors into {name!r} failed ({type(exc).__name__}: {exc})") from exc
        ready = []
        for target, value in out.items():
            value = value[0] if isinstance(value, list) else value
            if not isinstance(value, torch.Tensor):
                raise FormatError(f"{show_path(self.where)}: transformers' conversion into {target!r} gave no tensor")
            ready.append((target, value))
        log.debug("%s: %s made from %d checkpoint tensors", show_path(self.where), ", ".join(t for t, _ in ready),
                  self._expected[name])
        return ready

    def check_done(self) -> None:
        """Raise FormatError naming a conversion whose sources did not all arrive."""
        for name, got in self._got.items():
            raise FormatError(f"{show_path(self.where)}: {name!r} is made from {self._expected[name]} checkpoint "
                              f"tensors, {len(got)} were read")
