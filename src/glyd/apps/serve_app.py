"""The FastAPI app of ``glyd serve``: transformers' serving app with glyd's model, checks and page.

Imports transformers' serving code (FastAPI, uvicorn, openai): :mod:`glyd.apps.serve` imports this
module only after checking they are installed.
"""

from __future__ import annotations

import copy
import logging
import uuid
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from transformers.cli.serving.chat_completion import ChatCompletionHandler
from transformers.cli.serving.completion import CompletionHandler
from transformers.cli.serving.model_manager import ModelManager
from transformers.cli.serving.server import build_server
from transformers.cli.serving.utils import GenerationState, split_model_id

from glyd.apps.serve_requests import Policy, RequestError, check_chat, check_completion
from glyd.errors import FormatError, GlydError, show_path

log = logging.getLogger(__name__)

#: Routes of transformers' app that glyd serve keeps (the others load other models or skip its checks).
KEPT_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models", "/health"})
#: The KV cache of continuous batching on a CPU when not given (transformers sizes it from GPU memory).
CPU_CACHE = {"block_size": 32, "num_blocks": 64, "max_batch_tokens": 256}


def cb_config(cfg: Any, device: Any) -> Any:
    """The ``ContinuousBatchingConfig`` for ``cfg`` on ``device`` (None: transformers' defaults)."""
    if not cfg.batching:
        return None
    from transformers import ContinuousBatchingConfig

    given = {k: getattr(cfg, k) for k in CPU_CACHE if getattr(cfg, k) is not None}
    if getattr(device, "type", str(device)) == "cpu":
        given = {**CPU_CACHE, **given}
    if getattr(cfg, "cuda_graphs", None) is not None:
        given["use_cuda_graph"] = cfg.cuda_graphs
    return ContinuousBatchingConfig(**given) if given else None


def context_tokens(model: Any, cache: Any) -> int:
    """The most tokens (prompt and answer) one request may hold: the model's positions, and the
    whole KV cache of continuous batching when it is sized."""
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    limits = [getattr(text, "max_position_embeddings", None)]
    if cache is not None and cache.num_blocks is not None:
        limits.append(cache.num_blocks * cache.block_size)
    limits = [int(v) for v in limits if isinstance(v, int) and v > 1]
    return min(limits) if limits else 1 << 30


def model_info(model: Any, cfg: Any, policy: Policy) -> dict[str, Any]:
    """What ``/glyd/model`` answers: the layout, the weights' bytes held and as bf16, the KV cache."""
    from glyd.apps.demo import packed_stats
    from glyd.apps.eval_models import weight_bytes
    from glyd.hf.save import model_layout

    numel, packed = packed_stats(model)
    held = weight_bytes(model)
    return {
        "id": cfg.served,
        "source": str(cfg.model),
        "layout": model_layout(model) if numel else "bf16",  # a plain model (benchmarks/serve.py's baseline)
        "weight_bytes": held,
        "bf16_weight_bytes": held - packed + 2 * numel,
        "bits_per_weight": round(8 * packed / numel, 3) if numel else None,
        "kv": cfg.kv or "bf16",
        "batching": "continuous" if cfg.batching else "one request at a time",
        "device": str(model.device),
        "temperature": cfg.temperature,
        "max_tokens": policy.max_tokens,
        "context": policy.context,
    }


def server_generation_config(model: Any, cfg: Any) -> Any:
    """The model's generation config with the server's sampling (every request gets it)."""
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample = cfg.temperature > 0
    gen.temperature = cfg.temperature if gen.do_sample else None
    gen.top_p = cfg.top_p if gen.do_sample else None
    if not gen.do_sample:
        gen.top_k = None
    gen.max_new_tokens = cfg.max_tokens
    return gen


def page() -> str:
    """The chat page served at ``/``."""
    return resources.files("glyd.apps").joinpath("serve_page.html").read_text(encoding="utf-8")


@dataclass
class ServeState:
    """What the app holds: transformers' model manager and generation state, the request policy and
    the model's description (``/glyd/model``)."""

    models: Any
    generation: Any
    policy: Policy
    info: dict[str, Any]


def _tokenizer(model: str) -> Any:
    """The tokenizer of the folder (or Hub id) ``model``, with glyd's one-line errors for anything that is not a
    model folder (transformers' loader raises OSError or ValueError tracebacks)."""
    from transformers import AutoTokenizer

    from glyd.hf.bf16 import resolve

    path = resolve(model, {})
    if not (path / "config.json").is_file():
        raise FormatError(f"{show_path(model)}: no config.json: not a transformers model folder")
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise FormatError(f"{show_path(model)}: its tokenizer could not be loaded ({why})") from None


class GlydModels(ModelManager):
    """transformers' model manager holding the one model glyd serve was started with, loaded by
    :func:`glyd.from_pretrained` (and never unloaded for idleness).

    The served model is keyed by its name as ``/v1/models`` lists it (``cfg.served``), not by
    transformers' ``'name@main'``: the handlers answer with that key as every response's ``model``
    (chat and text, streamed or not), so a client can send back the name it was answered with.
    glyd's ``_load_processor`` and ``_load_model`` never split the key on ``@`` (transformers' do,
    and its ``/load_model`` route, which glyd serve drops)."""

    def __init__(self, cfg: Any, model: Any = None, tokenizer: Any = None):
        self.cfg = cfg
        self.given = (model, tokenizer)
        super().__init__(device=str(cfg.device or "auto"), dtype="auto", force_model=cfg.served, model_timeout=-1)

    def _load_processor(self, model_id_and_revision: str, gguf_file: str | None = None) -> Any:
        tok = self.given[1] or _tokenizer(self.cfg.model)
        if not hasattr(tok, "_tokenizer"):  # the streamers decode through the Rust tokenizer
            raise GlydError(f"{show_path(self.cfg.model)}: glyd serve needs a fast (tokenizers) tokenizer; this "
                            f"folder's is {type(tok).__name__}")
        return tok

    def _load_model(self, model_id_and_revision: str, tqdm_class: Any = None, progress_callback: Any = None,
                    gguf_file: str | None = None) -> Any:
        import glyd

        cfg = self.cfg
        model = self.given[0]
        if model is None:
            model = glyd.from_pretrained(cfg.model, layout=cfg.layout, kv=cfg.kv, device=cfg.device,
                                         progress=cfg.progress, memory_limit=cfg.memory_limit)
        model.generation_config = server_generation_config(model, cfg)
        return model

    def process_model_name(self, model_id: str) -> str:  # type: ignore[override]  # a staticmethod in transformers
        """The served name as it is (and as transformers' ``_resolve_model`` passes it on after taking a
        ``:<file>.gguf`` tail off it); any other name as transformers canonicalizes it (``'id@main'``)."""
        if model_id in (self.cfg.served, split_model_id(self.cfg.served)[0]):
            return self.cfg.served
        return super().process_model_name(model_id)

    def get_gen_models(self, cache_dir: str | None = None) -> list[dict]:
        return [{"id": self.cfg.served, "object": "model", "created": 0, "owned_by": "glyd"}]

    def loaded(self) -> tuple[Any, Any]:
        """(model, tokenizer) of the served model, under the key transformers' ``__init__`` and
        ``_resolve_model`` load it by."""
        repo, gguf_file = split_model_id(self.cfg.served)
        return self.load_model_and_processor(self.process_model_name(repo), gguf_file=gguf_file)


def _text(content: Any) -> str:
    return content if isinstance(content, str) else " ".join(p["text"] for p in content)


def _check_rendered(msgs: list[dict[str, str]], text: str) -> None:
    """Refuse a message the chat template leaves out (Qwen2.5's renders no "developer" message, for one):
    the answer would ignore it without a word. Assistant turns are not checked (templates may rewrite
    them, e.g. drop their reasoning); contents are compared trimmed (templates may trim them)."""
    for i, m in enumerate(msgs):
        content = m["content"].strip()
        if m["role"] != "assistant" and content and content not in text:
            hint = " (send it as role system)" if m["role"] == "developer" else ""
            raise RequestError(f"messages[{i}] ({m['role']}) is left out of the prompt by this model's chat "
                               f"template{hint}", param=f"messages[{i}]")


def _counters(tokenizer: Any) -> tuple[Any, Any]:
    """Functions that count a checked body's prompt tokens (chat, text)."""

    def chat(body: dict[str, Any]) -> int:
        if not getattr(tokenizer, "chat_template", None):
            raise RequestError("this model's tokenizer has no chat template: send a plain prompt to /v1/completions",
                               param="messages")
        msgs = [{"role": m["role"], "content": _text(m["content"])} for m in body["messages"]]
        try:
            text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)
        except Exception as exc:  # the template's own refusal (jinja's raise_exception), whatever its type
            raise RequestError(f"the model's chat template refused the messages: {exc}", param="messages") from None
        _check_rendered(msgs, text)
        return len(out["input_ids"])

    def text(body: dict[str, Any]) -> int:
        return len(tokenizer(body["prompt"])["input_ids"])

    return chat, text


class GlydChat(ChatCompletionHandler):
    """transformers' chat completion handler, after glyd's checks (:func:`check_chat`)."""

    def __init__(self, models: GlydModels, generation: Any, policy: Policy, count: Any):
        super().__init__(model_manager=models, generation_state=generation)
        self.policy, self.count = policy, count

    def _validate_request(self, body: dict) -> None:
        checked = check_chat(body, self.policy, self.count)
        body.clear()
        body.update(checked)
        super()._validate_request(body)


class GlydCompletion(CompletionHandler):
    """transformers' text completion handler, after glyd's checks (:func:`check_completion`)."""

    def __init__(self, models: GlydModels, generation: Any, policy: Policy, count: Any):
        super().__init__(model_manager=models, generation_state=generation)
        self.policy, self.count = policy, count

    def _validate_request(self, body: dict) -> None:
        checked = check_completion(body, self.policy, self.count)
        body.clear()
        body.update(checked)
        super()._validate_request(body)


def _error(status: int, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}},
                        status_code=status)


def _errors(app: FastAPI) -> None:
    """Errors as OpenAI's API spells them (``{"error": {"message": ...}}``), one line each."""

    @app.exception_handler(RequestError)
    async def _refused(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        why = first.get("msg", "invalid")
        return _error(400, f"the request body must be a JSON object ({why})")


def _unique_ids(app: FastAPI) -> None:
    """A client's ``x-request-id`` gets a unique suffix. transformers' batching keys each request by
    that id: two requests in flight with one id (a client that sends a fixed one) would share a
    result handler, and one of them would never end."""

    @app.middleware("http")
    async def _suffix(request: Request, call_next: Any) -> Any:
        suffix = b"-" + uuid.uuid4().hex[:12].encode()
        request.scope["headers"] = [(k, v + suffix if k.lower() == b"x-request-id" else v)
                                    for k, v in request.scope["headers"]]
        return await call_next(request)


def build_app(cfg: Any, model: Any = None, tokenizer: Any = None) -> tuple[FastAPI, ServeState]:
    """Load the model (unless given) and build the app (transformers' routes that glyd serve keeps,
    and its own)."""
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        # transformers logs every request at WARNING ("[Request received] ..."): kept for -v.
        logging.getLogger("transformers.cli.serving").setLevel(logging.ERROR)
    models = GlydModels(cfg, model, tokenizer)
    model, tokenizer = models.loaded()
    cache = cb_config(cfg, model.device)
    context = context_tokens(model, cache)
    policy = Policy(served=cfg.served, temperature=cfg.temperature, top_p=cfg.top_p,
                    max_tokens=min(cfg.max_tokens, context - 1), context=context)
    generation = GenerationState(continuous_batching=cfg.batching, cb_config=cache)
    if cfg.batching:  # started now, with the server's sampling (transformers starts it at the first request)
        first = copy.deepcopy(model.generation_config)
        first.use_cache = False  # continuous batching keeps its own paged cache
        generation.get_manager(models.process_model_name(cfg.served), use_cb=True).init_cb(model, first)
    chat_count, text_count = _counters(tokenizer)
    app = build_server(models, GlydChat(models, generation, policy, chat_count),
                       completion_handler=GlydCompletion(models, generation, policy, text_count),
                       response_handler=None, transcription_handler=None, generation_state=generation)
    app.router.routes = [r for r in app.router.routes if not isinstance(r, APIRoute) or r.path in KEPT_ROUTES]
    _errors(app)
    _unique_ids(app)
    state = ServeState(models=models, generation=generation, policy=policy, info=model_info(model, cfg, policy))

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page()

    @app.get("/glyd/model")
    def describe() -> JSONResponse:
        return JSONResponse(state.info)

    log.info("glyd serve: %s (%s, %d bytes of weights, KV cache %s, %s batching)", show_path(cfg.served),
             state.info["layout"], state.info["weight_bytes"], state.info["kv"], state.info["batching"])
    return app, state
