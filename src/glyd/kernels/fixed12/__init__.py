"""The ``fixed12`` layout's kernel families, one module each, and what they share.

``words`` (the Triton decode on 32-bit words), ``exceptions`` (the per-matrix exception index and
the exception pass), ``unpack`` (the bit-exact unpack), and the families of the registry:
``gemv``, ``word_dot``, ``operand_dot``, ``byte_dot``, ``mma_v2`` (Gluon, with ``mma_v2_parts``),
``wgmma``, ``wgmma_warpspec`` and ``unpack_cublas``. Importing this package imports no Triton.
"""
