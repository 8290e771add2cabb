"""``glyd serve``: an OpenAI-compatible server on the loopback address, driven by the ``openai`` client.

A tiny random chat model (``serve_model.py``: one character a token, so equal text is equal tokens),
packed with ``glyd pack``; the server answers chat and text completions, streaming and not, several
at once, with the tokens ``generate()`` gives greedily on the same folder; bad requests get a 4xx
naming the field; a client that goes away cancels its request.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

import glyd  # noqa: E402
from glyd.apps.serve import ServeConfig, Server  # noqa: E402
from glyd.store import pack_folder  # noqa: E402
from serve_model import build_chat_model  # noqa: E402

MAX = 12


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    bf16 = build_chat_model(root / "bf16")
    pack_folder(bf16, root / "packed", layout="fixed12", progress=False)
    return bf16, root / "packed"


@pytest.fixture(scope="module")
def server(folders):
    srv = Server(ServeConfig(str(folders[1]), name="tiny", device="cpu", port=0, max_tokens=MAX,
                             progress=False)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(folders):
    """What generate() answers greedily on the packed folder (and on the bf16 one: the same bits)."""
    tok = transformers.AutoTokenizer.from_pretrained(folders[1])
    model = glyd.from_pretrained(folders[1], device="cpu", progress=False)
    cache = {}

    def answer(messages=None, prompt=None, max_new=MAX):
        key = (json.dumps(messages), prompt, max_new)
        if key not in cache:
            if messages is not None:
                ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
            else:
                ids = tok(prompt)["input_ids"]
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False)[0, len(ids):]
            cache[key] = tok.decode(out, skip_special_tokens=True), len(ids), len(out)
        return cache[key]

    return answer


def _chat(text):
    return [{"role": "user", "content": text}]


def test_chat_answers_as_generate(client, reference):
    msgs = _chat("Hi there")
    r = client.chat.completions.create(model="tiny", messages=msgs)
    text, n_prompt, n_new = reference(msgs)
    assert r.choices[0].message.content == text and len(text) == n_new == MAX  # one character a token
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, n_new)
    assert r.choices[0].finish_reason == "length" and r.model == "tiny"


def test_chat_streams_as_generate(client, reference):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Why?"}]}]
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, stream=True, max_tokens=7))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 2  # streamed, not one block
    ref_msgs = [msgs[0], {"role": "user", "content": "Why?"}]
    assert "".join(pieces) == reference(ref_msgs, max_new=7)[0]
    assert chunks[-1].usage.completion_tokens == 7 and chunks[-1].choices[0].finish_reason == "length"


def test_text_completion_and_model_list(client, reference):
    r = client.completions.create(model="tiny", prompt="The sea is", max_tokens=5)
    assert r.choices[0].text == reference(prompt="The sea is", max_new=5)[0]
    s = "".join(c.choices[0].text for c in client.completions.create(model="tiny", prompt="The sea is", max_tokens=5,
                                                                      stream=True) if c.choices)
    assert s == r.choices[0].text
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_every_answer_names_the_model_as_listed_and_the_name_is_taken_back(client):
    # answers named it "tiny@main" (transformers' canonical id), which the server then refused with a 404
    name, = (m.id for m in client.models.list())
    msgs, opts = _chat("Hi there"), {"max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    chat = client.chat.completions.create(model=name, messages=msgs, max_tokens=3)
    chat_chunks = list(client.chat.completions.create(model=name, messages=msgs, **opts))
    text = client.completions.create(model=name, prompt="The sea is", max_tokens=3)
    text_chunks = list(client.completions.create(model=name, prompt="The sea is", **opts))
    assert chat_chunks[-1].usage is not None and text_chunks[-1].usage is not None  # the usage chunks are named too
    named = [chat.model, text.model] + [c.model for c in chat_chunks + text_chunks]
    assert len(named) > 4 and set(named) == {name} == {"tiny"}
    again = client.chat.completions.with_raw_response.create(model=chat.model, messages=msgs, max_tokens=3)
    assert again.status_code == 200 and again.parse().choices[0].message.content == chat.choices[0].message.content
    again = client.completions.with_raw_response.create(model=text_chunks[0].model, prompt="The sea is", max_tokens=3)
    assert again.status_code == 200 and again.parse().choices[0].text == text.choices[0].text


def test_a_served_name_transformers_would_split_is_one_model_under_one_key(folders):
    # transformers takes a ":<file>.gguf" tail off a requested name: the served model is loaded, and its
    # generation manager keyed, under one id all the same, the served name, which answers carry
    from transformers.cli.serving.utils import BaseHandler, GenerationState

    from glyd.apps.serve_app import GlydModels

    cfg = ServeConfig(str(folders[1]), name="tiny:q4.gguf", device="cpu", port=0, max_tokens=MAX, progress=False)
    models = GlydModels(cfg)
    model, tok = models.loaded()
    assert len(models.loaded_models) == 1 and models.process_model_name(cfg.served) == "tiny:q4.gguf"
    model_id, got, _ = BaseHandler(models, GenerationState())._resolve_model({"model": cfg.served})
    assert (model_id, got) == ("tiny:q4.gguf", model) and len(models.loaded_models) == 1
    assert models.process_model_name("other") == "other@main"  # any other name as transformers has it


def test_concurrent_requests_answer_as_generate_alone(client, reference):
    # Every request sends the same x-request-id: the batch tells them apart all the same.
    client = client.with_options(default_headers={"x-request-id": "same-for-all"})
    prompts = [f"question {i}: {'why ' * i}?" for i in range(6)]
    got: dict[int, str] = {}
    errors: list[BaseException] = []

    def ask(i: int) -> None:
        try:
            if i % 2:
                stream = client.chat.completions.create(model="tiny", messages=_chat(prompts[i]), stream=True,
                                                        max_tokens=10)
                got[i] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            else:
                got[i] = client.chat.completions.create(model="tiny", messages=_chat(prompts[i]),
                                                        max_tokens=10).choices[0].message.content
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert got == {i: reference(_chat(p), max_new=10)[0] for i, p in enumerate(prompts)}


@pytest.mark.parametrize("kwargs, status, words", [
    (dict(messages=[]), 400, "messages must be a non-empty list"),
    (dict(messages=[{"role": "robot", "content": "hi"}]), 400, "messages[0].role must be one of"),
    (dict(messages=[{"role": "user", "content": "hi", "name": "bob"}]), 400, "messages[0]: field 'name' is not"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
     "messages[0].content must be a string or a list of text parts"),
    (dict(messages=_chat("hi"), max_tokens=0), 400, "max_tokens must be a whole number >= 1"),
    (dict(messages=_chat("hi"), max_tokens=10_000), 400, "more than this server's context of 256 tokens"),
    (dict(messages=_chat("hi"), temperature=0.7), 400, "temperature 0.7 differs from this server's 0"),
    (dict(messages=_chat("hi"), n=2), 400, "n must be 1"),
    (dict(messages=_chat("hi"), stop=["x"]), 400, "field 'stop' is not supported by glyd serve"),
    (dict(messages=_chat("hi"), model="gpt-4"), 404, "model 'gpt-4' is not served here; this server serves 'tiny'"),
    (dict(messages=_chat("hi"), model="tiny@main"), 404, "model 'tiny@main' is not served here"),  # one name only
])
def test_bad_request_gets_4xx_naming_the_problem(client, kwargs, status, words):
    kwargs = {"model": "tiny", **kwargs}
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**kwargs)
    assert info.value.status_code == status
    assert words in info.value.message
    assert info.value.body["type"] == "invalid_request_error"


def test_malformed_bodies_get_400(server):
    import httpx

    r = httpx.post(server.url + "/v1/chat/completions", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "must be a JSON object" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": ""})
    assert r.status_code == 400 and "prompt is empty" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/load_model", json={"model": "gpt2"})  # transformers' route, not kept
    assert r.status_code in (404, 405)


def _active(server) -> int:
    manager = server.state.generation._cb_manager
    sched = manager.scheduler
    # a request the server took but the scheduler's loop has not picked up yet sits in the input queue
    return len(sched.active_requests) + len(sched.waiting_requests) + manager._cb.input_queue.qsize()


def test_client_that_disconnects_cancels_its_request(server, client, reference, monkeypatch):
    import httpx

    manager = server.state.generation._cb_manager._cb
    cancelled: list[str] = []
    cancel = manager.cancel_request
    monkeypatch.setattr(manager, "cancel_request", lambda rid: (cancelled.append(rid), cancel(rid)))
    # the generation steps after the first wait until the client has gone: on a slow runner the tiny model
    # could otherwise write all 200 tokens before the client reads its first line
    from transformers.generation.continuous_batching.continuous_api import ContinuousBatchProcessor

    release, calls, step = threading.Event(), [], ContinuousBatchProcessor._generation_step

    def gated(self, model):
        calls.append(1)
        if len(calls) > 1:
            release.wait(30)
        return step(self, model)

    monkeypatch.setattr(ContinuousBatchProcessor, "_generation_step", gated)
    body = {"model": "tiny", "messages": _chat("a long answer please"), "stream": True, "max_tokens": 200}
    try:
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", server.url + "/v1/chat/completions", json=body,
                             headers={"x-request-id": "goes-away"}) as resp:
                assert resp.status_code == 200
                lines = resp.iter_lines()
                while not next(lines).startswith('data: {"id"'):
                    pass
                # generating: its second step waits for the release, so it stays in the scheduler
                end = time.monotonic() + 10
                while _active(server) != 1 and time.monotonic() < end:
                    time.sleep(0.01)
                assert _active(server) == 1
            # the connection is closed with most of 200 tokens still to come
    finally:
        release.set()
    end = time.monotonic() + 30
    while _active(server) and time.monotonic() < end:
        time.sleep(0.05)
    assert len(cancelled) == 1 and cancelled[0].startswith("goes-away-") and _active(server) == 0
    # the server goes on answering
    r = client.chat.completions.create(model="tiny", messages=_chat("Hi there"))
    assert r.choices[0].message.content == reference(_chat("Hi there"))[0]


def test_model_description_and_page(server, folders):
    import httpx

    info = httpx.get(server.url + "/glyd/model").json()
    assert info["id"] == "tiny" and info["layout"] == "fixed12" and info["kv"] == "bf16"
    assert info["batching"] == "continuous" and info["context"] == 256 and info["max_tokens"] == MAX
    bf16 = sum(p.stat().st_size for p in folders[0].glob("*.safetensors"))
    assert info["weight_bytes"] < info["bf16_weight_bytes"] <= bf16
    assert 11.5 < info["bits_per_weight"] < 13
    html = httpx.get(server.url + "/").text
    assert "<title>glyd serve</title>" in html and "/v1/chat/completions" in html and "tokens/s" in html


def test_bf16_folder_packed_as_it_loads_with_lossless_kv(folders, reference):
    cfg = ServeConfig(str(folders[0]), layout="tiered", kv="lossless", device="cpu", port=0, max_tokens=MAX,
                      progress=False)
    with Server(cfg) as srv:
        assert srv.info["layout"] == "tiered" and srv.info["kv"] == "lossless"
        assert srv.info["batching"] == "one request at a time"
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        r = c.chat.completions.create(model=str(folders[0]), messages=_chat("Hi there"))
        s = c.chat.completions.create(model=str(folders[0]), messages=_chat("Hi there"), stream=True)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)
    assert r.choices[0].message.content == streamed == reference(_chat("Hi there"))[0]


@pytest.mark.parametrize("kwargs, words", [
    (dict(kv="lossy"), "kv must be one of"),
    (dict(port=70000), "port must be in"),
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(kv="lossless", num_blocks=8), "with kv (glyd's lossless cache) requests run one at a time"),
    (dict(block_size=2), "block_size must be >= 4"),
    (dict(cuda_graphs="yes"), "cuda_graphs must be True, False or None"),
    (dict(kv="lossless", cuda_graphs=True), "cuda_graphs is continuous batching's"),
])
def test_config_refuses_bad_values(kwargs, words):
    with pytest.raises(ValueError, match=None) as info:
        ServeConfig("model", **kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize("graphs", [None, True, False])
def test_cuda_graphs_reach_continuous_batching(graphs):
    from glyd.apps.serve_app import cb_config

    cfg = cb_config(ServeConfig("model", cuda_graphs=graphs), torch.device("cuda"))
    if graphs is None:  # transformers' own choice: nothing given
        assert cfg is None
    else:
        assert cfg.use_cuda_graph == graphs


@pytest.mark.gpu
def test_on_the_gpu_one_request_answers_as_generate_and_a_batch_completes(folders):
    # On the GPU glyd's kernels run; the product of a batch of tokens may take another kernel (and
    # another summation order) than generate()'s one-token steps, so only a lone request is compared
    # token for token; a concurrent batch must complete with every token asked for.
    tok = transformers.AutoTokenizer.from_pretrained(folders[1])
    model = glyd.from_pretrained(folders[1], device="cuda", progress=False)
    ids = tok.apply_chat_template(_chat("Hi there"), add_generation_prompt=True, return_dict=True)["input_ids"]
    out = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=MAX, do_sample=False)[0, len(ids):]
    with Server(ServeConfig(str(folders[1]), name="tiny", device="cuda", port=0, max_tokens=MAX,
                            progress=False)) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert c.chat.completions.create(model="tiny", messages=_chat("Hi there")).choices[0].message.content == \
            tok.decode(out, skip_special_tokens=True)
        done: list = []

        def ask(i: int) -> None:
            r = c.completions.create(model="tiny", prompt=f"prompt {i}", max_tokens=MAX)
            done.append((r.usage.completion_tokens, r.choices[0].finish_reason))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert len(done) == 8 and all((n, why) == (MAX, "length") or (why == "stop" and n < MAX) for n, why in done)
