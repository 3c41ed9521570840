"""OpenAIBackend against a real loopback HTTP server (memgym.llm.server over HFBackend on the tiny model)."""
from __future__ import annotations

import logging
import random
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from memgym.llm.base import BackendRequestError, GenerationParams
from memgym.llm.hf_backend import HFBackend
from memgym.llm.openai_backend import OpenAIBackend, backoff_delay, request_settings
from memgym.llm.runtime import Runtime
from memgym.llm.server import serve_backend
from memgym.evolution.evaluation.eval_job import EvalConfig
from tests.helpers import FaultyServer, ScriptedBackend

BATCH = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Caroline adopted a dog named Max."}],
]
FAST = dict(backoff_base_s=0.01, backoff_max_s=0.02)


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    return HFBackend(tiny_model_dir)


@pytest.fixture
def serve(hf):
    servers = []

    def start(**kw):
        server, thread, url = serve_backend(hf, served_model_name="tiny", server_class=FaultyServer, **kw)
        servers.append(server)
        return server, url

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_roundtrip_equals_in_process_generation(serve, hf):
    server, url = serve()
    client = OpenAIBackend(url, "tiny", max_concurrency=3)
    greedy = GenerationParams(max_new_tokens=6)
    got = client.generate(BATCH, greedy)
    want = [hf.generate([m], greedy)[0] for m in BATCH]
    assert got == want
    assert [c.finish_reason for c in got] == ["length"] * 3 and got[0].prompt_tokens == 31
    assert (client.calls, client.attempts, client.retries, server.requests_total) == (3, 3, 0, 3)
    seeded = GenerationParams(max_new_tokens=5, temperature=1.0, top_p=0.9, seed=3)
    assert client.generate(BATCH[:1], seeded) == hf.generate(BATCH[:1], seeded)
    assert client.model_id == f"openai:{url}#tiny"


def test_retries_after_two_503s_then_succeeds(serve):
    server, url = serve(fail_first=2, fail_status=503)
    client = OpenAIBackend(url, "tiny", max_retries=5, **FAST)
    out = client.generate(BATCH[:1], GenerationParams(max_new_tokens=3))
    assert out[0].completion_tokens == 3
    assert (server.requests_total, client.attempts, client.retries, client.calls) == (3, 3, 2, 1)


def test_429_is_retried(serve):
    server, url = serve(fail_first=1, fail_status=429)
    client = OpenAIBackend(url, "tiny", **FAST)
    assert client.generate(BATCH[:1], GenerationParams(max_new_tokens=2))[0].completion_tokens == 2
    assert server.requests_total == 2


def test_400_is_not_retried(serve):
    server, url = serve(fail_first=1, fail_status=400)
    client = OpenAIBackend(url, "tiny", max_retries=5, **FAST)
    with pytest.raises(BackendRequestError, match=r"'tiny'.*1 attempt\(s\) \(not retryable\).*HTTP 400") as e:
        client.generate(BATCH[:1], GenerationParams(max_new_tokens=2))
    assert e.value.attempts == 1 and server.requests_total == 1 and client.calls == 0


def test_unknown_model_is_a_404_without_retry(serve):
    server, url = serve()
    client = OpenAIBackend(url, "not-served", **FAST)
    with pytest.raises(BackendRequestError, match="HTTP 404") as e:
        client.generate(BATCH[:1], GenerationParams(max_new_tokens=2))
    assert e.value.attempts == 1 and server.requests_total == 1


def test_retries_exhausted_raise_with_model_url_status_attempts(serve):
    server, url = serve(fail_first=100, fail_status=502)
    client = OpenAIBackend(url, "tiny", max_retries=2, **FAST)
    with pytest.raises(BackendRequestError) as e:
        client.generate(BATCH[:1], GenerationParams(max_new_tokens=2))
    msg = str(e.value)
    assert url in msg and "'tiny'" in msg and "HTTP 502" in msg and "3 attempt(s) (retries exhausted)" in msg
    assert e.value.attempts == 3 and server.requests_total == 3


def test_connection_refused_is_retried_then_fails():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    client = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "tiny", max_retries=2, **FAST)
    with pytest.raises(BackendRequestError, match="connection error") as e:
        client.generate(BATCH[:1], GenerationParams(max_new_tokens=2))
    assert e.value.attempts == 3


def test_timeout_is_retried_then_fails(serve):
    server, url = serve(delay_s=0.6)
    client = OpenAIBackend(url, "tiny", max_retries=1, timeout_s=0.2, **FAST)
    with pytest.raises(BackendRequestError, match="timeout after 0.2s") as e:
        client.generate(BATCH[:1], GenerationParams(max_new_tokens=2))
    assert e.value.attempts == 2


@pytest.mark.parametrize("limit", [1, 3])
def test_concurrency_is_bounded(serve, limit):
    server, url = serve(delay_s=0.15)
    client = OpenAIBackend(url, "tiny", max_concurrency=limit)
    prompts = [[{"role": "user", "content": f"question {i}"}] for i in range(6)]
    out = client.generate(prompts, GenerationParams(max_new_tokens=2))
    assert len(out) == 6 and server.requests_total == 6
    assert server.max_in_flight == limit


def test_backoff_delay_bounds():
    rng = random.Random(0)
    for attempt, cap in [(1, 0.5), (2, 1.0), (3, 2.0), (10, 20.0)]:
        d = backoff_delay(attempt, 0.5, 20.0, rng)
        assert cap / 2 <= d <= cap


def test_constructor_rejects_bad_limits():
    with pytest.raises(ValueError, match="max_concurrency >= 1"):
        OpenAIBackend("http://127.0.0.1:1/v1", "m", max_concurrency=0)


def test_several_base_urls_spread_requests_and_fail_over(serve, hf):
    s1, u1 = serve(delay_s=0.1)
    s2, u2 = serve(delay_s=0.1)
    client = OpenAIBackend(f"{u1},{u2}", "tiny", max_concurrency=2)
    assert client.base_urls == [u1, u2] and client.model_id == f"openai:{u1},{u2}#tiny"
    prompts = [[{"role": "user", "content": f"question {i}"}] for i in range(8)]
    greedy = GenerationParams(max_new_tokens=2)
    out = client.generate(prompts, greedy)
    assert out == [hf.generate([m], greedy)[0] for m in prompts]  # same answers whichever replica served
    assert client.replica_calls == [s1.requests_total, s2.requests_total] and sum(client.replica_calls) == 8
    assert min(client.replica_calls) >= 3  # least-in-flight + round robin: both replicas share the load
    assert s1.max_in_flight <= 2 and s2.max_in_flight <= 2
    # a dead replica: the retry goes to the live one
    dead = OpenAIBackend(f"http://127.0.0.1:{_free_port()}/v1,{u1}", "tiny", max_retries=1, **FAST)
    before = s1.requests_total
    assert len(dead.generate(prompts[:3], greedy)) == 3 and s1.requests_total - before == 3
    assert dead.replica_calls == [0, 3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MSG = [[{"role": "user", "content": "hi"}]]


def test_settings_come_from_arguments_then_environment(monkeypatch):
    monkeypatch.delenv("MEMGYM_REQUEST_TIMEOUT_S", raising=False)
    monkeypatch.delenv("MEMGYM_REQUEST_RETRIES", raising=False)
    assert request_settings() == (60.0, 5)
    monkeypatch.setenv("MEMGYM_REQUEST_TIMEOUT_S", "600")
    monkeypatch.setenv("MEMGYM_REQUEST_RETRIES", "1")
    assert request_settings() == (600.0, 1)
    assert request_settings(5, 0) == (5.0, 0)
    b = OpenAIBackend("http://127.0.0.1:9/v1", "m")
    assert (b.timeout_s, b.max_retries, b.client.timeout) == (600.0, 1, 600.0)
    monkeypatch.setenv("MEMGYM_REQUEST_RETRIES", "many")
    with pytest.raises(ValueError, match=r"\$MEMGYM_REQUEST_RETRIES='many' is not an integer"):
        request_settings()


def test_recipe_fields_reach_the_openai_backend(monkeypatch):
    monkeypatch.delenv("MEMGYM_REQUEST_RETRIES", raising=False)
    cfg = EvalConfig(task_model="openai:http://127.0.0.1:9/v1#m", request_timeout_s=7, request_retries=2)
    rt = Runtime(request_timeout_s=cfg.request_timeout_s, request_retries=cfg.request_retries)
    inner = rt._backends.get(cfg.task_model) or rt.backend(cfg.task_model, "answer").inner
    assert (inner.timeout_s, inner.max_retries) == (7.0, 2)
    with pytest.raises(ValueError, match="--request_retries: must be >= 0"):
        EvalConfig(request_retries=-1)


def test_each_retry_is_logged_with_its_reason(caplog):
    server, _, url = serve_backend(ScriptedBackend(lambda m, p: "ok"), server_class=FaultyServer, fail_first=2,
                                   fail_status=503)
    try:
        b = OpenAIBackend(url, "stub", max_retries=3, backoff_base_s=0.01, backoff_max_s=0.02)
        with caplog.at_level(logging.WARNING, logger="memgym.llm"):
            assert b.generate(MSG, GenerationParams(max_new_tokens=3))[0].text == "ok"
    finally:
        server.shutdown()
        server.server_close()
    lines = [r.getMessage() for r in caplog.records if r.name == "memgym.llm"]
    assert len(lines) == 2 and all("HTTP 503" in x for x in lines)
    assert "retry 1 of 3" in lines[0] and "retry 2 of 3" in lines[1]


def test_an_html_200_is_named_as_a_non_json_response():
    class Html(BaseHTTPRequestHandler):
        def do_POST(self):
            body = b"<html><body>Welcome to nginx!</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        b = OpenAIBackend(f"http://127.0.0.1:{server.server_address[1]}/v1", "m", max_retries=0)
        with pytest.raises(BackendRequestError, match=r"non-JSON body \('<html><body>Welcome"):
            b.generate(MSG, GenerationParams(max_new_tokens=3))
    finally:
        server.shutdown()
        server.server_close()


def test_invalid_server_usage_is_never_trusted_but_estimated_and_marked(recwarn):
    """A server's ``usage`` that is missing, negative, not an int, a bool or absurd is replaced
    by SmolLM2-tokenizer counts, marked ``estimated``; the role's tokens in the runtime count them."""
    from memgym.llm.models import estimate_tokens

    msg = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Caroline adopted a dog named Max."}]
    reply = "She named the dog Max."
    want = estimate_tokens(msg, reply)
    # SmolLM2's ChatML: 5 tokens around each message (<|im_start|> role \n ... <|im_end|> \n), its contents
    # ("Be brief." 3, "Caroline adopted a dog named Max." 8), 4 for the generation prompt; the reply 6
    assert want == (2 * 5 + 3 + 8 + 4, 6)
    params = GenerationParams(max_new_tokens=64)
    cases = [({"prompt_tokens": -1_000_000_000, "completion_tokens": 5000}, "prompt_tokens -1,000,000,000 is "
              "negative; completion_tokens 5,000 is above the possible 64"),
             ({"prompt_tokens": "12abc", "completion_tokens": 3}, "prompt_tokens '12abc' is not an integer"),
             ({"prompt_tokens": True, "completion_tokens": True}, "prompt_tokens True is not an integer"),
             ({"prompt_tokens": 10 ** 12, "completion_tokens": 3}, "prompt_tokens 1,000,000,000,000 is above"),
             ({"prompt_tokens": 0, "completion_tokens": 0}, "prompt_tokens 0 for a non-empty text"),
             ({"prompt_tokens": 12.5, "completion_tokens": 3}, "prompt_tokens 12.5 is not an integer"),
             ({"completion_tokens": 3}, "prompt_tokens None is not an integer"),
             (None, "returns no usage")]
    for usage, why in cases:
        server, _, url = serve_backend(ScriptedBackend(lambda m, p: reply), served_model_name="m",
                                       server_class=FaultyServer, usage=usage)
        try:
            rt = Runtime()
            rt.register("openai:x", OpenAIBackend(url, "m", max_retries=0))
            recwarn.clear()
            c = rt.backend("openai:x", role="coder").generate([msg], params)[0]
        finally:
            server.shutdown()
            server.server_close()
        assert (c.prompt_tokens, c.completion_tokens, c.estimated) == (*want, True), usage
        assert rt.tokens["coder"] == {"prompt": want[0], "completion": want[1], "estimated": 1}
        warned = [str(w.message) for w in recwarn]
        assert len(warned) == 1 and why in warned[0] and "estimated with the SmolLM2 tokenizer" in warned[0], warned
    # a valid usage is taken as reported, not marked
    server, _, url = serve_backend(ScriptedBackend(lambda m, p: reply), served_model_name="m", server_class=FaultyServer,
                                   usage={"prompt_tokens": 31, "completion_tokens": 5})
    try:
        c = OpenAIBackend(url, "m", max_retries=0).generate([msg], params)[0]
    finally:
        server.shutdown()
        server.server_close()
    assert (c.prompt_tokens, c.completion_tokens, c.estimated) == (31, 5, False)
