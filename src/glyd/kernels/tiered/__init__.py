"""The ``tiered`` layout's kernels: ``unpack`` (the decode and the bit-exact unpack), ``gemv`` (the
fused GEMV) and ``unpack_cublas``. Importing this package imports no Triton."""
