"""Completions from any OpenAI-compatible endpoint, cached so that pipeline runs stay offline.

Input: a prompt, :class:`LLMParams` (endpoint, model, name of the API-key variable, timeout,
retries, rate) and a validator that turns the completion text into a value or raises
:class:`MalformedCompletion`. Output: the validated value. Every accepted completion is stored
in a :class:`ResponseCache` (an append-only JSON-lines file under ``configs/``, keyed by model
and prompt), so a later run with the same prompt never touches the network and gives the
same bytes. The API key is read from the environment at call time and is never logged,
stored or put in an error message; an ``api_key_env`` that looks like a key rather than a
variable name is refused without repeating it. A ``base_url`` that carries credentials
(``https://user:password@host/v1``) is shown as ``https://user:***@host/v1`` (:func:`redacted_url`).

Retries: timeouts, connection errors, HTTP 429 and 5xx, and completions the validator
rejects are retried with exponential backoff (``backoff_s * 2**attempt``, capped at
``max_backoff_s``); when a 429 or 5xx answer says how long to wait (``Retry-After`` in
seconds or as an HTTP date, or ``retry-after-ms``), that wait is used instead, capped the
same way. HTTP 4xx errors such as a wrong key or an unknown model fail at once with what to
change. The openai client's own retries are switched off so that these are the only ones.
"""

from __future__ import annotations

import datetime
import email.utils
import hashlib
import json
import logging
import math
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from pipeline.outputs import write_atomic
from pipeline.config.params import LLMParams, api_key_env_problem

log = logging.getLogger(__name__)
T = TypeVar("T")
CACHE_FORMAT = "sedsynth-llm-cache"
CACHE_VERSION = 2  # JSON lines; version 1 was one JSON document, rewritten as version 2 on the first put
LEGACY_CACHE_VERSION = 1
CACHE_HEADER = (json.dumps({"format": CACHE_FORMAT, "version": CACHE_VERSION}, sort_keys=True) + "\n").encode("utf-8")


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _userinfo(url: str) -> tuple[int, int]:
    """``(start, at)``: where the ``user:password`` part of ``url`` starts and the index of its ``@`` (-1: none).

    The credentials end at the last ``@`` before any ``?`` or ``#``, so a password holding
    ``/`` or ``@`` counts whole.
    """
    scheme = _SCHEME.match(url)
    start = scheme.end() if scheme else 0
    end = min((i for i in (url.find("?", start), url.find("#", start)) if i >= 0), default=len(url))
    return start, url.rfind("@", start, end)


def redacted_url(url: str) -> str:
    """``url`` as it may be shown: ``https://user:password@host/v1`` -> ``https://user:***@host/v1``.

    A user name alone (``token@host``, often a key itself) becomes ``***``; a URL without
    credentials is returned as it is.
    """
    start, at = _userinfo(url)
    if at < 0:
        return url
    user, has_password, _ = url[start:at].partition(":")
    return url[:start] + (f"{user}:***" if has_password else "***") + url[at:]


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its ``user:password@`` part, and that part decoded (None when there is none).

    The client sends them as HTTP basic auth, as it would from the URL, but the URL it logs
    (httpx logs every request's) then holds no password.
    """
    start, at = _userinfo(url)
    if at < 0:
        return url, None
    user, _, password = url[start:at].partition(":")
    return url[:start] + url[at + 1:], (urllib.parse.unquote(user), urllib.parse.unquote(password))


class LLMError(RuntimeError):
    """The endpoint could not give a usable completion; the message says what to change."""


class MalformedCompletion(ValueError):
    """A completion that does not have the requested form (retried)."""


def _json_or_none(raw: bytes):
    try:
        return json.loads(raw)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return None


def _entry_problem(entry) -> str | None:
    """Why a decoded cache line is not an entry, or None."""
    if entry is None:
        return "not JSON"
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("model", "prompt", "response")):
        return "not an object with model, prompt and response strings"
    return None


def _last_line_start(fd: int, size: int, chunk: int = 1 << 16) -> int:
    """Offset just after the last newline in the first ``size`` bytes of ``fd`` (0 if none)."""
    end = size
    while end > 0:
        start = max(0, end - chunk)
        at = os.pread(fd, end - start, start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


class ResponseCache:
    """Accepted completions, keyed by (model, prompt), in one append-only JSON-lines file.

    Format: the header line ``{"format": "sedsynth-llm-cache", "version": 2}``, then one entry
    per line, ``{"key", "model", "prompt", "response"}`` with sorted keys and
    ``key = sha256(json([model, prompt]))`` (the key is there to grep for; reading recomputes
    it). A put appends one line with one write and an fsync, so it costs the same at any cache
    size, and a commit shows new completions as added lines. A later line for the same key wins.

    Crash safety: a run killed while appending leaves at most a cut-short last line; reading
    ignores it with a warning and the next put cuts it off. Other lines that are not entries (a
    bad hand edit, a merge conflict marker) are skipped with a warning naming their line
    numbers. A cache in the old one-document format (``{"version": 1, "entries": {...}}``) is
    read as is and rewritten in this format, by one atomic replace, on the first put.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.entries: dict[str, dict] = {}
        self.skipped_lines: list[int] = []  # line numbers that are not entries
        self.legacy = False  # read from the old one-document format; converted on the first put
        self._lock = threading.Lock()
        if self.path.exists():
            self._load(self.path.read_bytes())

    def _load(self, data: bytes) -> None:
        if not data.strip():
            return
        first, newline, body = data.partition(b"\n")
        header = _json_or_none(first) if newline else None
        if isinstance(header, dict) and header.get("format") == CACHE_FORMAT:
            if header.get("version") != CACHE_VERSION:
                raise LLMError(f"{self.path} has cache format version {header.get('version')!r}; this version of sedsynth "
                               f"reads {CACHE_VERSION} (and converts {LEGACY_CACHE_VERSION}): use the sedsynth that wrote it")
            self._read_lines(body)
            return
        whole = _json_or_none(data)
        if isinstance(whole, dict) and "entries" in whole:
            self._read_legacy(whole)
            return
        if CACHE_HEADER.startswith(data):  # the first put was cut short inside the header
            log.warning("%s holds only a cut-short header left by an interrupted run; it is read as empty and "
                        "rewritten by the next completion stored", self.path)
            return
        raise LLMError(f"{self.path} is not an LLM cache (neither sedsynth's JSON-lines cache nor its older JSON one); "
                       "restore it from git, or point captions.llm.cache at another file")

    def _read_lines(self, body: bytes) -> None:
        lines = body.split(b"\n")
        torn = lines.pop()  # the bytes after the last newline: empty unless the last append was cut short
        for number, raw in enumerate(lines, start=2):
            if not raw.strip():
                continue
            entry = _json_or_none(raw)
            if _entry_problem(entry) is not None:
                self.skipped_lines.append(number)
                continue
            self.entries[self.key(entry["model"], entry["prompt"])] = {k: entry[k] for k in ("model", "prompt", "response")}
        if self.skipped_lines:
            shown = ", ".join(map(str, self.skipped_lines[:10])) + (", ..." if len(self.skipped_lines) > 10 else "")
            log.warning("%s: %d line(s) are not cache entries and are ignored (line %s); fix or delete them, or restore "
                        "the file from git", self.path, len(self.skipped_lines), shown)
        if torn.strip():
            entry = _json_or_none(torn)
            if _entry_problem(entry) is None:  # a whole entry whose newline an editor dropped: keep it
                self.entries[self.key(entry["model"], entry["prompt"])] = {k: entry[k] for k in ("model", "prompt", "response")}
            else:
                log.warning("%s: the last line (%d bytes) was cut short by an interrupted run and is ignored; the next "
                            "completion stored replaces it", self.path, len(torn))

    def _read_legacy(self, whole: dict) -> None:
        if whole.get("version") != LEGACY_CACHE_VERSION or not isinstance(whole["entries"], dict):
            raise LLMError(f"{self.path} has cache format version {whole.get('version')!r}; this version of sedsynth "
                           f"reads {CACHE_VERSION} (and converts {LEGACY_CACHE_VERSION}): use the sedsynth that wrote it")
        for key, entry in whole["entries"].items():
            if _entry_problem(entry) is None:
                self.entries[self.key(entry["model"], entry["prompt"])] = {k: entry[k] for k in ("model", "prompt", "response")}
            else:
                log.warning("%s: entry %s is not a cache entry and is ignored", self.path, str(key)[:12])
        self.legacy = True

    @staticmethod
    def key(model: str, prompt: str) -> str:
        return hashlib.sha256(json.dumps([model, prompt], ensure_ascii=False).encode("utf-8")).hexdigest()

    @staticmethod
    def line(key: str, entry: dict) -> bytes:
        """One entry as its line in the file (sorted keys, UTF-8, newline-terminated)."""
        return (json.dumps({"key": key, **entry}, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")

    def get(self, model: str, prompt: str) -> str | None:
        entry = self.entries.get(self.key(model, prompt))
        return None if entry is None else entry["response"]

    def put(self, model: str, prompt: str, response: str) -> None:
        """Store one completion: one appended line (the whole file, once, when converting an old cache)."""
        key = self.key(model, prompt)
        entry = {"model": model, "prompt": prompt, "response": response}
        with self._lock:
            self.entries[key] = entry
            if self.legacy:
                self.rewrite()
                log.warning("%s was in the old one-document format; it now holds the same entries as JSON lines", self.path)
            else:
                self._append(self.line(key, entry))

    def rewrite(self, path: Path | str | None = None) -> None:
        """Write every entry, sorted by key, to ``path`` (default: this cache's file) by one atomic replace."""
        path = Path(path) if path is not None else self.path
        write_atomic(path, CACHE_HEADER + b"".join(self.line(k, self.entries[k]) for k in sorted(self.entries)))
        if path == self.path:
            self.legacy = False

    def _append(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                start = _last_line_start(fd, size)
                if start and _entry_problem(_json_or_none(os.pread(fd, size - start, start))) is None:
                    data = b"\n" + data  # a whole last entry without its newline: keep it
                else:
                    log.warning("%s: cutting off a last line (%d bytes) left by an interrupted run", self.path, size - start)
                    os.ftruncate(fd, start)
                    size = start
            if size == 0:
                data = CACHE_HEADER + data
            view = memoryview(data)
            while view:  # one write in practice; a short write continues where it stopped
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:  # make the new file's name durable too
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


def retry_after_s(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The wait an HTTP answer asks for, in seconds, or None when it names none (or none that parses).

    ``retry-after-ms`` (milliseconds, OpenAI's) wins over ``Retry-After`` (seconds, or an HTTP
    date, counted from ``now``, default ``time.time()``). Waits in the past are 0.
    """
    lower = {str(k).lower(): str(v).strip() for k, v in headers.items()}
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = lower.get(name)
        if not value:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            if name == "retry-after-ms":
                continue
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError, IndexError):
                continue
            if when.tzinfo is None:  # HTTP dates are GMT
                when = when.replace(tzinfo=datetime.timezone.utc)
            seconds = when.timestamp() - (time.time() if now is None else now)
        if math.isfinite(seconds):
            return max(0.0, seconds)
    return None


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
    """Cached, retried, rate-limited completions from one endpoint (see the module docstring).

    ``sleep`` and ``clock`` (wall time, for ``Retry-After`` dates) are there for tests.
    """

    def __init__(self, params: LLMParams, cache: ResponseCache | None = None, system: str | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time):
        problem = api_key_env_problem(params.api_key_env)
        if problem:
            raise LLMError(f"captions.llm.api_key_env {problem}")
        self.params = params
        self.cache = cache if cache is not None else ResponseCache(params.cache)
        self.system = system
        self.limiter = RateLimiter(params.requests_per_minute)
        self._sleep = sleep
        self._clock = clock
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
            base_url, credentials = split_credentials(self.params.base_url) if self.params.base_url else (None, None)
            http_client = openai.DefaultHttpxClient(auth=credentials, timeout=self.params.timeout_s) if credentials else None
            self._client = openai.OpenAI(base_url=base_url, api_key=key, timeout=self.params.timeout_s, max_retries=0,
                                         http_client=http_client)
        return self._client

    def _delay(self, attempt: int, asked_s: float | None) -> tuple[float, str]:
        """Seconds to wait before retry ``attempt`` (1, 2, ...) and why, when the server said."""
        cap = self.params.max_backoff_s
        if asked_s is None:
            return min(self.params.backoff_s * 2 ** (attempt - 1), cap), ""
        if asked_s > cap:
            return cap, f" (the server asked for {asked_s:.1f} s; capped at captions.llm.max_backoff_s)"
        return asked_s, " (as the server asked)"

    def _request(self, prompt: str, validate: Callable[[str], T]) -> tuple[str, T]:
        import openai

        client = self._client_or_fail()
        where = redacted_url(self.params.base_url) if self.params.base_url else "the OpenAI API"
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + [{"role": "user", "content": prompt}]
        last = ""
        asked_s: float | None = None  # the wait the last answer asked for (Retry-After)
        for attempt in range(self.params.max_retries + 1):
            if attempt:
                delay, why = self._delay(attempt, asked_s)
                log.warning("LLM request failed (%s); retry %d of %d in %.1f s%s", last, attempt, self.params.max_retries, delay, why)
                self._sleep(delay)
            asked_s = None
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
            except openai.RateLimitError as e:
                last = "rate limited (HTTP 429)"
                asked_s = retry_after_s(e.response.headers, self._clock())
            except openai.InternalServerError as e:
                last = f"server error (HTTP {e.status_code})"
                asked_s = retry_after_s(e.response.headers, self._clock())
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
