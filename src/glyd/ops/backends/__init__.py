"""Implementations of the ``glyd::`` ops: ``torch`` (the pure-torch twin, every device), ``cuda``
(the Triton kernels) and ``cpu`` (glyd's C kernels for ``fixed12``)."""
