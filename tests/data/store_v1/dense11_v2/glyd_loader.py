"""A model packed losslessly by Glyd; transformers loads it through the glyd-lossless package.

transformers runs this file only when asked to trust the folder's code (trust_remote_code=True, or
`transformers serve --trust-remote-code`). It reads no weights: it imports glyd, which registers
the config type "glyd" and glyd's quantizer with transformers.
"""

try:
    from glyd.hf.packed_config import GlydPackedConfig
except ImportError as exc:
    raise ImportError(
        "this folder holds a model packed by Glyd: install glyd-lossless to load it "
        "(pip install 'glyd-lossless[models]')"
    ) from exc

__all__ = ["GlydPackedConfig"]
