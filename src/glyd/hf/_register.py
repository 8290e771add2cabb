"""Registers glyd with transformers without importing transformers.

``import glyd`` calls :func:`install`. Two registrations, each made as soon as its transformers
module has been imported (at once if it already is; otherwise an import hook waits for it and
registers right after it has run):

* ``transformers.models.auto.configuration_auto`` (``AutoConfig``): the config type ``glyd`` of a
  packed folder's config.json (``glyd.hf.packed_config``);
* ``transformers.quantizers.auto`` (the quantizer registry every ``from_pretrained`` imports):
  ``quant_method: "glyd"`` (``glyd.hf.quantizer``).

So ``import glyd`` stays light, and ``AutoModelForCausalLM.from_pretrained(glyd_folder)`` still
finds both.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
import threading

log = logging.getLogger(__name__)

#: transformers module -> (glyd module, its registering function), in the order they register.
TARGETS = {
    "transformers.models.auto.configuration_auto": ("glyd.hf.packed_config", "register_config"),
    "transformers.quantizers.auto": ("glyd.hf.quantizer", "register_with_transformers"),
}
#: Kept for callers that name the quantizer's trigger.
TARGET = "transformers.quantizers.auto"

_lock = threading.RLock()
_done: set[str] = set()
_registered = False


def _register_one(target: str) -> bool:
    with _lock:
        if target in _done:
            return True
        name, func = TARGETS[target]
        mod = sys.modules.get(name)
        if mod is not None and not hasattr(mod, func):
            # That glyd module is being imported right now (its import of transformers triggered
            # this hook): it registers itself when its body has run.
            return False
        try:
            mod = importlib.import_module(name)
        except ImportError as exc:
            log.debug("transformers integration unavailable: %s", exc)
            return False
        getattr(mod, func)()
        _done.add(target)
        return True


def register() -> bool:
    """Register glyd's config type, ``HfQuantizer`` and quantization config with transformers
    (idempotent). Returns False (and logs why) when transformers cannot be imported."""
    global _registered
    with _lock:
        if _registered:
            return True
        ok = all([_register_one(t) for t in TARGETS])
        _registered = ok
        return ok


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, target: str):
        self.inner = inner
        self.target = target

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        try:
            _register_one(self.target)
        except Exception:  # never break transformers' own import because of glyd
            log.warning("could not register glyd with transformers (%s)", self.target, exc_info=True)
        _uninstall_if_done()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in TARGETS or fullname in _done:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, fullname)
        return spec


_finder = _Finder()


def _uninstall_if_done() -> None:
    with _lock:
        if all(t in _done for t in TARGETS) and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


def install() -> None:
    """Make transformers know glyd as soon as its modules are imported (or now)."""
    with _lock:
        for target in TARGETS:
            if target in sys.modules:
                _register_one(target)
        if not all(t in _done for t in TARGETS) and _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
