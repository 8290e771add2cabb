"""Launching Triton kernels under Triton's interpreter (``TRITON_INTERPRET=1``) without leaving
``triton.language`` patched.

The interpreter runs a kernel by swapping ``triton.language``'s builtins for its own for the length
of the launch. It puts them back after the launch, but not after a call into a ``@triton.jit``
helper: ``tl.sum``, ``tl.cdiv``, ``tl.cumsum`` ... are such helpers, and calling one patches
``triton.language.core`` for good (Triton 3.6, ``InterpretedFunction.__call__``). A kernel
compiled later in the same process (every ``@gluon.jit`` kernel compiles, interpreter or not) then
meets interpreter builtins and fails with ``'ir.value' object has no attribute 'dtype'``.
:func:`isolated` wraps a kernel so that each of its interpreted launches restores every name of
``triton.language`` it changed. Compiled kernels are returned unchanged: no cost on the GPU.

>>> import triton, triton.language as tl                        # doctest: +SKIP
>>> @isolated
... @triton.jit
... def k(x_ptr): ...                                           # doctest: +SKIP
>>> k[(1,)](x)                                                  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

__all__ = ["isolated", "language_restored", "language_namespaces"]

_MISSING = object()


def language_namespaces() -> list[Any]:
    """The modules and classes of ``triton.language`` that the interpreter patches."""
    import triton.language as tl

    spaces: list[Any] = [tl, tl.core, tl.math, tl.standard, tl.tensor, tl.dtype]
    base = getattr(tl.core, "tensor_descriptor_base", None)
    if base is not None:
        spaces.append(base)
    return spaces


def _snapshot(spaces: list[Any]) -> list[tuple[Any, dict[str, Any]]]:
    return [(obj, dict(vars(obj))) for obj in spaces]


def _restore(saved: list[tuple[Any, dict[str, Any]]]) -> None:
    for obj, before in saved:
        now = vars(obj)
        # Names the interpreter adds to a module are its own helpers, which the rewritten (cached)
        # kernels look up there: they stay. A name added to a class is a patch: it goes.
        if isinstance(obj, type):
            for name in [n for n in now if n not in before and n != "__annotations__"]:
                delattr(obj, name)
        for name, value in before.items():
            if now.get(name, _MISSING) is not value:
                setattr(obj, name, value)


@contextlib.contextmanager
def language_restored() -> Iterator[None]:
    """Put back every name of ``triton.language`` that the body changed."""
    saved = _snapshot(language_namespaces())
    try:
        yield
    finally:
        _restore(saved)


class _Isolated:
    """An interpreted kernel whose ``kernel[grid](...)`` launches run inside :func:`language_restored`."""

    def __init__(self, kernel: Any):
        self._kernel = kernel

    def __getitem__(self, grid: Any):
        launch = self._kernel[grid]

        def run(*args: Any, **kwargs: Any) -> Any:
            with language_restored():
                return launch(*args, **kwargs)

        return run

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kernel, name)


def isolated(kernel: Any) -> Any:
    """``kernel`` itself when it is compiled; under the interpreter, a wrapper whose launches leave
    ``triton.language`` as they found it. Apply it above ``@triton.jit`` to kernels launched from
    Python (not to helpers called inside kernels)."""
    from triton.runtime.interpreter import InterpretedFunction

    return _Isolated(kernel) if isinstance(kernel, InterpretedFunction) else kernel
