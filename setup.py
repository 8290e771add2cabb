"""The one compiled part of glyd: the fixed12 CPU kernels (``glyd.kernels.fixed12._cpu``, plain C).

Everything else is in pyproject.toml. The extension is optional: where it cannot be built (no C
compiler), the install goes on without it and glyd's CPU products use the pure-torch twin
(``glyd.kernels.fixed12.cpu.available()`` says which; ``docs/kernels.md``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "glyd.kernels.fixed12._cpu",
            sources=["src/glyd/kernels/fixed12/_cpu.c"],
            extra_compile_args=["-O3", "-std=c99"],
            py_limited_api=True,
            optional=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},  # one wheel a platform for every Python >= 3.10
)
