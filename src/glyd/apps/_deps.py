"""Optional packages: which extra of glyd installs each, and one-line errors when one is missing.

>>> from glyd.apps._deps import missing
>>> str(missing("transformers"))
'the package transformers is not installed; install it with: pip install "glyd-lossless[models]"'
"""

from __future__ import annotations

import importlib

from glyd._dist import DIST_NAME
from glyd.errors import MissingDependencyError

#: top-level module -> the extra of ``pyproject.toml``'s ``[project.optional-dependencies]`` that has it (None: a core dependency)
EXTRAS = {
    "transformers": "models",
    "accelerate": "models",
    "gguf": "models",
    "huggingface_hub": "models",
    "triton": "gpu",
    "fastapi": "serve",
    "uvicorn": "serve",
    "openai": "serve",
    "zstandard": None,  # a core dependency: the .glyd archive commands need it
}


def missing(module: str) -> MissingDependencyError:
    """The error for an optional ``module`` that cannot be imported (naming the extra to install)."""
    extra = EXTRAS.get(module)
    how = f'pip install "{DIST_NAME}[{extra}]"' if extra else f"pip install {module}"
    return MissingDependencyError(f"the package {module} is not installed; install it with: {how}")


def require(module: str) -> None:
    """Import ``module`` or raise :class:`~glyd.errors.MissingDependencyError` (one line)."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != module:
            raise  # the package is there but something it imports is missing: show that
        raise missing(module) from None
