"""Publish a shard folder to the Hugging Face hub.

Input: a dataset folder (validated first), a dataset repo id, and a token in an environment
variable (``HF_TOKEN`` by default; never printed). Output: the files on the hub, shards first
and the card, index and cluster files last, so a half-finished upload never shows a card
for data that is not there.

Resumable: shards go up in batches of ``batch_files``, one commit each; before uploading,
the hub's file list is compared with ``index.json`` by LFS sha256, so a run after an
interruption (or after adding shards) uploads only what is missing or changed. ``dry_run``
lists what would be uploaded and touches nothing.

Only regular files inside the folder are published: a symbolic link (``images/x.png ->
/etc/shadow``), FIFO, socket or device anywhere under it (hidden entries aside, which are
never published) stops the run before anything is sent, with one line naming it.

A hub call that fails (a refused token, a repo the token may not write, a rate limit, a hub
error, a network that does not answer) raises :class:`PublishError` naming the repo, what was
being done and what to do; the files already committed stay, so running the command again
uploads only the rest. Time is bounded: each HTTP request to the hub may take
``request_timeout_s`` from sending to the last byte of the answer, plus a second for each
:data:`UPLOAD_FLOOR_BYTES_S` bytes of body it sends (a 500 MB shard on a slow uplink), however
the hub sends its answer (one dripping it a byte a second is cut there, not after each byte),
and waits at most :data:`HUB_TIMEOUTS_S` for a connection or a byte; a request that runs out
of time is not retried. The whole run may
take ``deadline_s``: a ``Retry-After`` (or rate-limit reset) longer than what is left stops the
run at once with the time to retry at, and any hub call still going at the deadline (an
upload by another client library, a retry's sleep) is given up.
"""

from __future__ import annotations

import contextvars
import importlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TypeVar

from pipeline.files import open_regular
from pipeline.shards.layout import INDEX
from pipeline.shards.validate import folder_files, validate


class PublishError(ValueError):
    """Publishing cannot go on; the message says what to do."""


class HubTimeLimit(Exception):
    """A hub request or the run ran out of its time, or the hub asks to wait past the run's end.

    Not an ``httpx2`` error on purpose: huggingface_hub retries those, and a request that has run
    out of time must end the run. ``reason`` says what happened, following the step's name
    (``"stopped at ..."``), ``todo`` what to do.
    """

    def __init__(self, reason: str, todo: str = "run the same command again (it uploads only what is missing)"):
        super().__init__(reason)
        self.reason, self.todo = reason, todo


TOKENS_URL = "https://huggingface.co/settings/tokens"
REQUEST_TIMEOUT_S = 300.0  # one request, sending to the last byte of the answer
UPLOAD_FLOOR_BYTES_S = 256_000  # a request's body adds a second per this many bytes: a 2 Mbit/s uplink still gets a shard through
DEADLINE_S = 6 * 3600.0  # the whole run: a few hundred gigabytes at a common uplink
GIVE_UP_GRACE_S = 2.0  # past the deadline, the request's own limit gets this long to end the call first
RETRIED_STATUSES = (408, 429, 500, 502, 503, 504)  # what huggingface_hub retries after a wait


def _network_errors() -> tuple[type[BaseException], ...]:
    """What a hub call raises when the network fails, whichever HTTP library this huggingface_hub uses
    (requests before 1.0, httpx, httpx2)."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"), ("requests", "RequestException")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def _first_line(text: str, limit: int = 200) -> str:
    line = next((x.strip() for x in str(text).splitlines() if x.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _refusal(status: int | None, repo_id: str, token_env: str) -> str:
    """What to do about a hub answer with HTTP ``status``."""
    if status == 401:
        return f"the token in ${token_env} is not valid: create a write token at {TOKENS_URL} and export {token_env}=..."
    if status == 403:
        return (
            f"the token in ${token_env} may not write to {repo_id}: use a token with write access to it "
            f"({TOKENS_URL}), or a repo id under your own account or organisation"
        )
    if status == 404:
        return f"check the repo id {repo_id!r} (owner/name) and that the token in ${token_env} can see it"
    if status == 429:
        return "the hub limits the request rate: wait a few minutes, then run the same command again (it uploads only what is missing)"
    if status is not None and status >= 500:
        return "the hub failed: run the same command again later (it uploads only what is missing)"
    return "fix what the hub names, then run the same command again (it uploads only what is missing)"


def _time_limit_in(error: BaseException) -> HubTimeLimit | None:
    """The :class:`HubTimeLimit` that ``error`` is or was raised from (a library may wrap it)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, HubTimeLimit):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


@contextmanager
def hub_call(repo_id: str, doing: str, token_env: str) -> Iterator[None]:
    """Turn a failing hub call into :class:`PublishError`: one line naming ``repo_id``, what was being done
    (``doing``) and what to do. Other errors (a local file that cannot be read) pass unchanged."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        yield
    except Exception as e:
        limit = _time_limit_in(e)
        if limit is not None:
            raise PublishError(f"publish to {repo_id}: {doing} {limit.reason}; {limit.todo}") from None
        if isinstance(e, HfHubHTTPError):
            status = getattr(getattr(e, "response", None), "status_code", None)
            raise PublishError(
                f"publish to {repo_id}: {doing} failed ({_first_line(e)}); {_refusal(status, repo_id, token_env)}"
            ) from None
        if isinstance(e, _network_errors()):
            raise PublishError(
                f"publish to {repo_id}: {doing} failed, the hub did not answer ({type(e).__name__}: {_first_line(e)}); "
                "check the network (and HF_ENDPOINT if set), then run the same command again "
                "(it uploads only what is missing)"
            ) from None
        raise


# every hub request's limits for a connection and for each byte: huggingface_hub sends its
# requests without any (a hub that takes the connection and never answers would hold publish
# for ever); a run also bounds each request's total time and its own (:class:`_Run`)
HUB_TIMEOUTS_S = {"connect": 30.0, "read": 120.0, "write": 120.0, "pool": 30.0}


@dataclass(frozen=True)
class _Run:
    """The time limits of the publish run in progress: ``request_s`` per request, and the run's
    ``deadline_s``, which ends at ``ends_at`` (``time.monotonic()``)."""

    request_s: float
    deadline_s: float
    ends_at: float

    def left_s(self) -> float:
        return self.ends_at - time.monotonic()


_RUN: _Run | None = None  # outside a run, hub requests keep only HUB_TIMEOUTS_S
# the run a hub call belongs to, kept with the call: one given up on at the deadline still finds
# its run (out of time) after the run has ended; threads a library starts find the global above
_CALL_RUN: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("sedsynth_publish_run", default=None)


def _current_run() -> _Run | None:
    return _CALL_RUN.get() or _RUN


class _RequestClock(threading.local):
    ends_at: float | None = None  # when the request this thread is sending or reading must be done


_clock = _RequestClock()


@contextmanager
def _request_ends_at(ends_at: float) -> Iterator[None]:
    previous, _clock.ends_at = _clock.ends_at, ends_at
    try:
        yield
    finally:
        _clock.ends_at = previous


def _within(timeout: float | None, error: type[Exception]) -> float | None:
    """A socket operation's ``timeout`` cut to what the current request has left; ``error`` once nothing is left.

    A per-operation limit starts again with every byte, so a hub dripping its answer would never
    reach it: the request's end, fixed when it was sent, is what bounds its total time."""
    ends_at = _clock.ends_at
    if ends_at is None:
        return timeout
    left = ends_at - time.monotonic()
    if left <= 0:
        raise error("the request's time is up")
    return left if timeout is None else min(timeout, left)


def _bounded_network():
    """A network backend for httpcore2 whose every connect, read and write ends by the current
    request's end (:func:`_within`)."""
    import httpcore2

    class Stream(httpcore2.NetworkStream):
        def __init__(self, stream):
            self._stream = stream

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self._stream.read(max_bytes, _within(timeout, httpcore2.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self._stream.write(buffer, _within(timeout, httpcore2.WriteTimeout))

        def close(self) -> None:
            self._stream.close()

        def start_tls(self, ssl_context, server_hostname=None, timeout=None):
            return Stream(self._stream.start_tls(ssl_context, server_hostname, _within(timeout, httpcore2.ConnectTimeout)))

        def get_extra_info(self, info: str):
            return self._stream.get_extra_info(info)

    class Backend(httpcore2.NetworkBackend):
        def __init__(self, backend):
            self._backend = backend

        def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
            return Stream(
                self._backend.connect_tcp(host, port, _within(timeout, httpcore2.ConnectTimeout), local_address, socket_options)
            )

        def connect_unix_socket(self, path, timeout=None, socket_options=None):
            return Stream(self._backend.connect_unix_socket(path, _within(timeout, httpcore2.ConnectTimeout), socket_options))

        def sleep(self, seconds: float) -> None:
            self._backend.sleep(seconds)

    return Backend


def request_budget_s(request_timeout_s: float, body_bytes: int | str | None) -> float:
    """The seconds a request may take: ``request_timeout_s``, plus one for each
    :data:`UPLOAD_FLOOR_BYTES_S` bytes of its body (its ``Content-Length``; none, or not a
    number, adds nothing)."""
    try:
        body = max(0, int(body_bytes or 0))
    except ValueError:
        body = 0
    return request_timeout_s + body / UPLOAD_FLOOR_BYTES_S


def _deadline_reached(run: _Run) -> HubTimeLimit:
    return HubTimeLimit(
        f"stopped at the run's time limit of {run.deadline_s:g} s (--deadline-s)",
        "run the same command again, on a slow link with a larger --deadline-s (it uploads only what is missing)",
    )


def _out_of_time(run: _Run, ends_at: float, started: float, read_s: float, error: Exception) -> HubTimeLimit:
    """What a request that ran out of time (``error``, an ``httpx2`` timeout; ``read_s``, the
    wait allowed for a byte) tells the user."""
    if ends_at >= run.ends_at and time.monotonic() >= run.ends_at:
        return _deadline_reached(run)
    return HubTimeLimit(
        f"failed, the hub did not answer in time ({type(error).__name__} after {time.monotonic() - started:.1f} s; "
        f"a request may take {run.request_s:g} s in all, --request-timeout-s, and wait "
        f"{read_s:g} s for a byte)",
        "check the network (and HF_ENDPOINT if set), then run the same command again (it uploads only what is missing)",
    )


def _asked_wait_s(response) -> int | None:
    """The seconds a hub answer asks to wait before a retry, as huggingface_hub reads them
    (a spent rate limit's reset, else ``Retry-After`` in seconds); ``None`` when it asks none."""
    from huggingface_hub.utils import parse_ratelimit_headers

    if response.status_code == 429:
        info = parse_ratelimit_headers(response.headers)
        if info is not None and info.remaining == 0:
            return info.reset_in_seconds
    value = (response.headers.get("retry-after") or "").strip()
    return int(value) if value.isdigit() else None


def _refuse_waits_past_the_deadline(response) -> None:
    """A response hook: a retried answer whose wait would pass the run's deadline ends the run
    now (huggingface_hub would sleep it out: 31 years for ``Retry-After: 1000000000``)."""
    run = _current_run()
    if run is None or response.status_code not in RETRIED_STATUSES:
        return
    wait = _asked_wait_s(response)
    left = run.left_s()
    if wait is None or wait + 1 <= left:  # huggingface_hub sleeps one second more than asked
        return
    try:
        when = f"after {datetime.now(timezone.utc) + timedelta(seconds=wait):%Y-%m-%d %H:%M} UTC"
    except OverflowError:
        when = f"in {wait} s"
    raise HubTimeLimit(
        f"stopped: the hub answered {response.status_code} and asks to wait {wait} s before retrying, more than the "
        f"{max(0.0, left):.0f} s left of the run's time limit ({run.deadline_s:g} s, --deadline-s)",
        f"run the same command again {when} (it uploads only what is missing)",
    )


def bound_hub_requests(timeouts_s: dict[str, float] | None = None) -> None:
    """Make huggingface_hub's HTTP client give each request ``timeouts_s`` (default
    :data:`HUB_TIMEOUTS_S`) wherever it sets none, keeping the hub's own request hooks (offline
    mode, request ids). A request past a limit then fails as a network error (:func:`hub_call`).

    During a publish run (:func:`publish`) each request also ends by its ``request_timeout_s``
    and by the run's deadline, whatever the hub sends meanwhile, and is not retried once out of
    time; a wait the hub asks for past the deadline ends the run (:class:`HubTimeLimit`).
    """
    import httpx2
    from huggingface_hub import get_session, set_client_factory

    limits = dict(timeouts_s or HUB_TIMEOUTS_S)
    Backend = _bounded_network()

    class BoundedTransport(httpx2.HTTPTransport):
        def __init__(self, **options):
            super().__init__(**options)
            # httpx2 takes no network backend: the pool it built gets one that keeps each request's end
            # (were the pool kept otherwise, the per-operation limits and the run's deadline still hold)
            backend = getattr(getattr(self, "_pool", None), "_network_backend", None)
            if backend is not None:
                self._pool._network_backend = Backend(backend)

        def handle_request(self, request):
            given = request.extensions.get("timeout") or {}
            request.extensions["timeout"] = {k: given.get(k) if given.get(k) is not None else v for k, v in limits.items()}
            run = _current_run()
            if run is None:
                return super().handle_request(request)
            started = time.monotonic()
            ends_at = min(started + request_budget_s(run.request_s, request.headers.get("content-length")), run.ends_at)
            try:
                with _request_ends_at(ends_at):
                    response = super().handle_request(request)
            except httpx2.TimeoutException as e:
                raise _out_of_time(run, ends_at, started, limits["read"], e) from None
            response.stream = BoundedBody(response.stream, run, ends_at, started)
            return response

    class BoundedBody(httpx2.SyncByteStream):
        """A response body read within its request's end (the hub's answer arrives here, after the headers)."""

        def __init__(self, stream, run: _Run, ends_at: float, started: float):
            self._stream, self._run, self._ends_at, self._started = stream, run, ends_at, started

        def __iter__(self):
            chunks = iter(self._stream)
            while True:
                with _request_ends_at(self._ends_at):
                    try:
                        chunk = next(chunks)
                    except StopIteration:
                        return
                    except httpx2.TimeoutException as e:
                        raise _out_of_time(self._run, self._ends_at, self._started, limits["read"], e) from None
                yield chunk

        def close(self) -> None:
            self._stream.close()

    def client() -> httpx2.Client:
        # a client given a transport leaves out the proxies the environment names (HTTPS_PROXY, NO_PROXY):
        # they are mounted here, bounded alike
        try:
            from httpx2._utils import get_environment_proxies
        except ImportError:
            proxies = {}
        else:
            proxies = get_environment_proxies()
        mounts = {pattern: None if url is None else BoundedTransport(proxy=url) for pattern, url in proxies.items()}
        return httpx2.Client(transport=BoundedTransport(), mounts=mounts, event_hooks=hooks, follow_redirects=True)

    hooks = get_session().event_hooks
    hooks = {
        "request": list(hooks.get("request", [])),
        "response": [h for h in hooks.get("response", []) if h is not _refuse_waits_past_the_deadline]
        + [_refuse_waits_past_the_deadline],
    }
    set_client_factory(client)


@contextmanager
def _run_limits(request_timeout_s: float, deadline_s: float) -> Iterator[_Run]:
    """Bound the hub requests made inside (one run at a time in a process)."""
    global _RUN
    run = _Run(request_timeout_s, deadline_s, time.monotonic() + deadline_s)
    previous, _RUN = _RUN, run
    token = _CALL_RUN.set(run)
    try:
        yield run
    finally:
        _CALL_RUN.reset(token)
        _RUN = previous


T = TypeVar("T")


def _before_deadline(run: _Run, call: Callable[[], T]) -> T:
    """``call()``'s result, or :class:`HubTimeLimit` once the run's deadline has passed while it goes on.

    The call runs in a daemon thread, so what no request limit reaches (an upload through another
    client library, a retry's sleep, a name lookup) cannot hold the run past its deadline; a call
    given up on is left to end by itself or with the process."""
    box: dict[str, object] = {}
    context = contextvars.copy_context()  # huggingface_hub keeps per-call state in context variables

    def work() -> None:
        try:
            box["value"] = context.run(call)
        except BaseException as e:  # handed to the caller below
            box["error"] = e

    worker = threading.Thread(target=work, name="sedsynth-publish-hub-call", daemon=True)
    worker.start()
    worker.join(max(0.0, run.left_s()) + GIVE_UP_GRACE_S)
    if worker.is_alive():
        raise _deadline_reached(run)
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _index(folder: Path) -> dict:
    with open_regular(folder / INDEX, INDEX, follow_links=False) as stream:
        return json.loads(stream.read().decode("utf-8"))


def local_files(folder: Path, index: dict | None = None) -> list[str]:
    """Every regular file to publish, relative to ``folder``: shards (index order), then the rest
    sorted. Links and other special files are never listed (:func:`refuse_special_files`)."""
    shards = [f["path"] for f in (index or _index(folder))["files"]]
    rest, _ = folder_files(folder)
    return shards + [p for p in rest if p not in shards]


def refuse_special_files(folder: Path) -> None:
    """:class:`PublishError` naming the first symbolic link, FIFO, socket or device under ``folder``
    (and how many more), so nothing is uploaded from a folder holding one. A missing folder is
    left to validation, which names what is missing."""
    if not folder.is_dir():
        return
    _, odd = folder_files(folder)
    if odd:
        (rel, why), more = next(iter(odd.items())), len(odd) - 1
        others = f" (and {more} more such entr{'y' if more == 1 else 'ies'})" if more else ""
        raise PublishError(
            f"publish: {folder / rel} {why}{others}; publish uploads regular files only: put a copy of the "
            "file itself there or remove it, then run the same command again (nothing was uploaded)"
        )


def pending(folder: Path, remote_sha256: dict[str, str | None], index: dict | None = None) -> list[str]:
    """Files whose hub copy is missing or differs (shards by their indexed sha256; other files always)."""
    index = index or _index(folder)
    sha = {f["path"]: f["sha256"] for f in index["files"]}
    return [p for p in local_files(folder, index) if p not in sha or remote_sha256.get(p) != sha[p]]


def remote_files(api, repo_id: str) -> dict[str, str | None]:
    """Path -> LFS sha256 (None for non-LFS files) of the hub repo's files; empty for a new repo."""
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        items = api.list_repo_tree(repo_id, repo_type="dataset", recursive=True)
        return {i.path: (i.lfs.sha256 if getattr(i, "lfs", None) else None) for i in items if hasattr(i, "size")}
    except RepositoryNotFoundError:  # also what a token that may not see the repo gets: create_repo then says so
        return {}


def _seconds(value: object, name: str, flag: str, default: float) -> float:
    """``value`` if it is a finite number of seconds above 0, else :class:`PublishError` naming ``flag``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise PublishError(f"{name} is {value!r}: pass a number of seconds above 0 ({flag} {default:g})")
    return float(value)


def publish(
    folder: Path | str,
    repo_id: str,
    *,
    token_env: str = "HF_TOKEN",
    private: bool = False,
    dry_run: bool = False,
    batch_files: int = 50,
    api=None,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    deadline_s: float = DEADLINE_S,
) -> list[str]:
    """Upload what the hub lacks; returns the files uploaded (or, with ``dry_run``, that would be).

    ``batch_files`` (>= 1): shards per commit. ``api``: an ``HfApi``-like object (default: one
    made with the token). ``request_timeout_s``: the longest one hub request may take, from
    sending it to the last byte of the answer (plus :func:`request_budget_s`'s allowance for the
    body it sends). ``deadline_s``: the longest the run may spend on
    the hub. A failing hub call, one out of time, or a folder holding a link or special file
    raises :class:`PublishError` (one line).
    """
    if isinstance(batch_files, bool) or not isinstance(batch_files, int) or batch_files < 1:
        raise PublishError(
            f"batch_files is {batch_files!r}: pass a whole number of shards per commit, 1 or more (--batch-files 50)"
        )
    request_timeout_s = _seconds(request_timeout_s, "request_timeout_s", "--request-timeout-s", REQUEST_TIMEOUT_S)
    deadline_s = _seconds(deadline_s, "deadline_s", "--deadline-s", DEADLINE_S)
    folder = Path(folder)
    refuse_special_files(folder)  # before validation: one line, and nothing behind a link is read
    validate(folder)
    bound_hub_requests()
    token = os.environ.get(token_env) or None
    if api is None and (token or not dry_run):
        if not token:
            raise PublishError(
                f"${token_env} is not set: create a write token at https://huggingface.co/settings/tokens "
                f"and export {token_env}=..., or pass --dry-run to list what would be uploaded"
            )
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    index = _index(folder)
    with _run_limits(request_timeout_s, deadline_s) as run:
        with hub_call(repo_id, "listing the repo's files", token_env):
            remote = _before_deadline(run, lambda: remote_files(api, repo_id)) if api is not None else {}
        todo = pending(folder, remote, index)
        if dry_run:
            for p in todo:
                print(f"would upload {p} ({(folder / p).stat().st_size / 1e6:.1f} MB)")
            print(
                f"{len(todo)} files, {sum((folder / p).stat().st_size for p in todo) / 1e6:.1f} MB to {repo_id}"
                + ("" if api is not None else " (no token: the hub was not asked what it already has)")
            )
            return todo
        with hub_call(repo_id, "creating the dataset repo", token_env):
            _before_deadline(run, lambda: api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True))
        shard_paths = {f["path"] for f in index["files"]}
        shards = [p for p in todo if p in shard_paths]
        rest = [p for p in todo if p not in shard_paths]
        batches = [shards[i : i + batch_files] for i in range(0, len(shards), batch_files)] + ([rest] if rest else [])
        for n, batch in enumerate(batches, 1):
            with hub_call(repo_id, f"uploading batch {n} of {len(batches)}", token_env):
                _before_deadline(
                    run,
                    lambda: api.upload_folder(
                        repo_id=repo_id,
                        folder_path=folder,
                        repo_type="dataset",
                        allow_patterns=batch,
                        commit_message=f"sedsynth publish: batch {n} of {len(batches)} ({len(batch)} files)",
                    ),
                )
            print(f"uploaded batch {n} of {len(batches)} ({len(batch)} files)")
    return todo
