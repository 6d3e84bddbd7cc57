"""Completions from any OpenAI-compatible endpoint, cached so that pipeline runs stay offline.

Input: a prompt, :class:`LLMParams` (endpoint, model, name of the API-key variable, timeout,
retries, rate) and a validator that turns the completion text into a value or raises
:class:`MalformedCompletion`. Output: the validated value. Every accepted completion is stored
in a :class:`ResponseCache` (an append-only JSON-lines file under ``configs/``, keyed by model
and prompt), so a later run with the same prompt never touches the network and gives the
same bytes. The API key is read from the environment at call time and is never logged,
stored or put in an error message; an ``api_key_env`` that looks like a key rather than a
variable name is refused without repeating it. A ``base_url`` that carries credentials is shown
without them (:func:`redacted_url`): ``https://user:password@host/v1`` as
``https://user:***@host/v1``, and every query value, where endpoints take keys
(``?api_key=...``, ``?key=...``, ``?sig=...``), as ``***``: ``https://host/v1?api_key=***``. The
password is sent as HTTP basic auth, and the query as each request's query, after the path
(``https://host/v1/chat/completions?api_key=...``); the HTTP libraries' log lines about requests to
the endpoint show the query values as ``***`` too.

Deadline: ``timeout_s`` bounds each request as a whole, from connecting to the last byte of the
answer, so a server that trickles its answer a byte at a time is cut off like one that does not
answer (the HTTP client's own timeouts count per read). Requests run on an event loop in a
background thread (:class:`_RequestLoop`), where an unfinished request is cancelled at its
deadline and its connection closed.

Retries: timeouts, connection errors, HTTP 429 and 5xx, and completions the validator
rejects are retried with exponential backoff (``backoff_s * 2**attempt``, capped at
``max_backoff_s``); when a 429 or 5xx answer says how long to wait (``Retry-After`` in
seconds or as an HTTP date, or ``retry-after-ms``), that wait is used instead, capped the
same way. HTTP 4xx errors such as a wrong key or an unknown model fail at once with what to
change. The openai client's own retries are switched off so that these are the only ones.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import hashlib
import json
import logging
import math
import os
import re
import stat
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TypeVar

from pipeline.config.params import LLMParams, api_key_env_problem
from pipeline.files import NotRegularFileError, read_regular
from pipeline.outputs import write_atomic

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


def _query_bounds(url: str) -> tuple[int, int, int]:
    """``(query, fragment, end)``: where the ``?`` and the ``#`` of ``url`` are (-1: none), searched
    after its ``user:password@`` part, and where the URL before both ends."""
    start, at = _userinfo(url)
    begin = at + 1 if at >= 0 else start
    fragment = url.find("#", begin)
    query = url.find("?", begin, fragment if fragment >= 0 else len(url))
    return query, fragment, min((i for i in (query, fragment) if i >= 0), default=len(url))


def _redacted_parameter(parameter: str) -> str:
    """``name=value`` -> ``name=***``; a bare ``value`` (it may be a key itself) -> ``***``."""
    name, equals, value = parameter.partition("=")
    if equals:
        return f"{name}=***" if value else parameter
    return "***" if parameter else parameter


def redacted_url(url: str) -> str:
    """``url`` as it may be shown: ``https://user:password@host/v1?api_key=k`` -> ``https://user:***@host/v1?api_key=***``.

    A user name alone (``token@host``, often a key itself) becomes ``***``; every query value
    becomes ``***`` (the names stay, to say what was set); a fragment becomes ``#***``. A URL with
    none of these is returned as it is.
    """
    start, at = _userinfo(url)
    if at >= 0:
        user, has_password, _ = url[start:at].partition(":")
        url = url[:start] + (f"{user}:***" if has_password else "***") + url[at:]
    query, fragment, _ = _query_bounds(url)
    if fragment >= 0 and fragment + 1 < len(url):
        url = url[: fragment + 1] + "***"
    if query >= 0:
        stop = fragment if fragment >= 0 else len(url)
        url = url[: query + 1] + "&".join(_redacted_parameter(p) for p in url[query + 1 : stop].split("&")) + url[stop:]
    return url


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its ``user:password@`` part, and that part decoded (None when there is none).

    The client sends them as HTTP basic auth, as it would from the URL, but the URL it logs
    (httpx logs every request's) then holds no password.
    """
    start, at = _userinfo(url)
    if at < 0:
        return url, None
    user, _, password = url[start:at].partition(":")
    return url[:start] + url[at + 1 :], (urllib.parse.unquote(user), urllib.parse.unquote(password))


def split_query(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without its query and fragment, and the query's parameters, decoded (``{}``: none).

    The client joins each request's path to the URL's path and sends these parameters as the
    request's query: ``https://host/v1?api-version=1`` asks
    ``https://host/v1/chat/completions?api-version=1`` (left in the URL, the query would end up
    inside the path). A name given twice keeps its last value; a fragment is never sent.
    """
    query, fragment, end = _query_bounds(url)
    text = url[query + 1 : fragment if fragment >= 0 else len(url)] if query >= 0 else ""
    return url[:end], dict(urllib.parse.parse_qsl(text, keep_blank_values=True))


def _host_and_port(url: str) -> tuple[str, str, int | None] | None:
    """``(scheme, host, port)`` of ``url``, the scheme's default port filled in; None where it is no URL."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:
        return None
    if not parts.scheme or not parts.hostname:
        return None
    return parts.scheme.lower(), parts.hostname.lower(), port


class _QueryRedactingFilter(logging.Filter):
    """Shows every query value of a logged URL as ``***`` where the URL goes to an endpoint whose
    ``base_url`` carries a query (:func:`redacted_url`).

    The HTTP libraries log each request's URL (httpx at INFO); the query an endpoint takes its key
    in goes with it. Records about other hosts are left as they are.
    """

    def __init__(self) -> None:
        super().__init__()
        self.endpoints: set[tuple[str, str, int | None]] = set()

    def _shown(self, arg):
        text = arg if isinstance(arg, str) else str(arg) if type(arg).__name__ == "URL" else None
        if text is None or "?" not in text or _host_and_port(text) not in self.endpoints:
            return arg
        return redacted_url(text)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.endpoints and isinstance(record.args, tuple) and record.args:
            record.args = tuple(self._shown(arg) for arg in record.args)
        return True


_QUERY_FILTER = _QueryRedactingFilter()
# where the HTTP libraries log request URLs: httpx and httpx2 at INFO, older openai clients at DEBUG
URL_LOGGERS = ("httpx", "httpx2", "openai._base_client")


def _redact_query_in_logs(base_url: str) -> None:
    """From now on, log records about requests to ``base_url``'s host show its query values as ``***``."""
    endpoint = _host_and_port(base_url)
    if endpoint is None:
        return
    _QUERY_FILTER.endpoints.add(endpoint)
    for name in URL_LOGGERS:
        logger = logging.getLogger(name)
        if _QUERY_FILTER not in logger.filters:
            logger.addFilter(_QUERY_FILTER)


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

    Only a regular file is read or appended to: a FIFO (which would block the run for ever), a
    device or a folder at the path raises :class:`~pipeline.files.NotRegularFileError`, one line
    naming ``captions.llm.cache``, before anything is read.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.entries: dict[str, dict] = {}
        self.skipped_lines: list[int] = []  # line numbers that are not entries
        self.legacy = False  # read from the old one-document format; converted on the first put
        self._lock = threading.Lock()
        try:
            data = read_regular(self.path, "captions.llm.cache")
        except FileNotFoundError:
            return
        self._load(data)

    def _load(self, data: bytes) -> None:
        if not data.strip():
            return
        first, newline, body = data.partition(b"\n")
        header = _json_or_none(first) if newline else None
        if isinstance(header, dict) and header.get("format") == CACHE_FORMAT:
            if header.get("version") != CACHE_VERSION:
                raise LLMError(
                    f"{self.path} has cache format version {header.get('version')!r}; this version of sedsynth "
                    f"reads {CACHE_VERSION} (and converts {LEGACY_CACHE_VERSION}): use the sedsynth that wrote it"
                )
            self._read_lines(body)
            return
        whole = _json_or_none(data)
        if isinstance(whole, dict) and "entries" in whole:
            self._read_legacy(whole)
            return
        if CACHE_HEADER.startswith(data):  # the first put was cut short inside the header
            log.warning(
                "%s holds only a cut-short header left by an interrupted run; it is read as empty and "
                "rewritten by the next completion stored",
                self.path,
            )
            return
        raise LLMError(
            f"{self.path} is not an LLM cache (neither sedsynth's JSON-lines cache nor its older JSON one); "
            "restore it from git, or point captions.llm.cache at another file"
        )

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
            log.warning(
                "%s: %d line(s) are not cache entries and are ignored (line %s); fix or delete them, or restore "
                "the file from git",
                self.path,
                len(self.skipped_lines),
                shown,
            )
        if torn.strip():
            entry = _json_or_none(torn)
            if _entry_problem(entry) is None:  # a whole entry whose newline an editor dropped: keep it
                self.entries[self.key(entry["model"], entry["prompt"])] = {k: entry[k] for k in ("model", "prompt", "response")}
            else:
                log.warning(
                    "%s: the last line (%d bytes) was cut short by an interrupted run and is ignored; the next "
                    "completion stored replaces it",
                    self.path,
                    len(torn),
                )

    def _read_legacy(self, whole: dict) -> None:
        if whole.get("version") != LEGACY_CACHE_VERSION or not isinstance(whole["entries"], dict):
            raise LLMError(
                f"{self.path} has cache format version {whole.get('version')!r}; this version of sedsynth "
                f"reads {CACHE_VERSION} (and converts {LEGACY_CACHE_VERSION}): use the sedsynth that wrote it"
            )
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
        # without blocking, and checked on the descriptor: a FIFO put at the path since it was read is refused
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o644)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise NotRegularFileError(
                    f"captions.llm.cache {self.path} is not a regular file (a FIFO or device); point it at a file"
                )
            os.set_blocking(fd, True)
            size = info.st_size
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
                view = view[os.write(fd, view) :]
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


class _RequestLoop:
    """An asyncio event loop in a daemon thread, with the async client whose requests run on it.

    Input: the client (``openai.AsyncOpenAI``). :meth:`run` runs one request from the calling
    thread with a deadline for the whole of it: at the deadline the request is cancelled, which
    closes its connection, and the caller gets ``TimeoutError``. A blocking client could only
    bound each read, and a server trickling bytes never lets one time out.
    """

    def __init__(self, client) -> None:
        self.client = client
        self.loop = asyncio.new_event_loop()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self.loop.run_forever, name="llm-requests", daemon=True)
        self._thread.start()

    def usable(self) -> bool:
        """False in a process forked from the one that started the loop: the child has no loop thread."""
        return self._pid == os.getpid() and self._thread.is_alive()

    def run(self, request: Awaitable[T], deadline_s: float) -> T:
        """The result of the coroutine ``request``, or ``TimeoutError`` once ``deadline_s`` has passed."""
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(request, deadline_s), self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # Ctrl-C or SIGTERM in the caller: the request on the loop stops too
            raise

    def close(self) -> None:
        """Close the client's connections and stop the loop thread."""
        if not self.usable():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.client.close(), self.loop).result(timeout=5)
        except Exception:  # a connection that fails to close cleanly is closed with the process
            log.debug("closing the LLM client failed", exc_info=True)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self.loop.close()


class Completer:
    """Cached, retried, rate-limited completions from one endpoint (see the module docstring).

    ``sleep`` and ``clock`` (wall time, for ``Retry-After`` dates) are there for tests. The first
    request starts a background thread for the requests; :meth:`close` stops it (a daemon thread,
    so a process that never calls it still exits).
    """

    def __init__(
        self,
        params: LLMParams,
        cache: ResponseCache | None = None,
        system: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ):
        problem = api_key_env_problem(params.api_key_env)
        if problem:
            raise LLMError(f"captions.llm.api_key_env {problem}")
        self.params = params
        self.cache = cache if cache is not None else ResponseCache(params.cache)
        self.system = system
        self.limiter = RateLimiter(params.requests_per_minute)
        self._sleep = sleep
        self._clock = clock
        self._requests: _RequestLoop | None = None
        self._start_lock = threading.Lock()
        self.requests = 0  # HTTP requests made (retries included)

    def complete(self, prompt: str, validate: Callable[[str], T]) -> T:
        """The validated completion of ``prompt``, from the cache or the endpoint."""
        cached = self.cache.get(self.params.model, prompt)
        if cached is not None:
            try:
                return validate(cached)
            except MalformedCompletion as e:
                raise LLMError(
                    f"{self.cache.path}: the cached completion for model {self.params.model!r} "
                    f"(entry {self.cache.key(self.params.model, prompt)[:12]}...) is no longer usable ({e}); "
                    "delete that entry to ask the endpoint again"
                ) from None
        text, value = self._request(prompt, validate)
        self.cache.put(self.params.model, prompt, text)
        return value

    def close(self) -> None:
        """Stop the requests' background thread and close their connections (a later request starts them again)."""
        with self._start_lock:
            if self._requests is not None:
                self._requests.close()
                self._requests = None

    def _loop_or_fail(self) -> _RequestLoop:
        with self._start_lock:
            if self._requests is None or not self._requests.usable():
                self._requests = _RequestLoop(self._new_client())
            return self._requests

    def _new_client(self):
        """The async client for ``params`` (the key read from the environment now)."""
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
        base_url, query = split_query(base_url) if base_url else (None, {})
        if query:
            _redact_query_in_logs(base_url)
        http_client = openai.DefaultAsyncHttpxClient(auth=credentials, timeout=self.params.timeout_s) if credentials else None
        return openai.AsyncOpenAI(
            base_url=base_url,
            api_key=key,
            timeout=self.params.timeout_s,
            max_retries=0,
            http_client=http_client,
            default_query=query or None,
        )

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

        runner = self._loop_or_fail()
        where = redacted_url(self.params.base_url) if self.params.base_url else "the OpenAI API"
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + [{"role": "user", "content": prompt}]
        last = ""
        asked_s: float | None = None  # the wait the last answer asked for (Retry-After)
        for attempt in range(self.params.max_retries + 1):
            if attempt:
                delay, why = self._delay(attempt, asked_s)
                log.warning(
                    "LLM request failed (%s); retry %d of %d in %.1f s%s", last, attempt, self.params.max_retries, delay, why
                )
                self._sleep(delay)
            asked_s = None
            self.limiter.wait()
            self.requests += 1
            try:
                response = runner.run(
                    runner.client.chat.completions.create(
                        model=self.params.model, messages=messages, temperature=self.params.temperature
                    ),
                    self.params.timeout_s,
                )
                text = _completion_text(response)
                return text, validate(text)
            except MalformedCompletion as e:
                last = f"malformed completion: {e}"
            except openai.APITimeoutError:
                last = f"no answer within {self.params.timeout_s:g} s"
            except TimeoutError:  # the whole request's deadline (a server trickling its answer)
                last = f"no answer within {self.params.timeout_s:g} s (the whole request, a slow answer cut off)"
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
