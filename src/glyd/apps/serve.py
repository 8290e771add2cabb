"""``glyd serve MODEL``: an OpenAI-compatible HTTP server for a packed model.

Built on transformers' own serving code (``transformers.cli.serving``, what ``transformers serve``
runs): its FastAPI app, its chat and text completion handlers (streaming and not), and its
continuous batching (``ContinuousBatchingManager``: requests join and leave a running batch a step
at a time, over a paged KV cache). glyd adds what that code cannot know: the model is loaded with
:func:`glyd.from_pretrained` (a packed folder as it is, a bf16 folder packed as it loads, any
layout), requests are checked first (:mod:`glyd.apps.serve_requests`: a 4xx naming the field
instead of an option silently dropped), ``/glyd/model`` says the layout and sizes, and ``/`` is a
small chat page that streams and shows tokens/s.

``kv="lossless"`` keeps the KV cache in glyd's lossless page code: transformers' continuous batching
has its own paged cache, so those requests run one at a time through ``generate()`` (which builds
glyd's cache), as ``transformers serve`` does without ``--continuous-batching``.

>>> from glyd.apps.serve import ServeConfig, Server
>>> server = Server(ServeConfig("path/to/model-glyd", port=0)).start()      # doctest: +SKIP
>>> from openai import OpenAI
>>> client = OpenAI(base_url=server.url + "/v1", api_key="none")            # doctest: +SKIP
>>> client.chat.completions.create(model="path/to/model-glyd",
...     messages=[{"role": "user", "content": "Hello"}]).choices[0].message.content  # doctest: +SKIP
>>> server.stop()                                                            # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from glyd.apps._deps import require
from glyd.errors import GlydError, UnsupportedError

log = logging.getLogger(__name__)

#: The oldest transformers whose serving code glyd serve is built on (its handler and manager API).
MIN_TRANSFORMERS = (5, 17)
#: the first transformers whose serving code glyd serve does not run on: 5.25 builds the model manager
#: from a ModelLoader and an engine connection (no ``device=``); 5.24's server never answered glyd's
#: tests (2026-12-04). Only 5.17 is tested.
END_TRANSFORMERS = (5, 18)
#: The fields that size continuous batching's KV cache.
CACHE_FIELDS = ("block_size", "num_blocks", "max_batch_tokens")
#: ``--kv`` values (glyd.from_pretrained's ``kv``).
#: ``from_pretrained(kv=...)``'s values (``"lossless-dense"``: the old name of ``"lossless-tiered"``, deprecated).
KV_CHOICES = ("lossless", "lossless-tiered", "lossless-dense")


@dataclass(frozen=True)
class ServeConfig:
    """What ``glyd serve`` serves and how (validated on creation).

    ``model``: a packed folder or a bf16 folder (packed as it loads, with ``layout``); ``name``: the
    model name clients send (default: ``model`` as given); ``temperature`` 0 decodes greedily;
    ``max_tokens``: the default of a request that gives none; ``block_size``, ``num_blocks``,
    ``max_batch_tokens``: continuous batching's KV cache (None: transformers' choice on a GPU,
    :data:`glyd.apps.serve_app.CPU_CACHE` on a CPU); ``cuda_graphs``: continuous batching's steps
    replayed from CUDA graphs (True), run eagerly (False) or transformers' choice (None: graphs only
    for attention that needs no mask). ``port`` 0 takes a free port (``Server.url`` says which).
    """

    model: str
    name: str | None = None
    layout: str = "auto"
    kv: str | None = None
    device: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    block_size: int | None = None
    num_blocks: int | None = None
    max_batch_tokens: int | None = None
    cuda_graphs: bool | None = None
    progress: bool = True
    memory_limit: int | str | None = None  # the most the packed weights may take (glyd.from_pretrained's)

    def __post_init__(self) -> None:
        if not str(self.model):
            raise ValueError("model must name a model folder")
        if self.kv is not None and self.kv not in KV_CHOICES:
            raise ValueError(f"kv must be one of {', '.join(KV_CHOICES)} (or None), got {self.kv!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        for key in ("max_tokens", "block_size", "num_blocks", "max_batch_tokens"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{key} must be a whole number >= 1, got {v!r}")
        if self.block_size is not None and self.block_size < 4:
            raise ValueError(f"block_size must be >= 4 (transformers' paged cache), got {self.block_size}")
        if self.cuda_graphs is not None and not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be True, False or None, got {self.cuda_graphs!r}")
        if self.kv is not None and self.cuda_graphs is not None:
            raise ValueError("cuda_graphs is continuous batching's; with kv (glyd's lossless cache) requests run "
                             "one at a time without it")
        if self.kv is not None and any(getattr(self, k) is not None for k in CACHE_FIELDS):
            raise ValueError("block_size, num_blocks and max_batch_tokens size continuous batching's cache; "
                             "with kv (glyd's lossless cache) requests run one at a time and have none")
        if self.name is not None and not self.name.strip():
            raise ValueError("name must not be empty")
        if self.memory_limit is not None:
            from glyd.hf.memory import parse_memory

            try:  # said now, not after the server started loading
                parse_memory(self.memory_limit)
            except GlydError as exc:
                raise ValueError(str(exc)) from None

    @property
    def served(self) -> str:
        """The model name clients send and /v1/models lists."""
        return self.name or str(self.model)

    @property
    def batching(self) -> bool:
        """Continuous batching (False with glyd's lossless KV cache: one request at a time)."""
        return self.kv is None


def _serving() -> Any:
    """transformers' serving package, after checking it and its dependencies are here."""
    for module in ("transformers", "fastapi", "uvicorn", "openai"):
        require(module)
    import transformers

    version = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    if not MIN_TRANSFORMERS <= version < END_TRANSFORMERS:
        lo, hi = (".".join(map(str, v)) for v in (MIN_TRANSFORMERS, END_TRANSFORMERS))
        raise UnsupportedError(f"glyd serve is built on the serving code of transformers >= {lo}, < {hi}; this is "
                               f"transformers {transformers.__version__} (pip install 'transformers>={lo},<{hi}')")
    from transformers.cli import serving

    return serving


class Server:
    """An OpenAI-compatible server for one model: ``run()`` blocks (the command), ``start()`` runs it
    in a thread (tests, notebooks) and ``stop()`` ends it. The model is loaded when it is created,
    unless ``model`` and ``tokenizer`` are given (a model already in memory; ``config.model`` then
    only labels it)."""

    def __init__(self, config: ServeConfig, *, model: Any = None, tokenizer: Any = None):
        _serving()  # its dependencies and version, checked before anything imports them
        from glyd.apps.serve_app import build_app

        if (model is None) != (tokenizer is None):
            raise ValueError("give both model and tokenizer, or neither")
        self.config = config
        self.app, self.state = build_app(config, model=model, tokenizer=tokenizer)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def info(self) -> dict[str, Any]:
        return self.state.info

    def _uvicorn(self) -> Any:
        import uvicorn

        level = logging.getLevelName(min(logging.getLogger().getEffectiveLevel(), logging.WARNING)).lower()
        return uvicorn.Server(uvicorn.Config(self.app, host=self.config.host, port=self.config.port,
                                             log_level=level, timeout_graceful_shutdown=5))

    def run(self) -> None:
        """Serve until interrupted (Ctrl-C or SIGTERM), then stop generating and free the model."""
        self._server = self._uvicorn()
        try:
            self._server.run()
        except SystemExit as exc:  # uvicorn's exit when it cannot bind (its log line says why)
            cfg = self.config
            raise GlydError(f"could not listen on {cfg.host}:{cfg.port} (uvicorn's error above says why; exit "
                            f"{exc.code})") from None
        finally:
            self.close()

    def start(self, timeout: float = 60.0) -> Server:
        """Serve from a background thread; returns once the socket listens."""
        if self._thread is not None:
            raise RuntimeError("this server was already started")
        self._server = self._uvicorn()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve()), name="glyd-serve",
                                        daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise GlydError(f"glyd serve could not listen on {self.config.host}:{self.config.port} "
                                f"(see the log above)")
            if time.monotonic() > end:
                self.stop()
                raise TimeoutError(f"glyd serve did not start listening within {timeout:g} s")
            time.sleep(0.02)
        return self

    @property
    def port(self) -> int:
        """The port it listens on (the one taken when the config said 0)."""
        if self._server is None or not self._server.started:
            raise RuntimeError("the server is not listening")
        return self._server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening, cancel what is generating and free the model (idempotent)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("glyd serve: the server thread did not stop within %g s", timeout)
        self.close()

    def close(self) -> None:
        self.state.generation.shutdown()
        self.state.models.shutdown()

    def __enter__(self) -> Server:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
