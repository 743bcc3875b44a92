"""The official `openai` Python client against den's OpenAI-compatible ingress.

Environment:
  DEN_TEST_BASE_URL       the ingress, e.g. http://127.0.0.1:8080/v1 (required)
  DEN_TEST_MODEL          a served model id (default: the first one /v1/models lists)
  DEN_TEST_API_KEY        the router's token, when it has one (default: "unused")
  DEN_TEST_EXPECT_CACHED  "1" (default): a repeated long prompt must report cached tokens
  DEN_TEST_FLAKY_MODEL    optional: a model whose streams fail after the first token

Run by agent/tests/ingress_openai_client.rs against the ingress over an in-process fake
router, and usable as-is against a real router. Prints one line per check and exits
non-zero if any failed.
"""

import os
import sys
import traceback

import openai
from openai import OpenAI

BASE_URL = os.environ["DEN_TEST_BASE_URL"]
API_KEY = os.environ.get("DEN_TEST_API_KEY") or "unused"
EXPECT_CACHED = os.environ.get("DEN_TEST_EXPECT_CACHED", "1") == "1"
FLAKY = os.environ.get("DEN_TEST_FLAKY_MODEL")

client = OpenAI(base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=60)
MODEL = os.environ.get("DEN_TEST_MODEL") or client.models.list().data[0].id
MESSAGES = [
    {"role": "system", "content": "you answer about the cache"},
    {"role": "user", "content": "what is a page in the cache"},
]

failures = []


def check(fn):
    try:
        fn()
        print(f"ok   {fn.__name__}")
    except Exception:  # noqa: BLE001 - report every failure, keep going
        failures.append(fn.__name__)
        print(f"FAIL {fn.__name__}")
        traceback.print_exc(file=sys.stdout)
    return fn


def collect_chat(**kw):
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


@check
def models_are_listed_and_retrievable():
    ids = [m.id for m in client.models.list().data]
    assert MODEL in ids, ids
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model" and m.owned_by == "den", m


@check
def chat_not_streamed():
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    assert r.object == "chat.completion", r
    assert r.id.startswith("chatcmpl-"), r.id
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str) and c.message.content, c
    assert c.finish_reason == "length", c.finish_reason
    u = r.usage
    assert u.completion_tokens == 8, u
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    assert isinstance(u.prompt_tokens_details.cached_tokens, int), u


@check
def chat_streamed_with_usage_matches_not_streamed():
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=24)
    chunks, text = collect_chat(max_completion_tokens=24, stream_options={"include_usage": True})
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text == plain.choices[0].message.content, (text, plain.choices[0].message.content)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"], finish
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None, last
    assert last.usage.completion_tokens == 24, last.usage
    assert last.usage.prompt_tokens == plain.usage.prompt_tokens
    assert isinstance(last.usage.prompt_tokens_details.cached_tokens, int)
    assert all(c.usage is None for c in chunks[:-1])


@check
def chat_streamed_without_usage():
    chunks, text = collect_chat(max_tokens=5)
    assert text
    assert all(c.usage is None for c in chunks), chunks[-1]


@check
def completions_streamed_and_not_streamed_agree():
    prompt = "the cache of the page"
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16)
    assert plain.object == "text_completion" and plain.id.startswith("cmpl-"), plain
    assert plain.choices[0].finish_reason == "length"
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=16, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text, (text, plain.choices[0].text)
    assert chunks[-1].usage.completion_tokens == 16


@check
def cached_tokens_are_reported_for_a_repeated_prompt():
    prompt = " ".join(["the worker and the router share the page of the cache"] * 30)
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert isinstance(cached, int) and 0 <= cached <= second.usage.prompt_tokens, second.usage
    assert first.usage.prompt_tokens == second.usage.prompt_tokens
    if EXPECT_CACHED:
        assert cached > 0, second.usage


@check
def unknown_model_raises_not_found():
    try:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    except openai.NotFoundError as e:
        assert e.status_code == 404
        assert e.code == "model_not_found", e.body
        assert "no-such-model" in e.message
    else:
        raise AssertionError("expected NotFoundError")


@check
def bad_requests_raise_bad_request():
    cases = [
        ({"messages": MESSAGES, "n": 2}, "n"),
        ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": MESSAGES, "temperature": 5}, "temperature"),
    ]
    for kw, param in cases:
        try:
            client.chat.completions.create(model=MODEL, **kw)
        except openai.BadRequestError as e:
            assert e.status_code == 400
            assert e.param == param, (param, e.body)
            assert param in e.message, e.message
        else:
            raise AssertionError(f"expected BadRequestError for {kw}")


if FLAKY:

    @check
    def error_after_the_first_token_raises_during_the_stream():
        seen = []
        try:
            for c in client.chat.completions.create(model=FLAKY, messages=MESSAGES, max_tokens=10, stream=True):
                seen.append(c)
        except openai.APIError as e:
            assert "streamed token" in e.message, e.message
        else:
            raise AssertionError("expected APIError from the error frame")
        assert len(seen) >= 2, seen  # the role chunk and at least one delta arrived first


if failures:
    print(f"{len(failures)} check(s) failed: {', '.join(failures)}")
    sys.exit(1)
print("all checks passed")
