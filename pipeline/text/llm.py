"""Completions from any OpenAI-compatible endpoint, cached so that pipeline runs stay offline.

Input: a prompt, :class:`LLMParams` (endpoint, model, name of the API-key variable, timeout,
retries, rate) and a validator that turns the completion text into a value or raises
:class:`MalformedCompletion`. Output: the validated value. Every accepted completion is stored
in a :class:`ResponseCache` (a versioned JSON file under ``configs/``, keyed by model and
prompt), so a later run with the same prompt never touches the network and gives the same
bytes. The API key is read from the environment at call time and is never logged, stored or
put in an error message.

Retries: timeouts, connection errors, HTTP 429 and 5xx, and completions the validator
rejects are retried with exponential backoff (``backoff_s * 2**attempt``, capped); HTTP 4xx
errors such as a wrong key or an unknown model fail at once with what to change. The openai
client's own retries are switched off so that these are the only ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pipeline.audio import write_atomic

log = logging.getLogger(__name__)
T = TypeVar("T")
CACHE_VERSION = 1


class LLMError(RuntimeError):
    """The endpoint could not give a usable completion; the message says what to change."""


class MalformedCompletion(ValueError):
    """A completion that does not have the requested form (retried)."""


@dataclass(frozen=True)
class LLMParams:
    """How to reach an OpenAI-compatible chat-completions endpoint."""

    base_url: str | None = None  # null: api.openai.com
    model: str = "gpt-4o-mini"
    api_key_env: str | None = "OPENAI_API_KEY"  # environment variable with the key; null: no key
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_s: float = 2.0
    max_backoff_s: float = 60.0
    requests_per_minute: float = 60.0
    temperature: float = 1.0
    cache: str = "configs/llm_cache.json"


class ResponseCache:
    """Accepted completions, keyed by (model, prompt), in one JSON file.

    Format: ``{"version": 1, "entries": {key: {"model", "prompt", "response"}}}`` with
    ``key = sha256(json([model, prompt]))``; entries are sorted so the file diffs well.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            try:
                raw = json.loads(self.path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise LLMError(f"{self.path} is not valid JSON ({e}); restore it from git or delete it to start a new cache") from None
            if raw.get("version") != CACHE_VERSION:
                raise LLMError(f"{self.path} has cache format version {raw.get('version')!r}; this version reads {CACHE_VERSION}")
            self.entries = dict(raw.get("entries", {}))

    @staticmethod
    def key(model: str, prompt: str) -> str:
        return hashlib.sha256(json.dumps([model, prompt], ensure_ascii=False).encode("utf-8")).hexdigest()

    def get(self, model: str, prompt: str) -> str | None:
        entry = self.entries.get(self.key(model, prompt))
        return None if entry is None else entry["response"]

    def put(self, model: str, prompt: str, response: str) -> None:
        self.entries[self.key(model, prompt)] = {"model": model, "prompt": prompt, "response": response}
        data = {"version": CACHE_VERSION, "entries": dict(sorted(self.entries.items()))}
        write_atomic(self.path, (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))


class RateLimiter:
    """At most ``per_minute`` calls a minute, spaced evenly."""

    def __init__(self, per_minute: float):
        self.interval_s = 60.0 / per_minute if per_minute > 0 else 0.0
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        with self._lock:
            now = time.monotonic()
            if self._next > now:
                time.sleep(self._next - now)
            self._next = max(now, self._next) + self.interval_s


class Completer:
    """Cached, retried, rate-limited completions from one endpoint (see the module docstring)."""

    def __init__(self, params: LLMParams, cache: ResponseCache | None = None, system: str | None = None):
        self.params = params
        self.cache = cache if cache is not None else ResponseCache(params.cache)
        self.system = system
        self.limiter = RateLimiter(params.requests_per_minute)
        self._client = None
        self.requests = 0  # HTTP requests made (retries included)

    def complete(self, prompt: str, validate: Callable[[str], T]) -> T:
        """The validated completion of ``prompt``, from the cache or the endpoint."""
        cached = self.cache.get(self.params.model, prompt)
        if cached is not None:
            try:
                return validate(cached)
            except MalformedCompletion as e:
                raise LLMError(f"{self.cache.path}: the cached completion for model {self.params.model!r} "
                               f"(entry {self.cache.key(self.params.model, prompt)[:12]}...) is no longer usable ({e}); "
                               "delete that entry to ask the endpoint again") from None
        text, value = self._request(prompt, validate)
        self.cache.put(self.params.model, prompt, text)
        return value

    def _client_or_fail(self):
        if self._client is None:
            import openai

            key = "unused"
            if self.params.api_key_env:
                key = os.environ.get(self.params.api_key_env, "")
                if not key:
                    raise LLMError(
                        f"no cached completion, and ${self.params.api_key_env} is not set: export the endpoint's key in "
                        f"that variable (captions.llm.api_key_env names it), set api_key_env: null for an endpoint without "
                        f"keys, or use the shipped offline defaults (captions.templates: default)"
                    )
            self._client = openai.OpenAI(base_url=self.params.base_url, api_key=key, timeout=self.params.timeout_s, max_retries=0)
        return self._client

    def _request(self, prompt: str, validate: Callable[[str], T]) -> tuple[str, T]:
        import openai

        client = self._client_or_fail()
        where = self.params.base_url or "the OpenAI API"
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + [{"role": "user", "content": prompt}]
        last = ""
        for attempt in range(self.params.max_retries + 1):
            if attempt:
                delay = min(self.params.backoff_s * 2 ** (attempt - 1), self.params.max_backoff_s)
                log.warning("LLM request failed (%s); retry %d of %d in %.1f s", last, attempt, self.params.max_retries, delay)
                time.sleep(delay)
            self.limiter.wait()
            self.requests += 1
            try:
                response = client.chat.completions.create(
                    model=self.params.model, messages=messages, temperature=self.params.temperature
                )
                text = _completion_text(response)
                return text, validate(text)
            except MalformedCompletion as e:
                last = f"malformed completion: {e}"
            except openai.APITimeoutError:
                last = f"no answer within {self.params.timeout_s:g} s"
            except openai.APIConnectionError as e:
                last = f"cannot connect to {where} ({type(e).__name__})"
            except openai.RateLimitError:
                last = "rate limited (HTTP 429)"
            except openai.InternalServerError as e:
                last = f"server error (HTTP {e.status_code})"
            except openai.APIResponseValidationError:
                last = "malformed completion: the response does not follow the chat-completions format"
            except json.JSONDecodeError:  # a JSON content type over a body that is not JSON (the client does not wrap it)
                last = "malformed completion: the response body is not JSON"
            except openai.APIStatusError as e:
                raise LLMError(_status_advice(e.status_code, self.params, where)) from None
        raise LLMError(
            f"{where} gave no usable completion after {self.params.max_retries + 1} attempts (last: {last}); "
            f"check the endpoint and model, raise captions.llm.timeout_s or max_retries, or use the offline defaults"
        )


def _completion_text(response) -> str:
    choices = getattr(response, "choices", None)
    if not choices:
        raise MalformedCompletion("no choices in the response")
    text = getattr(getattr(choices[0], "message", None), "content", None)
    if not isinstance(text, str) or not text.strip():
        raise MalformedCompletion("the completion is empty")
    return text


def _status_advice(status: int, params: LLMParams, where: str) -> str:
    if status in (401, 403):
        return f"{where} refused the key (HTTP {status}): check ${params.api_key_env}"
    if status == 404:
        return f"{where} does not know model {params.model!r} or the path (HTTP 404): check captions.llm.model and base_url"
    return f"{where} rejected the request (HTTP {status}): check captions.llm.model and base_url"


def strip_fences(text: str) -> str:
    """A completion without the Markdown code fences some models wrap around it."""
    text = text.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rsplit("```", 1)[0]
    return text.strip()
