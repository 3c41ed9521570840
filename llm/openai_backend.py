"""OpenAI-compatible chat backend (``openai:<url>[,<url>...]#<model>``): vLLM, SGLang, hosted APIs.

Several base URLs are data-parallel replicas: each request goes to the replica with the fewest
requests in flight (ties: round robin); a retry goes to another replica when there is one.
The ``openai`` client's own retries are off; retry policy and errors are ours.
"""
from __future__ import annotations

import logging
import os
import random
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

from memgym.llm.base import (BackendRequestError, Completion, GenerationParams, Messages, check_batch, prompt_token_limit,
                      token_count_problem)
from memgym.llm.structured import ConstraintRefusedError, JsonSchema, check_schemas

RETRY_STATUSES = frozenset({408, 429})  # plus every 5xx
#: Words by which a 4xx answer to a constrained request is read as a refusal of response_format.
_REFUSAL_WORDS = ("response_format", "json_schema", "schema", "structured", "guided", "grammar")
#: Environment settings read when a backend is built without explicit values.
ENV_TIMEOUT = "MEMGYM_REQUEST_TIMEOUT_S"
ENV_RETRIES = "MEMGYM_REQUEST_RETRIES"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_RETRIES = 5

log = logging.getLogger("memgym.llm")


def request_settings(timeout_s: float | None = None, max_retries: int | None = None) -> tuple[float, int]:
    """``(timeout_s, max_retries)``: the explicit values, else ``$MEMGYM_REQUEST_TIMEOUT_S`` /
    ``$MEMGYM_REQUEST_RETRIES``, else 60 s and 5. ValueError names the variable for a bad value."""
    def env(name, kind, default):
        raw = os.environ.get(name, "").strip()
        if not raw:
            return default
        try:
            return kind(raw)
        except ValueError:
            raise ValueError(f"${name}={raw!r} is not a{'n integer' if kind is int else ' number'}") from None

    t = timeout_s if timeout_s is not None else env(ENV_TIMEOUT, float, DEFAULT_TIMEOUT_S)
    r = max_retries if max_retries is not None else env(ENV_RETRIES, int, DEFAULT_RETRIES)
    if t <= 0 or r < 0:
        raise ValueError(f"request timeout must be > 0 s and retries >= 0, got {t} s and {r} "
                         f"(recipe request_timeout_s / request_retries or ${ENV_TIMEOUT} / ${ENV_RETRIES})")
    return float(t), int(r)


def backoff_delay(attempt: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Seconds in ``[d/2, d]`` to wait before retry ``attempt`` (1-based), ``d = min(max_s,
    base_s * 2**(attempt-1))``: "equal jitter" backoff (AWS Architecture Blog, "Exponential
    Backoff And Jitter")."""
    d = min(max_s, base_s * (2 ** (attempt - 1)))
    return d / 2 + rng.uniform(0, d / 2)


_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
               "integer": int, "number": (int, float)}


def schema_mismatch(text: str, schema: dict) -> str:
    """Why ``text`` is not a JSON document of ``schema``, or "" when it is. Checks the keywords
    structured outputs use ($ref/$defs, anyOf/oneOf, const, enum, type, properties/required/
    additionalProperties, items/minItems/maxItems, minLength/maxLength); others pass."""
    import json

    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return f"not JSON: {str(text)[:60]!r}"
    defs = schema.get("$defs", {})

    def check(v, node, where: str) -> str:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            return check(v, defs.get(name, {}), where) if name in defs else ""
        for key in ("anyOf", "oneOf"):
            if key in node:
                whys = [check(v, sub, where) for sub in node[key]]
                return "" if any(not w for w in whys) else f"{where} matches none of its {len(whys)} alternatives"
        if "const" in node and v != node["const"]:
            return f"{where} is {v!r}, not {node['const']!r}"
        if "enum" in node and v not in node["enum"]:
            return f"{where} {str(v)[:40]!r} is not one of {len(node['enum'])} allowed values"
        typ = node.get("type")
        if typ is not None:
            kinds = typ if isinstance(typ, list) else [typ]
            ok = any(isinstance(v, _JSON_TYPES.get(k, object)) and not (k in ("integer", "number") and isinstance(v, bool))
                     for k in kinds)
            if not ok:
                return f"{where} is {type(v).__name__}, not {'/'.join(kinds)}"
        if isinstance(v, dict):
            props = node.get("properties", {})
            for k in node.get("required", []):
                if k not in v:
                    return f"{where} lacks {k!r}"
            for k, sub in v.items():
                if k in props:
                    why = check(sub, props[k], f"{where}.{k}")
                    if why:
                        return why
                elif node.get("additionalProperties") is False:
                    return f"{where} has the extra key {k!r}"
        if isinstance(v, list):
            if len(v) < node.get("minItems", 0) or len(v) > node.get("maxItems", len(v)):
                return f"{where} has {len(v)} items"
            for i, sub in enumerate(v):
                why = check(sub, node.get("items", {}), f"{where}[{i}]")
                if why:
                    return why
        if isinstance(v, str) and not node.get("minLength", 0) <= len(v) <= node.get("maxLength", len(v)):
            return f"{where} has {len(v)} characters"
        return ""

    return check(value, schema, "$")


class OpenAIBackend:
    """Chat completions against an OpenAI-compatible server.

    Args:
        base_url: ``http://127.0.0.1:8000/v1``; replicas as a list or comma-separated string.
        model: the served model name. api_key: default ``$OPENAI_API_KEY`` or ``"EMPTY"``.
        max_concurrency: requests in flight per replica, across threads (>= 1).
        max_retries, timeout_s: None reads :func:`request_settings`; at most ``max_retries + 1`` attempts.
        backoff_base_s, backoff_max_s: see :func:`backoff_delay`.
        extra_body: extra JSON fields sent with every request.

    Retried (logged WARNING on ``memgym.llm``): HTTP 408, 429, 5xx, timeouts, connection errors;
    other 4xx are not. Failure raises :class:`BackendRequestError` (model, URL, status, ``.attempts``)
    and fails the whole ``generate`` call.
    Counters: ``calls`` (completions), ``replica_calls[i]``, ``attempts`` (HTTP attempts),
    ``retries``, ``schema_ignored`` (constrained replies outside the schema: the server ignores
    structured outputs; the first warns). Token counts come from ``usage``; missing or invalid counts
    (negative, not an int, absurd: :func:`memgym.llm.base.token_count_problem`) are never taken: the
    completion's counts are then estimated with SmolLM2's tokenizer and marked ``estimated`` (the
    first warns).
    """

    def __init__(self, base_url: str | list[str], model: str, api_key: str | None = None, max_concurrency: int = 8,
                 max_retries: int | None = None, timeout_s: float | None = None, backoff_base_s: float = 0.5,
                 backoff_max_s: float = 20, extra_body: dict | None = None):
        import openai

        timeout_s, max_retries = request_settings(timeout_s, max_retries)
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0 or backoff_base_s < 0 or backoff_max_s < 0:
            raise ValueError(
                f"OpenAIBackend: need max_concurrency >= 1, max_retries >= 0, timeout_s > 0, backoffs >= 0; got "
                f"{max_concurrency}, {max_retries}, {timeout_s}, {backoff_base_s}, {backoff_max_s}")
        urls = base_url.split(",") if isinstance(base_url, str) else list(base_url)
        self.base_urls = [u.strip().rstrip("/") for u in urls if u.strip()]
        if not self.base_urls:
            raise ValueError(f"OpenAIBackend: no base url in {base_url!r}")
        self.base_url = ",".join(self.base_urls)
        self.model = model
        self.model_id = f"openai:{self.base_url}#{model}"
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.extra_body = dict(extra_body or {})
        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.clients = [openai.OpenAI(base_url=u, api_key=key, max_retries=0, timeout=timeout_s) for u in self.base_urls]
        self.client = self.clients[0]
        self._sems = [threading.BoundedSemaphore(max_concurrency) for _ in self.base_urls]
        self._inflight = [0] * len(self.base_urls)
        self._next = 0
        self.replica_calls = [0] * len(self.base_urls)
        self._lock = threading.Lock()
        self._rng = random.Random()
        self._warned_usage = False
        self.calls = 0
        self.attempts = 0
        self.retries = 0
        self.schema_ignored = 0
        self._warned_schema = False

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)

    def _classify(self, exc: Exception) -> tuple[bool, str]:
        """(retryable, description) for an exception raised by the openai client."""
        import openai

        if isinstance(exc, openai.APITimeoutError):
            return True, f"timeout after {self.timeout_s}s"
        if isinstance(exc, openai.APIConnectionError):
            return True, f"connection error ({exc.__cause__ or exc})"
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            return (status in RETRY_STATUSES or status >= 500), f"HTTP {status}: {exc.message}"
        return False, f"{type(exc).__name__}: {exc}"

    def _refusal(self, exc: Exception, schema: JsonSchema, attempt: int, url: str) -> ConstraintRefusedError | None:
        """A :class:`ConstraintRefusedError` when ``exc`` is a 4xx answer that names the
        structured-output request (see ``_REFUSAL_WORDS``), else None."""
        import openai

        if not isinstance(exc, openai.APIStatusError) or not (400 <= exc.status_code < 500) or exc.status_code in RETRY_STATUSES:
            return None
        text = str(exc.message).lower()
        if not any(w in text for w in _REFUSAL_WORDS):
            return None
        return ConstraintRefusedError(
            f"OpenAIBackend: the server {url} (model {self.model!r}) refused the JSON-schema "
            f"response_format {schema.name!r}: HTTP {exc.status_code}: {exc.message}. Use a server with "
            "structured outputs (e.g. vLLM) or set `constrained: false` to generate without constraint.",
            attempts=attempt)

    def _request(self, messages: Messages, params: GenerationParams, schema: JsonSchema | None = None) -> Completion:
        kwargs = dict(model=self.model, messages=messages, max_tokens=params.max_new_tokens,
                      temperature=params.temperature, top_p=params.top_p)
        if schema is not None:
            kwargs["response_format"] = schema.response_format()
        if params.seed is not None:
            kwargs["seed"] = params.seed
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        attempt, last = 0, None
        while True:
            attempt += 1
            self._count(attempts=1, retries=int(attempt > 1))
            i = self._pick(avoid=last)
            try:
                with self._sems[i]:
                    resp = self.clients[i].chat.completions.create(**kwargs)
            except Exception as exc:  # noqa: BLE001 - classified below
                self._release(i)
                last = i
                refused = self._refusal(exc, schema, attempt, self.base_urls[i]) if schema is not None else None
                if refused is not None:
                    raise refused from exc
                retryable, what = self._classify(exc)
                if not retryable or attempt > self.max_retries:
                    verdict = "not retryable" if not retryable else "retries exhausted"
                    raise BackendRequestError(
                        f"OpenAIBackend: request to {self.base_urls[i]} for model {self.model!r} failed after "
                        f"{attempt} attempt(s) ({verdict}): {what}", attempts=attempt) from exc
                delay = backoff_delay(attempt, self.backoff_base_s, self.backoff_max_s, self._rng)
                log.warning("%s (%s): %s; retry %d of %d in %.1f s (request_timeout_s %g, request_retries %d)",
                            self.base_urls[i], self.model, what, attempt, self.max_retries, delay, self.timeout_s,
                            self.max_retries)
                time.sleep(delay)
                continue
            self._release(i, answered=True)
            completion = self._to_completion(resp, attempt, messages, params)
            if schema is not None:
                self._check_schema(completion, schema, self.base_urls[i])
            return completion

    def _check_schema(self, completion: Completion, schema: JsonSchema, url: str) -> None:
        why = schema_mismatch(completion.text, schema.schema) if completion.finish_reason != "length" else ""
        if not why:
            return
        with self._lock:
            self.schema_ignored += 1
            first, self._warned_schema = not self._warned_schema, True
        if first:
            msg = (f"OpenAIBackend: the server {url} (model {self.model!r}) returned output outside the JSON schema "
                   f"{schema.name!r} it was sent as response_format ({why}): it ignores structured outputs, so the "
                   "parse/schema failures that follow are the server's, not the model's. Use a server that honours "
                   "response_format (vLLM, SGLang) or set `constrained: false`.")
            log.warning(msg)
            warnings.warn(msg, stacklevel=2)

    def _pick(self, avoid: int | None = None) -> int:
        """The replica for the next attempt: fewest requests in flight, ties by round robin;
        ``avoid`` (the replica that just failed) only when it is the only one."""
        with self._lock:
            n = len(self.base_urls)
            order = [(self._next + k) % n for k in range(n)]
            cands = [i for i in order if i != avoid] or order
            i = min(cands, key=lambda j: self._inflight[j])
            self._inflight[i] += 1
            self._next = (i + 1) % n
            return i

    def _release(self, i: int, answered: bool = False) -> None:
        with self._lock:
            self._inflight[i] -= 1
            if answered:
                self.replica_calls[i] += 1

    def _to_completion(self, resp, attempt: int, messages: Messages, params: GenerationParams) -> Completion:
        if isinstance(resp, (str, bytes)) or not hasattr(resp, "choices"):
            head = (resp.decode("utf-8", "replace") if isinstance(resp, bytes) else str(resp))[:60]
            raise BackendRequestError(
                f"OpenAIBackend: {self.base_url} answered with a non-JSON body ({head!r}), not an OpenAI chat "
                f"completion: is the URL the server's OpenAI-compatible /v1 base?", attempts=attempt)
        choices = getattr(resp, "choices", None)
        if not choices:
            raise BackendRequestError(
                f"OpenAIBackend: {self.base_url} returned no choices for model {self.model!r}", attempts=attempt)
        choice = choices[0]
        text = choice.message.content or ""
        reason = choice.finish_reason or "stop"
        prompt, completion, why = self._usage(resp, messages, text, params)
        self._count(calls=1)
        return Completion(text=text, prompt_tokens=prompt, completion_tokens=completion,
                          finish_reason="length" if reason == "length" else "stop", estimated=bool(why))

    def _usage(self, resp, messages: Messages, text: str, params: GenerationParams) -> tuple[int, int, str]:
        """(prompt, completion, why estimated): the server's ``usage`` when both counts pass
        :func:`memgym.llm.base.token_count_problem`, else :func:`memgym.llm.models.estimate_tokens` and the
        reason (the first such answer warns, naming the server)."""
        usage = getattr(resp, "usage", None)
        if usage is None:
            why = "returns no usage"
        else:
            p, c = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
            problems = [f"{name} {why}" for name, why in (
                ("prompt_tokens", token_count_problem(p, most=prompt_token_limit(messages), nonempty=True)),
                ("completion_tokens", token_count_problem(c, most=params.max_new_tokens, nonempty=bool(text))))
                if why]
            if not problems:
                return p, c, ""
            why = f"reported invalid usage ({'; '.join(problems)})"
        from memgym.llm.models import estimate_tokens

        p, c = estimate_tokens(messages, text)
        with self._lock:
            first, self._warned_usage = not self._warned_usage, True
        if first:
            msg = (f"OpenAIBackend: {self.base_url} ({self.model}) {why}; token counts are estimated with the "
                   "SmolLM2 tokenizer and marked as estimates")
            log.warning(msg)
            warnings.warn(msg, stacklevel=2)
        return p, c, why

    def generate(self, batch: list[Messages], params: GenerationParams,
                 schemas: list[JsonSchema | None] | None = None) -> list[Completion]:
        """One :class:`Completion` per conversation, in order, requested concurrently.
        ``schemas[i]`` is sent as a JSON-schema ``response_format`` (OpenAI structured outputs);
        a 4xx naming it raises :class:`memgym.llm.structured.ConstraintRefusedError` (not retried)."""

        check_batch(batch)
        schemas = check_schemas(schemas, len(batch))
        if not batch:
            return []
        if len(batch) == 1:
            return [self._request(batch[0], params, schemas[0])]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency * len(self.base_urls), len(batch))) as pool:
            futures = [pool.submit(self._request, m, params, s) for m, s in zip(batch, schemas)]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
