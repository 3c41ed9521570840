"""Request timeout and retries are settings (recipe + environment), each retry is logged with
its reason, and a non-JSON 200 is named as such (issue 12, findings 4 and 8)."""
from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llm.base import BackendRequestError, GenerationParams
from llm.openai_backend import OpenAIBackend, request_settings
from llm.server import serve_backend
from rewards.scoring.evaluate import EvalConfig
from llm.runtime import Runtime
from tests.helpers import ScriptedBackend

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
    cfg = EvalConfig(answer_model="openai:http://127.0.0.1:9/v1#m", request_timeout_s=7, request_retries=2)
    rt = Runtime(request_timeout_s=cfg.request_timeout_s, request_retries=cfg.request_retries)
    inner = rt._backends.get(cfg.answer_model) or rt.backend(cfg.answer_model, "answer").inner
    assert (inner.timeout_s, inner.max_retries) == (7.0, 2)
    with pytest.raises(ValueError, match="--request_retries: must be >= 0"):
        EvalConfig(request_retries=-1)


def test_each_retry_is_logged_with_its_reason(caplog):
    server, _, url = serve_backend(ScriptedBackend(lambda m, p: "ok"), fail_first=2, fail_status=503)
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
