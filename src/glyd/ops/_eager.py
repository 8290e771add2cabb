"""``torch.ops.glyd.linear`` from eager Python: straight to its backend's implementation where the
dispatcher would only pass the call through.

Because ``glyd::linear`` has an autograd formula (``torch.library.register_autograd``), every call
goes through a Python autograd kernel and a Python redispatch before the backend's implementation,
even under ``torch.no_grad()`` (about 45 us of host time a product on the H200's host, 2026-12-03;
about 70 of a CPU op call's 135 us on the development machine, 2026-12-05). When nothing between
them could act (no gradient wanted, plain tensors all on CUDA or all on the CPU, no torch-function
or dispatch mode, no functorch transform, no profiler, no ``torch.jit`` trace, not traced by
``torch.compile``), ``linear`` calls ``backends.cuda.linear`` or ``backends.cpu.linear`` itself: the
function the dispatcher would reach, so the same result. Everything else takes
``torch.ops.glyd.linear``. Off with launch plans (``GLYD_PLANS=0``, ``glyd.kernels._plan.set_enabled``).
"""

from __future__ import annotations

import torch
from torch import nn

from glyd.kernels import _plan
from glyd.ops.backends import cpu as _cpu
from glyd.ops.backends import cuda as _cuda

__all__ = ["linear", "backend", "passes_through"]

_C = torch._C
_PLAIN = (torch.Tensor, nn.Parameter)
_PROBES = (getattr(_C, "_is_torch_function_mode_enabled", None), getattr(_C, "_len_torch_dispatch_stack", None),
           getattr(_C, "_are_functorch_transforms_active", None),
           getattr(getattr(_C, "_autograd", None), "_profiler_enabled", None), getattr(_C, "_get_tracing_state", None))
#: The torch build has every probe ``passes_through`` asks (else every call takes the dispatcher).
USABLE = all(f is not None for f in _PROBES)
_fn_mode, _dispatch_modes, _functorch, _profiling, _tracing = _PROBES


def backend(x, bias, arrays):
    """The implementation (``backends.cuda.linear`` or ``backends.cpu.linear``) that
    ``torch.ops.glyd.linear(x, ..., arrays, bias, ...)`` would reach with these very arguments when
    nothing else would see the call; None when the call must take the op."""
    if torch.compiler.is_compiling():  # first: torch.compile traces the op (its fake implementation)
        return None
    if type(x) is not torch.Tensor:
        return None
    if x.is_cuda:  # the dispatcher's choice: every tensor on CUDA, or on CUDA and the CPU
        impl, same = _cuda.linear, all(a.is_cuda for a in arrays) and (bias is None or bias.is_cuda)
    elif x.is_cpu:
        impl, same = _cpu.linear, all(a.is_cpu for a in arrays) and (bias is None or bias.is_cpu)
    else:
        return None
    return impl if same and passes_through(x, bias, arrays) else None


def passes_through(x, bias, arrays) -> bool:
    """True when the dispatcher would take a call with these arguments straight to the backend's
    implementation: no gradient wanted, plain tensors, no mode, transform, profiler or trace active
    (and plans on). ``backend`` adds: one device for all, not traced by ``torch.compile``."""
    if not (USABLE and _plan.enabled()) or type(x) is not torch.Tensor:
        return False
    grad = torch.is_grad_enabled()
    if grad and (x.requires_grad or (bias is not None and bias.requires_grad)):
        return False
    if bias is not None and type(bias) not in _PLAIN:
        return False
    for a in arrays:
        if type(a) not in _PLAIN:
            return False
    return not (_fn_mode() or _dispatch_modes() or _functorch() or _profiling() or _tracing() is not None)


def linear(x: torch.Tensor, layout: str, shape, arrays, bias, version: int) -> torch.Tensor:
    """``torch.ops.glyd.linear(x, layout, shape, arrays, bias, version)``, the same result."""
    impl = backend(x, bias, arrays)
    if impl is not None:
        return impl(x, layout, shape, arrays, bias, version)
    return torch.ops.glyd.linear(x, layout, shape, arrays, bias, version)
