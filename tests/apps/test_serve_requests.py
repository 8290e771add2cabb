"""What ``glyd serve`` accepts in a request body (:mod:`glyd.apps.serve_requests`), without a server."""

from __future__ import annotations

import pytest

from glyd.apps.serve_requests import Policy, RequestError, check_chat, check_completion

POLICY = Policy(served="m", temperature=0.0, top_p=1.0, max_tokens=16, context=64)
MSGS = [{"role": "user", "content": "hi"}]


def _chat(prompt_len: int = 5, **fields):
    return check_chat({"model": "m", "messages": MSGS, **fields}, POLICY, prompt_tokens=lambda b: prompt_len)


def _refused(call, *args, **kwargs) -> RequestError:
    with pytest.raises(RequestError) as info:
        call(*args, **kwargs)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("fields, param, words", [
    (dict(n=True), "n", "n must be 1"),
    (dict(user=5), "user", "user must be a string"),
    (dict(stream_options={"include_usage": True}), "stream_options", "only with stream"),
    (dict(stream=False, stream_options={"include_usage": True}), "stream_options", "only with stream"),
    (dict(stream=True, stream_options={"include_usage": "yes"}), "stream_options", "include_usage must be"),
    (dict(stream=True, stream_options={"bogus": 1}), "stream_options", "'bogus' is not supported"),
])
def test_wrongly_typed_fields_are_refused_not_taken(fields, param, words):
    err = _refused(_chat, **fields)
    assert err.param == param and words in str(err)


def test_well_typed_fields_pass():
    body = _chat(n=1, user="alice", stream=True, stream_options={"include_usage": True})
    assert body["max_tokens"] == 16 and "n" not in body and "user" not in body


def test_max_tokens_with_a_null_max_completion_tokens_is_taken():
    assert _chat(max_tokens=3, max_completion_tokens=None)["max_tokens"] == 3
    assert _chat(max_tokens=None, max_completion_tokens=4)["max_tokens"] == 4
    assert "both" in str(_refused(_chat, max_tokens=3, max_completion_tokens=4))


def test_a_prompt_longer_than_the_context_is_blamed_on_the_prompt_not_a_max_tokens_never_sent():
    err = _refused(_chat, prompt_len=80)
    assert err.param == "messages" and err.code == "context_length_exceeded"
    assert "the prompt (80 tokens) does not fit this server's context of 64 tokens" in str(err)
    assert "max_tokens" not in str(err)
    err = _refused(check_completion, {"prompt": "x"}, POLICY, prompt_tokens=lambda b: 64)
    assert err.param == "prompt" and "does not fit" in str(err)
    err = _refused(_chat, prompt_len=60, max_tokens=10)  # an explicit max_tokens that does not fit: its fault
    assert err.param == "max_tokens" and "plus max_tokens (10)" in str(err)


@pytest.mark.parametrize("fields", [
    dict(stop=None), dict(stop=[]), dict(logprobs=False), dict(logprobs=None), dict(top_logprobs=None),
    dict(frequency_penalty=0), dict(presence_penalty=0.0), dict(logit_bias={}), dict(seed=None),
    dict(tools=[]), dict(tool_choice="none"), dict(response_format={"type": "text"}),
    dict(stop=None, logprobs=False, frequency_penalty=0, presence_penalty=0, logit_bias=None),
])
def test_neutral_values_of_unhonoured_fields_are_taken_and_dropped(fields):
    # clients send such defaults (null, false, 0, an empty list): the answer is the one they asked for
    body = _chat(**fields)
    assert not set(fields) & set(body) and body["max_tokens"] == 16


@pytest.mark.parametrize("fields, param", [
    (dict(stop=["\n"]), "stop"), (dict(stop=""), "stop"), (dict(logprobs=True), "logprobs"),
    (dict(frequency_penalty=0.5), "frequency_penalty"), (dict(presence_penalty=False), "presence_penalty"),
    (dict(logit_bias={"1": 5}), "logit_bias"), (dict(seed=3), "seed"), (dict(top_logprobs=2), "top_logprobs"),
    (dict(tools=[{"type": "function"}]), "tools"), (dict(response_format={"type": "json_object"}), "response_format"),
])
def test_values_that_would_change_the_answer_stay_refused(fields, param):
    err = _refused(_chat, **fields)
    assert err.param == param and "not supported" in str(err)


def test_completions_take_neutral_echo_and_best_of():
    body = check_completion({"model": "m", "prompt": "hi", "echo": False, "best_of": 1, "suffix": None},
                            POLICY, prompt_tokens=lambda b: 2)
    assert not {"echo", "best_of", "suffix"} & set(body)
    with pytest.raises(RequestError, match="'best_of' is not supported"):
        check_completion({"model": "m", "prompt": "hi", "best_of": 2}, POLICY, prompt_tokens=lambda b: 2)
