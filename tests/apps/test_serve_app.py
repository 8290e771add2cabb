"""The pieces of ``glyd serve``'s app (:mod:`glyd.apps.serve_app`) that need no server."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("transformers")

from glyd.apps.serve_app import _counters  # noqa: E402
from glyd.apps.serve_requests import RequestError  # noqa: E402
from serve_model import build_tokenizer  # noqa: E402

#: Qwen2.5's template in small: it renders system (first only), user and assistant messages and
#: nothing else, so a "developer" message (OpenAI's new name for system) vanishes from the prompt.
ONLY_KNOWN_ROLES = ("{% for m in messages %}{% if m['role'] in ['system', 'user', 'assistant'] %}<|im_start|>"
                    "{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endif %}{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _count(template: str, messages: list[dict]) -> int:
    tok = build_tokenizer()
    tok.chat_template = template
    chat, _ = _counters(tok)
    return chat({"messages": messages})


def test_a_message_the_chat_template_leaves_out_is_refused_not_dropped():
    # the request got a 200 answered as if the developer message had never been sent
    msgs = [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]
    with pytest.raises(RequestError) as info:
        _count(ONLY_KNOWN_ROLES, msgs)
    assert info.value.status == 400 and info.value.param == "messages[0]"
    assert "messages[0] (developer) is left out of the prompt by this model's chat template" in str(info.value)


def test_messages_the_template_renders_are_counted():
    msgs = [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": ""}, {"role": "user", "content": "Why?"}]
    tok = build_tokenizer()
    tok.chat_template = ONLY_KNOWN_ROLES
    plain = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else "Hi"} for m in msgs]
    expected = len(tok.apply_chat_template(plain, add_generation_prompt=True, return_dict=True)["input_ids"])
    assert _count(ONLY_KNOWN_ROLES, msgs) == expected
