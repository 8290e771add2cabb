"""Registers glyd's transformers quantizer without importing transformers.

``import glyd`` calls :func:`install`. If transformers is already imported, the quantizer is
registered at once; otherwise an import hook waits for ``transformers.quantizers.auto`` (the
module that holds transformers' quantizer registry, imported by every ``from_pretrained``) and
registers right after it has run. So ``import glyd`` stays light, and
``AutoModelForCausalLM.from_pretrained(glyd_folder)`` still finds ``quant_method: "glyd"``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading

log = logging.getLogger(__name__)

#: The transformers module whose import triggers the registration.
TARGET = "transformers.quantizers.auto"

_lock = threading.RLock()
_registered = False


def register() -> bool:
    """Register glyd's ``HfQuantizer`` and config with transformers (idempotent).

    Returns False (and logs why) when transformers cannot be imported.
    """
    global _registered
    with _lock:
        if _registered:
            return True
        mod = sys.modules.get("glyd.hf.quantizer")
        if mod is not None and not hasattr(mod, "register_with_transformers"):
            # glyd.hf.quantizer is being imported right now (its import of transformers' registry
            # triggered this hook): it registers itself when its body has run.
            return False
        try:
            from glyd.hf import quantizer
        except ImportError as exc:
            log.debug("transformers integration unavailable: %s", exc)
            return False
        quantizer.register_with_transformers()
        _registered = True
        return True


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        _uninstall()
        try:
            register()
        except Exception:  # never break transformers' own import because of glyd
            log.warning("could not register glyd's transformers quantizer", exc_info=True)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader)
        return spec


_finder = _Finder()


def _uninstall() -> None:
    with _lock:
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


def install() -> None:
    """Make transformers know ``quant_method: "glyd"`` as soon as it is imported (or now)."""
    with _lock:
        if TARGET in sys.modules:
            register()
        elif _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
