"""A local fake OpenAI-compatible judge server that records every request body.

``FakeJudge(reply)`` serves ``POST /v1/chat/completions`` on 127.0.0.1 (a free port) and
answers with ``reply(body) -> str``; ``bodies`` holds every parsed request body in arrival
order (requests of one batch arrive concurrently, so compare them as a multiset or sorted).
Use as a context manager; ``spec`` is the ``openai:`` backend spec that reaches it.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeJudge:
    def __init__(self, reply, model: str = "fake-judge"):
        self.reply, self.model = reply, model
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n))
                with outer.lock:
                    outer.bodies.append(body)
                text = outer.reply(body)
                out = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": outer.model,
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": text}}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def spec(self) -> str:
        return f"openai:http://127.0.0.1:{self.server.server_address[1]}/v1#{self.model}"

    def __enter__(self) -> "FakeJudge":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def user_text(body: dict) -> str:
    """The last user message of a request body."""
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
