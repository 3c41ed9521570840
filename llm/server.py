"""A small OpenAI-compatible HTTP server over any :class:`memgym.llm.base.Backend` (stdlib only):
``POST /v1/chat/completions`` (non-streaming, ``n == 1``) and ``GET /v1/models`` in the OpenAI
Chat Completions API shapes. Behind ``memgym serve`` on CPU and the ``openai`` backend's tests."""
from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from memgym.llm.base import Backend, BatchError, GenerationParams, check_batch
from memgym.llm.structured import JsonSchema

MAX_BODY_BYTES = 32 * 1024 * 1024


class _RequestError(Exception):
    def __init__(self, status: int, message: str, err_type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.err_type = status, message, err_type


def _params_from_body(body: dict) -> GenerationParams:
    """OpenAI request fields -> :class:`GenerationParams` (temperature/top_p 1, max tokens 256 by default)."""
    def pick(name: str, default):
        v = body.get(name)
        return default if v is None else v

    try:
        return GenerationParams(
            max_new_tokens=int(pick("max_completion_tokens", pick("max_tokens", 256))),
            temperature=float(pick("temperature", 1.0)),
            top_p=float(pick("top_p", 1.0)),
            seed=None if body.get("seed") is None else int(body["seed"]),
        )
    except (TypeError, ValueError) as e:
        raise _RequestError(400, f"bad sampling parameter: {e}") from e


def _schema_from_body(body: dict) -> JsonSchema | None:
    """The :class:`JsonSchema` of ``response_format`` (None for absent/text; ``json_object`` is
    ``{"type": "object"}``); ``_RequestError`` (400) for a malformed one."""
    rf = body.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise _RequestError(400, f"response_format must be an object with type text | json_object | json_schema, "
                                 f"got {rf!r:.120}")
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return JsonSchema("json_object", {"type": "object"})
    js = rf.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
        raise _RequestError(400, "response_format.json_schema must be an object with a 'schema' object")
    try:
        return JsonSchema(str(js.get("name") or "response"), js["schema"])
    except ValueError as e:
        raise _RequestError(400, f"bad response_format.json_schema: {e}") from e


class BackendHTTPServer(ThreadingHTTPServer):
    """Threading HTTP server answering chat completions with ``backend`` (``generate`` calls
    serialised by a lock). ``served_model_name`` (default ``backend.model_id``): another gets 404.

    Counters: ``requests_total``, ``in_flight`` / ``max_in_flight``; ``response_formats`` records
    each request's ``response_format``, whose schema goes to ``backend.generate(schemas=...)`` and
    whose name comes back as ``memgym_response_format`` (``structured_outputs=False``: HTTP 400).
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], backend: Backend, *, served_model_name: str | None = None,
                 structured_outputs: bool = True):
        super().__init__(address, _Handler)
        self.backend = backend
        self.served_model_name = served_model_name or backend.model_id
        self.structured_outputs = structured_outputs
        self.response_formats: list = []
        self.requests_total = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._stats_lock = threading.Lock()
        self._generate_lock = threading.Lock()
        self.created = int(time.time())

    def _enter(self) -> None:
        with self._stats_lock:
            self.requests_total += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._stats_lock:
            self.in_flight -= 1

    def chat_completion(self, body: dict) -> dict:
        """The ``chat.completion`` answer to a request body; ``_RequestError`` (400/404) for bad ones."""
        model = body.get("model")
        if model is not None and model != self.served_model_name:
            raise _RequestError(404, f"The model `{model}` does not exist; this server serves "
                                     f"`{self.served_model_name}`", "NotFoundError")
        if body.get("stream"):
            raise _RequestError(400, "stream=true is not supported by this server")
        if body.get("n", 1) != 1:
            raise _RequestError(400, f"only n=1 is supported, got n={body.get('n')!r}")
        messages = body.get("messages")
        try:
            check_batch([messages])
        except BatchError as e:
            raise _RequestError(400, f"bad 'messages': {e}") from e
        params = _params_from_body(body)
        with self._stats_lock:
            self.response_formats.append(body.get("response_format"))
        schema = _schema_from_body(body)
        if schema is not None and not self.structured_outputs:
            raise _RequestError(400, "response_format of type json_schema is not supported by this server "
                                     "(started without structured outputs)")
        messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        with self._generate_lock:
            if schema is None:
                comp = self.backend.generate([messages], params)[0]
            else:
                comp = self.backend.generate([messages], params, schemas=[schema])[0]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.served_model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": comp.text},
                         "finish_reason": comp.finish_reason, "logprobs": None}],
            "usage": {"prompt_tokens": comp.prompt_tokens, "completion_tokens": comp.completion_tokens,
                      "total_tokens": comp.prompt_tokens + comp.completion_tokens},
            "memgym_response_format": schema.name if schema is not None else None,
        }


class _Handler(BaseHTTPRequestHandler):
    server: BackendHTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - silence per-request stderr lines
        pass

    def _send(self, status: int, obj: dict) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, err_type: str = "invalid_request_error") -> None:
        self._send(status, {"error": {"message": message, "type": err_type, "code": status}})

    def do_GET(self):  # noqa: N802
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [
                {"id": self.server.served_model_name, "object": "model", "created": self.server.created,
                 "owned_by": "memgym"}]})
        elif self.path.rstrip("/") in ("/health", "/v1/health"):
            self._send(200, {"status": "ok"})
        else:
            self._error(404, f"no route GET {self.path}", "NotFoundError")

    def do_POST(self):  # noqa: N802
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no route POST {self.path}", "NotFoundError")
            return
        self.server._enter()
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._error(413, f"request body of {length} bytes exceeds {MAX_BODY_BYTES}")
                return
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
            except ValueError as e:
                self._error(400, f"request body is not valid JSON: {e}")
                return
            try:
                self._send(200, self.server.chat_completion(body))
            except _RequestError as e:
                self._error(e.status, e.message, e.err_type)
            except Exception as e:  # the backend failed: report it, keep serving
                self._error(500, f"{type(e).__name__}: {e}", "server_error")
        finally:
            self.server._leave()


def serve_backend(backend: Backend, host: str = "127.0.0.1", port: int = 0, *,
                  server_class: type[BackendHTTPServer] = BackendHTTPServer, **kw
                  ) -> tuple[BackendHTTPServer, threading.Thread, str]:
    """Start a ``server_class`` (``kw``; ``port=0``: a free port) in a daemon thread.
    Returns ``(server, thread, "http://<host>:<port>/v1")``; stop with ``shutdown(); server_close()``."""
    server = server_class((host, port), backend, **kw)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"memgym-serve-{server.server_port}", daemon=True)
    thread.start()
    return server, thread, f"http://{host}:{server.server_port}/v1"
