"""The packer: replaces modules as their weights arrive (a stream from disk, or a loaded model)."""

from __future__ import annotations

import logging
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from glyd import ops as _ops
from glyd.codec import Packed
from glyd.errors import FormatError, UnsupportedError, show_path
from glyd.hf._model import (MERGE_GROUPS, check_layout, check_shape, embed_scale_of, is_packable_embedding,
                            is_packable_linear, kept_unpacked, packed_ties, refuse_tied_bias, set_module, set_tensor,
                            unpacked_report, untie_packed)
from glyd.hf.experts import ExpertsPlan
from glyd.nn.modules import GlydEmbedding, GlydLinear, GlydTiedEmbedding, GlydTiedLinear
from glyd.ops import experts as _experts_ops
from glyd.store import sha256_tensor

log = logging.getLogger(__name__)

#: The hash of a tensor not hashed (``hash_weights=False``): none.
_NO_HASH: Future = Future()
_NO_HASH.set_result(None)


@dataclass
class Group:
    parent: str
    attr: str
    parts: tuple[str, ...]
    has_bias: bool
    got: dict[str, torch.Tensor] = field(default_factory=dict)

    def needed(self) -> list[str]:
        names = [f"{self.parent}.{p}.weight" if self.parent else f"{p}.weight" for p in self.parts]
        if self.has_bias:
            names += [n[: -len("weight")] + "bias" for n in names]
        return names


@dataclass
class Value:
    """One packed weight of a :class:`Tie` (``sha256`` is set when its hash is ready)."""

    packed: Packed
    sha256: str | None = None


@dataclass
class Tie:
    """Modules sharing one weight (``packed_ties``, the source first): packed once from the first of
    their tensors to arrive; a later one is compared with it, and one stored with other values is
    packed apart (untied, as transformers unties it)."""

    members: list[str]
    values: dict[str, Value] = field(default_factory=dict)  # member -> the packed weight it was stored with


class Packer:
    """Decides which tensors are packed, packs them one at a time and swaps the modules in."""

    def __init__(self, model: nn.Module, *, layout: str, merge: bool, exact: bool,
                 device: torch.device | Callable[[str], torch.device] | None, hash_weights: bool = True):
        self.model = model
        # False: no sha256 (random weights made for timing); a saved model hashes its weights then
        self.hash_weights = hash_weights
        self.layout = check_layout(layout)
        self.exact = exact
        # None: pack where each tensor already is; a function: the device of each tensor (a device_map)
        self.device = device
        self.layouts: Counter[str] = Counter()
        self.packed_bytes = 0
        self.weights = 0
        self.linears: dict[str, str] = {}  # weight name -> module name
        self.embeds: dict[str, str] = {}
        self.groups: dict[str, Group] = {}  # tensor name -> its group
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="glyd-sha256")
        self._hashes: deque[tuple[nn.Module, str | None, Future]] = deque()
        self.experts = ExpertsPlan(model, exact)  # fused 3-D experts weights, packed expert by expert
        self._pending: dict[str, Future] = {}  # experts weights packed, their module not complete yet
        self.kept = kept_unpacked(model)  # run in float32 by the model: kept as transformers holds them
        if self.kept:
            log.info("kept unpacked, as the model runs them in float32: %s", ", ".join(sorted(self.kept)))
        for name, m in model.named_modules():
            w = f"{name}.weight" if name else "weight"
            if name in self.kept:
                continue
            if is_packable_linear(m):
                self.linears[w] = name
            elif is_packable_embedding(m):
                self.embeds[w] = name
        self.ties: dict[str, Tie] = {}  # weight name -> the modules it is shared by
        for members in packed_ties(model):
            self._plan_tie(members)
        if merge:
            self._plan_merges()

    def _plan_tie(self, members: list[str]) -> None:
        source = next(m for m in members if f"{m}.weight" in self.embeds)
        for m in members:
            if f"{m}.weight" in self.linears:
                refuse_tied_bias(self.model, m, source)
        if len({self._device_for(f"{m}.weight") for m in members}) != 1:
            raise UnsupportedError(f"device_map puts {', '.join(m for m in members if m != source)} and {source} on "
                                   f"different devices: they share one packed weight (tied embeddings)")
        tie = Tie(list(members))
        for m in members:
            w = f"{m}.weight"
            self.linears.pop(w, None)
            self.embeds.pop(w, None)
            self.ties[w] = tie

    def _plan_merges(self) -> None:
        for pname, parent in self.model.named_modules():
            for attr, parts in MERGE_GROUPS.items():
                mods = [parent._modules.get(p) for p in parts]
                if (any(m is None or not is_packable_linear(m) for m in mods) or hasattr(parent, attr)
                        or any((f"{pname}.{p}" if pname else p) in self.kept for p in parts)):
                    continue
                if len({m.in_features for m in mods}) != 1 or len({m.bias is None for m in mods}) != 1:
                    continue
                if len({self._device_for(f"{pname}.{p}.weight" if pname else f"{p}.weight") for p in parts}) != 1:
                    log.info("%s: %s are placed on different devices; not merged", pname, ", ".join(parts))
                    continue
                g = Group(pname, attr, parts, mods[0].bias is not None)
                for n in g.needed():
                    self.groups[n] = g
                    self.linears.pop(n, None)

    def wants(self, name: str) -> bool:
        return (name in self.linears or name in self.embeds or name in self.groups or name in self.ties
                or self.experts.wants(name))

    def tied_copy(self, name: str) -> bool:
        """Whether ``name`` is a tied weight other than its source's: not given, it shares the source's."""
        tie = self.ties.get(name)
        return tie is not None and name != f"{tie.members[0]}.weight"

    def _pack(self, name: str, t: torch.Tensor, device_of: str | None = None) -> tuple[Packed, Future]:
        return self._pack_with(_ops._pack, name, t, device_of)

    def _pack_with(self, pack, name: str, t: torch.Tensor, device_of: str | None = None):
        if t.dtype != torch.bfloat16:
            raise FormatError(
                f"tensor {name!r} is {t.dtype}: glyd packs bf16 weights only (convert the model to bf16 "
                f"first; rounding fp32 or fp16 to bf16 is lossy, so glyd does not do it for you)"
            )
        # sha256 of the original bf16 bytes (saving and verify need no unpack), on a worker thread
        # while the matrix packs: hashlib releases the GIL.
        sha = self._hasher.submit(sha256_tensor, t) if self.hash_weights else _NO_HASH
        dev = self._device_for(device_of or name)
        w = t.to(t.device if dev is None else dev)
        layout = _ops.choose_layout(tuple(w.shape[-2:]), w.device) if self.layout == "auto" else self.layout
        p = pack(w, layout)
        self.layouts[p.layout] += 1
        self.packed_bytes += p.nbytes
        self.weights += p.numel
        return p, sha

    def _track(self, module: nn.Module, sha: Future, weight: str | None = None) -> nn.Module:
        """Give ``module`` its hash when ready (of its ``weight`` for experts); at most two tensors wait
        for hashing (bounded memory)."""
        self._hashes.append((module, weight, sha))
        while len(self._hashes) > 2:
            self._settle()
        return module

    def _settle(self) -> None:
        module, weight, fut = self._hashes.popleft()
        if weight is None:
            module.sha256 = fut.result()
        else:
            module.sha256[weight] = fut.result()

    def close(self) -> None:
        """Wait for every hash and stop the hashing thread."""
        try:
            while self._hashes:
                self._settle()
        finally:
            self._hasher.shutdown(wait=True, cancel_futures=True)

    def _device_for(self, name: str) -> torch.device | None:
        return self.device(name) if callable(self.device) else self.device

    def _to_device(self, t: torch.Tensor, name: str) -> torch.Tensor:
        dev = self._device_for(name)
        return t if dev is None else t.to(dev)

    def feed(self, name: str, t: torch.Tensor) -> None:
        """Take tensor ``name`` of the model (a weight to pack, or any other tensor to put in place)."""
        if not self.experts.wants(name):  # (experts: checked whole, by _feed_experts)
            check_shape(self.model, name, t)
        if name in self.ties:
            self._feed_tied(name, t)
        elif name in self.linears:
            mname = self.linears.pop(name)
            old = self.model.get_submodule(mname)
            p, sha = self._pack(name, t)
            bias = old.bias
            if bias is not None and not bias.is_meta:
                bias = self._to_device(bias.detach(), name)
            set_module(self.model, mname, self._track(GlydLinear(p, bias, exact=self.exact), sha))
        elif name in self.embeds:
            mname = self.embeds.pop(name)
            old = self.model.get_submodule(mname)
            p, sha = self._pack(name, t)
            scale = embed_scale_of(old)
            if isinstance(scale, torch.Tensor):
                scale = scale.to(p.device)
            set_module(self.model, mname, self._track(GlydEmbedding(p, old.padding_idx, scale=scale), sha))
        elif self.experts.wants(name):
            self._feed_experts(name, t)
        elif name in self.groups:
            g = self.groups[name]
            g.got[name] = t
            if len(g.got) == len(g.needed()):
                self._merge(g)
        elif not set_tensor(self.model, name, self._to_device(t, name)):
            log.warning("tensor %r of the checkpoint has no place in the model; ignored", name)

    def _feed_tied(self, name: str, t: torch.Tensor) -> None:
        tie, member = self.ties[name], name[: -len(".weight")]
        if member in tie.values:
            raise FormatError(f"tensor {name!r} was given twice")
        for other, v in tie.values.items():
            if v.packed.shape == tuple(t.shape) and torch.equal(_ops.unpack(v.packed), t.to(v.packed.device)):
                log.debug("%s: equal to %s (tied), not packed twice", name, other)
                tie.values[member] = v
                return
        if tie.values:
            log.warning("%s and %s.weight are tied but stored with other values: packed apart (transformers unties "
                        "them too)", name, next(iter(tie.values)))
        p, sha = self._pack(name, t, device_of=f"{tie.members[0]}.weight")
        tie.values[member] = self._track(Value(p), sha)

    def _finish_tie(self, tie: Tie) -> None:
        """Each member's module over the value it was stored with (a member not stored: its source's,
        or the first stored): an embedding holds the arrays, the other members use them."""
        if not tie.values:
            return
        default = tie.values.get(tie.members[0]) or next(iter(tie.values.values()))
        by_value: dict[int, list[str]] = {}
        for m in tie.members:
            by_value.setdefault(id(tie.values.get(m, default)), []).append(m)
        values = {id(v): v for v in [*tie.values.values(), default]}
        for key, members in by_value.items():
            self._install(values[key], members)
        for m in tie.members:
            self.ties.pop(f"{m}.weight", None)

    def _install(self, v: Value, members: list[str]) -> None:
        olds = {m: self.model.get_submodule(m) for m in members}
        embeds = [m for m in members if is_packable_embedding(olds[m])]
        holder = None
        for m in [*embeds, *[m for m in members if m not in embeds]]:
            old = olds[m]
            if m in embeds:
                scale = embed_scale_of(old)
                if isinstance(scale, torch.Tensor):
                    scale = scale.to(v.packed.device)
                new = (GlydTiedEmbedding(holder, old.padding_idx, scale=scale) if holder is not None
                       else GlydEmbedding(v.packed, old.padding_idx, scale=scale, sha256=v.sha256))
                holder = holder or new
            elif holder is not None:
                new = GlydTiedLinear(holder, exact=self.exact)
            else:  # an output projection stored apart: its own weight
                new = GlydLinear(v.packed, None, exact=self.exact, sha256=v.sha256)
            set_module(self.model, m, new)

    def _feed_experts(self, name: str, t: torch.Tensor) -> None:
        want = list(self.experts.shape_of(name))
        if list(t.shape) != want:
            raise FormatError(f"tensor {name!r} has shape {list(t.shape)}, the model's experts weight {want}")
        p, sha = self._pack_with(_experts_ops.pack_experts, name, t)
        self._pending[name] = sha
        module = self.experts.take(name, p, sha)
        if module is not None:
            mname = name.rpartition(".")[0]
            for w in module.weights:
                self._track(module, self._pending.pop(f"{mname}.{w}" if mname else w), w)

    def _merge(self, g: Group) -> None:
        names = g.needed()
        k = len(g.parts)
        ws = [g.got[n] for n in names[:k]]
        w = torch.cat([x.to(ws[0].device) for x in ws], dim=0)
        merged_name = f"{g.parent}.{g.attr}" if g.parent else g.attr
        p, sha = self._pack(f"{merged_name}.weight", w, device_of=names[0])
        del w
        bias = None
        if g.has_bias:
            bias = self._to_device(torch.cat([g.got[n].to(ws[0].device) for n in names[k:]]), names[0])
        merged = self._track(GlydLinear(p, bias, exact=self.exact, splits=[x.shape[0] for x in ws]), sha)
        parent = self.model.get_submodule(g.parent) if g.parent else self.model
        setattr(parent, g.attr, merged)
        for part, mod in zip(g.parts, merged.parts()):
            setattr(parent, part, mod)
        for n in names:
            self.groups.pop(n, None)
        g.got.clear()

    def finish(self, where: str) -> None:
        self.close()
        ties = {id(t): t for t in self.ties.values()}.values()
        for tie in ties:
            self._finish_tie(tie)
        missing = sorted(set(self.linears) | set(self.embeds) | set(self.groups) | set(self.ties)
                         | set(self.experts.missing()))
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise FormatError(f"{show_path(where)}: tensor(s) {', '.join(missing[:5])}{more} are missing from the "
                              "checkpoint")
        untie_packed(self.model)
        log.info("%s: %s", show_path(where), unpacked_report(self.model))
