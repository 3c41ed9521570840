"""The builtin OpenAI-compatible server, spoken to with plain HTTP (urllib) and the openai client."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from memgym.llm.server import serve_backend
from tests.helpers import ScriptedBackend


@pytest.fixture
def server():
    backend = ScriptedBackend(lambda messages, params: f"{messages[-1]['content']}|{params.max_new_tokens}|"
                                                       f"{params.temperature}|{params.seed}")
    srv, _, url = serve_backend(backend, served_model_name="stub-model")
    yield srv, url, backend
    srv.shutdown()
    srv.server_close()


def post(url, body: bytes):
    req = urllib.request.Request(url + "/chat/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_models_and_chat_completion_shapes(server):
    srv, url, backend = server
    with urllib.request.urlopen(url + "/models", timeout=5) as r:
        assert [m["id"] for m in json.loads(r.read())["data"]] == ["stub-model"]
    status, body = post(url, json.dumps({"model": "stub-model", "max_tokens": 9, "temperature": 0, "seed": 4,
                                         "messages": [{"role": "user", "content": "one two"}]}).encode())
    assert status == 200
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "one two|9|0.0|4"}
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    assert body["object"] == "chat.completion" and body["model"] == "stub-model"


def test_openai_defaults_apply(server):
    srv, url, backend = server
    client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0)
    resp = client.chat.completions.create(model="stub-model", messages=[{"role": "user", "content": "x"}])
    assert resp.choices[0].message.content == "x|256|1.0|None"


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"messages": [{"role": "user"}]}).encode(), 400, "['content'] must be a str"),
    (json.dumps({"messages": []}).encode(), 400, "non-empty list"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}).encode(), 400, "only n=1"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True}).encode(), 400, "stream"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).encode(), 400, "max_new_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "model": "other"}).encode(), 404, "`other`"),
])
def test_bad_requests_get_typed_errors(server, body, status, fragment):
    srv, url, backend = server
    got_status, got = post(url, body)
    assert got_status == status and fragment in got["error"]["message"]
    assert backend.calls == 0


def test_backend_failure_is_a_500_and_server_keeps_serving(server):
    srv, url, backend = server
    srv.backend = ScriptedBackend([])  # exhausted script: generate raises
    status, body = post(url, json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode())
    assert status == 500 and "script exhausted" in body["error"]["message"]
    srv.backend = backend
    assert post(url, json.dumps({"messages": [{"role": "user", "content": "y"}]}).encode())[0] == 200
