"""``glyd serve`` against a hostile or careless client: bodies that once got a 500 and a traceback.

Each bad request must get a 4xx in OpenAI's error shape with one line naming the problem, and the
server must answer a good request afterwards with the same (greedy) tokens as before.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from glyd.apps.serve import ServeConfig, Server  # noqa: E402
from glyd.apps.serve_requests import Policy, RequestError, check_chat, check_completion  # noqa: E402
from glyd.store import pack_folder  # noqa: E402
from serve_model import build_chat_model  # noqa: E402

GOOD = {"model": "tiny", "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 8}
POLICY = Policy(served="tiny", temperature=0.0, top_p=1.0, max_tokens=8, context=256)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    pack_folder(build_chat_model(root / "bf16"), root / "packed", layout="fixed12", progress=False)
    with Server(ServeConfig(str(root / "packed"), name="tiny", device="cpu", port=0, max_tokens=8,
                            progress=False)) as srv:
        yield srv


def _post(server, path: str, body: bytes) -> httpx.Response:
    # a fresh connection each time: a 500 makes uvicorn drop the connection it came on
    return httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=60)


def _answer(server) -> str:
    r = httpx.post(server.url + "/v1/chat/completions", json=GOOD, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("path, body, words", [
    # a role that is a list or an object: "role not in ROLES" raised TypeError (unhashable): a 500
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": ["user"], "content": "hi"}]}',
     "messages[0].role must be one of assistant, developer, system, user, got ['user']"),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": {"a": 1}, "content": "hi"}]}',
     "messages[0].role must be one of"),
    # JSON may spell a lone surrogate (\ud800), which is no Unicode text: the tokenizer raised TypeError (a 500)
    ("/v1/completions", b'{"model": "tiny", "prompt": "a\\ud800b"}',
     "prompt holds a lone surrogate (U+D800 at index 1): not Unicode text"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "\\udfff", "stream": true}',
     "prompt holds a lone surrogate (U+DFFF at index 0)"),
    # ... and in chat it was called the chat template's refusal, with the tokenizer's TypeError
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "x\\udc00"}]}',
     "messages[0].content holds a lone surrogate (U+DC00 at index 1)"),
    ("/v1/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
     "messages[0].content[0].text holds a lone surrogate (U+D83D at index 0)"),
    # an unknown field named with one: its name went into the error's "param" and the JSON encoder raised (a 500)
    ("/v1/completions", b'{"model": "tiny", "prompt": "hi", "\\ud800": 1}', "a field name holds a lone surrogate"),
])
def test_hostile_body_gets_400_naming_the_problem_and_the_server_answers_as_before(server, path, body, words):
    before = _answer(server)
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"] and "\n" not in err["message"]
    assert err["type"] == "invalid_request_error"
    assert _answer(server) == before


def test_a_paired_surrogate_is_text_and_answered(server):
    r = _post(server, "/v1/completions", b'{"model": "tiny", "prompt": "\\ud83d\\ude42", "max_tokens": 3}')
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3


def test_deeply_nested_body_is_checked_without_recursion():
    # the surrogate check walks the body; a nesting as deep as JSON parsers take must not raise RecursionError
    deep: object = "ok\ud800"
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(RequestError, match="lone surrogate"):
        check_completion({"model": "tiny", "prompt": "hi", "extra": deep}, POLICY, prompt_tokens=len)
    clean: object = "ok"
    for _ in range(5000):
        clean = {"k": clean}
    with pytest.raises(RequestError, match="field 'extra' is not supported"):
        check_completion({"model": "tiny", "prompt": "hi", "extra": clean}, POLICY, prompt_tokens=len)


@pytest.mark.parametrize("role", [["user"], {"a": 1}, 1, None])
def test_check_chat_refuses_any_role_that_is_not_a_known_string(role):
    with pytest.raises(RequestError) as info:
        check_chat({"model": "tiny", "messages": [{"role": role, "content": "hi"}]}, POLICY, prompt_tokens=lambda b: 3)
    assert info.value.status == 400 and info.value.param == "messages[0]"
