"""What ``glyd serve`` accepts in a request body, checked before transformers' handlers see it.

transformers' serving handlers take many OpenAI fields, but under continuous batching only the
first request's sampling settings count and ``stop``, ``logit_bias`` or a penalty are dropped: a
request would get an answer it did not ask for. ``glyd serve`` fixes the sampling when it starts
(``--temperature``, ``--top-p``) and refuses, with a 4xx and one line naming the field, what it
cannot honour. A request without ``max_tokens`` gets the server's default, and a prompt that
would not fit the model's context (or the KV cache) is refused before it is queued.

>>> from glyd.apps.serve_requests import Policy, RequestError, check_completion
>>> policy = Policy(served="m", temperature=0.0, top_p=1.0, max_tokens=16, context=64)
>>> check_completion({"model": "m", "prompt": "hi"}, policy, prompt_tokens=lambda b: 2)["max_tokens"]
16
>>> try:
...     check_completion({"model": "m", "prompt": "hi", "best_of": 2}, policy, prompt_tokens=lambda b: 2)
... except RequestError as e:
...     print(e.status, e)
400 field 'best_of' is not supported by glyd serve (supported: max_tokens, model, n, prompt, stream, stream_options, temperature, top_p, user)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from glyd.errors import GlydError

#: Fields of a /v1/chat/completions body that glyd serve honours (``user`` is only a label).
CHAT_FIELDS = frozenset({"model", "messages", "stream", "max_tokens", "max_completion_tokens", "temperature",
                         "top_p", "n", "stream_options", "user"})
#: Fields of a /v1/completions body that glyd serve honours.
COMPLETION_FIELDS = frozenset({"model", "prompt", "stream", "max_tokens", "temperature", "top_p", "n",
                               "stream_options", "user"})
def _is_zero(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0)


#: Fields glyd serve does not honour, with the values that ask for nothing (clients send them as
#: defaults: null, false, 0, empty): such a value is taken and dropped, any other refused by name.
NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "stop": lambda v: v is None or v == [],
    "logprobs": lambda v: v is None or v is False,
    "top_logprobs": _is_zero,
    "frequency_penalty": _is_zero,
    "presence_penalty": _is_zero,
    "logit_bias": lambda v: v is None or v == {},
    "seed": lambda v: v is None,
    "tools": lambda v: v is None or v == [],
    "tool_choice": lambda v: v is None or v == "none",
    "response_format": lambda v: v is None or v == {"type": "text"},
    "echo": lambda v: v is None or v is False,
    "best_of": lambda v: v is None or (type(v) is int and v == 1),
    "suffix": lambda v: v is None,
}

#: Roles a chat message may have.
ROLES = frozenset({"system", "developer", "user", "assistant"})


class RequestError(GlydError):
    """A request the server refuses: ``status`` is the HTTP status, ``param`` the field at fault."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The error as OpenAI's API spells it (what the ``openai`` client reads)."""
        return {"error": {"message": str(self), "type": "invalid_request_error", "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class Policy:
    """The server's fixed settings that every request is checked against.

    ``served``: the model name requests must use; ``temperature`` 0 means greedy; ``max_tokens``: the
    default for a request without one; ``context``: prompt plus new tokens may not exceed it.
    """

    served: str
    temperature: float
    top_p: float
    max_tokens: int
    context: int

    def __post_init__(self) -> None:
        if not self.served:
            raise ValueError("served model name must not be empty")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1 or self.context < 2:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be >= 1 and context ({self.context}) >= 2")


def _number(body: dict[str, Any], key: str) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise RequestError(f"{key} must be a number, got {v!r}", param=key)
    return float(v)


def _surrogate(text: str) -> int | None:
    """Where ``text`` holds a lone surrogate (JSON may spell one, ``"\\ud800"``; it is no Unicode text), else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _check_text(body: dict[str, Any]) -> None:
    """Refuse a string anywhere in ``body`` (a value or a field name) that holds a lone surrogate: the
    tokenizer raises TypeError on one and the JSON encoder of an error naming it UnicodeEncodeError.
    Walked without recursion (a body may nest as deep as the JSON parser takes)."""
    todo: list[tuple[str, Any]] = [("", body)]
    while todo:
        path, v = todo.pop()
        if isinstance(v, dict):
            for k, item in v.items():
                at = _surrogate(k) if isinstance(k, str) else None
                if at is not None:
                    where = f"a field name in {path}" if path else "a field name"
                    raise RequestError(f"{where} holds a lone surrogate (U+{ord(k[at]):04X} at index {at}): not "
                                       f"Unicode text", param=path.split(".")[0].split("[")[0] or None)
                todo.append((f"{path}.{k}" if path else k, item))
        elif isinstance(v, list):
            todo.extend((f"{path}[{i}]", item) for i, item in enumerate(v))
        elif isinstance(v, str) and (at := _surrogate(v)) is not None:
            raise RequestError(f"{path} holds a lone surrogate (U+{ord(v[at]):04X} at index {at}): not Unicode text",
                               param=path.split(".")[0].split("[")[0])


def _common(body: Any, allowed: frozenset[str], policy: Policy) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    _check_text(body)
    extra = sorted(k for k in set(body) - allowed if not (k in NEUTRAL and NEUTRAL[k](body[k])))
    if extra:
        raise RequestError(f"field {extra[0]!r} is not supported by glyd serve (supported: "
                           f"{', '.join(sorted(allowed - {'max_completion_tokens'}))})", param=extra[0])
    body = {k: v for k, v in body.items() if k in allowed}  # the neutral values dropped
    model = body.get("model")
    if model is not None and model != policy.served:
        raise RequestError(f"model {model!r} is not served here; this server serves {policy.served!r}",
                           status=404, param="model", code="model_not_found")
    body["model"] = policy.served
    if "stream" in body and not isinstance(body["stream"], bool):
        raise RequestError(f"stream must be true or false, got {body['stream']!r}", param="stream")
    n = body.pop("n", None)
    if n is not None and (isinstance(n, bool) or n != 1):  # True == 1 in Python, not in JSON
        raise RequestError(f"n must be 1 (glyd serve returns one choice a request), got {n!r}", param="n")
    user = body.pop("user", None)
    if user is not None and not isinstance(user, str):
        raise RequestError(f"user must be a string, got {user!r}", param="user")
    _check_stream_options(body)
    _check_sampling(body, policy)
    return body


def _check_stream_options(body: dict[str, Any]) -> None:
    """OpenAI's rule: ``stream_options`` (only ``include_usage``, a boolean) goes with ``stream: true``."""
    opts = body.get("stream_options")
    if opts is None:
        return
    if not isinstance(opts, dict):
        raise RequestError(f"stream_options must be an object, got {opts!r}", param="stream_options")
    if body.get("stream") is not True:
        raise RequestError("stream_options is allowed only with stream: true", param="stream_options")
    extra = sorted(set(opts) - {"include_usage"})
    if extra:
        raise RequestError(f"stream_options: field {extra[0]!r} is not supported by glyd serve (supported: "
                           f"include_usage)", param="stream_options")
    if not isinstance(opts.get("include_usage", False), bool):
        raise RequestError(f"stream_options.include_usage must be true or false, got {opts['include_usage']!r}",
                           param="stream_options")


def _check_sampling(body: dict[str, Any], policy: Policy) -> None:
    t, p = _number(body, "temperature"), _number(body, "top_p")
    if t is not None and t < 0:
        raise RequestError(f"temperature must be >= 0, got {body['temperature']!r}", param="temperature")
    if p is not None and not 0 < p <= 1:
        raise RequestError(f"top_p must be in (0, 1], got {body['top_p']!r}", param="top_p")
    greedy = policy.temperature == 0
    if t is not None and t != policy.temperature and not (greedy and t == 0):
        raise RequestError(f"temperature {t:g} differs from this server's {policy.temperature:g}: requests share one "
                           f"sampling setting (start glyd serve with --temperature {t:g} to change it)",
                           param="temperature")
    if p is not None and p != policy.top_p and not greedy:
        raise RequestError(f"top_p {p:g} differs from this server's {policy.top_p:g} (start glyd serve with "
                           f"--top-p {p:g} to change it)", param="top_p")
    # What the handlers apply is the server's own setting, never the request's.
    body.pop("temperature", None)
    body.pop("top_p", None)


def _max_tokens(body: dict[str, Any], policy: Policy, prompt_len: int, key: str = "max_tokens",
                prompt_key: str = "prompt") -> None:
    if prompt_len < 1:
        raise RequestError("the prompt is empty: give at least one token to continue", param="prompt")
    if prompt_len >= policy.context:  # the prompt's fault whatever max_tokens says (or when none was sent)
        raise RequestError(f"the prompt ({prompt_len} tokens) does not fit this server's context of {policy.context} "
                           f"tokens with at least one new token", param=prompt_key, code="context_length_exceeded")
    v = body.get(key)
    if v is None:
        v = policy.max_tokens
    elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise RequestError(f"{key} must be a whole number >= 1, got {v!r}", param=key)
    if prompt_len + v > policy.context:
        if body.get(key) is None:
            v = policy.context - prompt_len  # the default shrinks to what fits; an explicit value is refused
        else:
            raise RequestError(f"the prompt ({prompt_len} tokens) plus {key} ({v}) is {prompt_len + v} tokens, more "
                               f"than this server's context of {policy.context} tokens", param=key,
                               code="context_length_exceeded")
    body.pop(key, None)
    body["max_tokens"] = v


def check_chat(body: Any, policy: Policy, prompt_tokens: Callable[[dict[str, Any]], int]) -> dict[str, Any]:
    """A /v1/chat/completions body checked and normalised (raises :class:`RequestError`).

    ``prompt_tokens(body)`` counts the tokens of the templated prompt (it may raise RequestError)."""
    body = _common(body, CHAT_FIELDS, policy)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise RequestError(f"{where}.role must be one of {', '.join(sorted(ROLES))}, got {role!r}", param=where)
        extra = sorted(set(m) - {"role", "content"})  # "name" too: the chat templates would drop it
        if extra:
            raise RequestError(f"{where}: field {extra[0]!r} is not supported by glyd serve", param=where)
        content = m.get("content")
        parts = content if isinstance(content, list) else None
        ok = isinstance(content, str) or (parts is not None and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in parts))
        if not ok:
            raise RequestError(f"{where}.content must be a string or a list of text parts", param=where)
    if body.get("max_completion_tokens") is not None:
        if body.get("max_tokens") is not None:
            raise RequestError("give max_tokens or max_completion_tokens, not both", param="max_completion_tokens")
        _max_tokens(body, policy, prompt_tokens(body), key="max_completion_tokens", prompt_key="messages")
    else:  # a null max_completion_tokens is an absent one (OpenAI's clients send it so)
        body.pop("max_completion_tokens", None)
        _max_tokens(body, policy, prompt_tokens(body), prompt_key="messages")
    return body


def check_completion(body: Any, policy: Policy, prompt_tokens: Callable[[dict[str, Any]], int]) -> dict[str, Any]:
    """A /v1/completions body checked and normalised (raises :class:`RequestError`)."""
    body = _common(body, COMPLETION_FIELDS, policy)
    if not isinstance(body.get("prompt"), str):
        raise RequestError(f"prompt must be a string, got {type(body.get('prompt')).__name__}", param="prompt")
    _max_tokens(body, policy, prompt_tokens(body))
    return body
