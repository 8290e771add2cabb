"""Implementations of the ``glyd::`` ops: ``torch`` (the pure-torch twin, every device) and
``cuda`` (the Triton kernels)."""
