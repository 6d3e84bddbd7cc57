"""``publish`` against hubs that hold it: each ends in one line within its stated limit.

A ``Retry-After`` past the run's deadline stops at once and says when to retry; a hub that
drips its answer a byte at a time, or takes the connection and never answers, is cut at
``--request-timeout-s`` and not retried; a hub call still going at ``--deadline-s`` is given up.
The hubs are local servers on 127.0.0.1 (no network is used), each stopping by itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.shards import publish as pub
from sedsynth.cli import main


@pytest.fixture
def folder(tmp_path: Path, monkeypatch) -> Path:
    """A dataset folder of two shards and a card (its validation is another test's business)."""
    root = tmp_path / "dataset"
    (root / "data").mkdir(parents=True)
    files = []
    for name in ("train-00000-of-00002.parquet", "train-00001-of-00002.parquet"):
        data = name.encode()
        (root / "data" / name).write_bytes(data)
        files.append({"path": f"data/{name}", "sha256": hashlib.sha256(data).hexdigest()})
    (root / "index.json").write_text(json.dumps({"files": files}))
    (root / "README.md").write_text("card\n")
    monkeypatch.setattr(pub, "validate", lambda folder: None)
    return root


def _cli_against(url: str, monkeypatch) -> None:
    """Make ``sedsynth publish`` talk to the hub at ``url``."""
    from huggingface_hub import HfApi

    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.setattr("huggingface_hub.HfApi", lambda token: HfApi(endpoint=url, token=token))


class _AsksToWait(BaseHTTPRequestHandler):
    """Every request: ``status`` with ``Retry-After: wait_s``; counts the requests."""

    status, wait_s, seen = 429, "1000000000", []

    def _answer(self) -> None:
        type(self).seen.append(self.path)
        self.send_response(self.status)
        self.send_header("Retry-After", self.wait_s)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_HEAD = _answer

    def log_message(self, *args) -> None:
        pass


def _serve(handler) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_a_retry_after_past_the_deadline_stops_at_once_and_says_when(folder, monkeypatch, capsys) -> None:
    """``Retry-After: 1000000000`` had publish sleep 31 years."""
    handler = type("Handler", (_AsksToWait,), {"status": 429, "wait_s": "1000000000", "seen": []})
    server, url = _serve(handler)
    _cli_against(url, monkeypatch)
    try:
        start = time.monotonic()
        code = main(["publish", str(folder), "--repo-id", "me/sed", "--deadline-s", "3600"])
        took = time.monotonic() - start
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(
        "sedsynth publish: error: publish to me/sed: listing the repo's files stopped: the hub answered 429 "
        "and asks to wait 1000000000 s before retrying"
    ), err
    assert (
        "--deadline-s" in err and "run the same command again after 20" in err and "UTC (it uploads only what is missing)" in err
    )
    assert took < 10 and len(handler.seen) == 1, (took, handler.seen)


def test_waits_that_add_up_past_the_deadline_stop_at_it(folder, monkeypatch) -> None:
    """Each ``Retry-After: 1`` fits, but not the next one once the run's time is nearly spent."""
    from huggingface_hub import HfApi

    handler = type("Handler", (_AsksToWait,), {"status": 503, "wait_s": "1", "seen": []})
    server, url = _serve(handler)
    try:
        start = time.monotonic()
        with pytest.raises(
            pub.PublishError,
            match=r"stopped: the hub answered 503 and asks to wait 1 s before retrying, more than the "
            r"\d+ s left of the run's time limit \(2.5 s, --deadline-s\)",
        ):
            pub.publish(folder, "me/sed", api=HfApi(endpoint=url, token="hf_x"), deadline_s=2.5)
        took = time.monotonic() - start
    finally:
        server.shutdown()
        server.server_close()
    assert took < 2.5 + 1 and len(handler.seen) == 2, (took, handler.seen)


def _drip_server(gap_s: float, stop: threading.Event, headers_at_once: bool) -> tuple[socket.socket, list[float]]:
    """A hub that answers every connection a byte every ``gap_s`` seconds (a valid answer, were it
    ever finished), with ``headers_at_once`` only its body; returns the listener and the times
    connections came in."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    body = json.dumps([]).encode() + b" " * 200
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    connections: list[float] = []

    def drip(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(1.0)
            try:
                conn.recv(65536)  # the request (small: a GET)
                if headers_at_once:
                    conn.sendall(head)
                for byte in body if headers_at_once else head + body:
                    if stop.wait(gap_s):
                        return
                    conn.sendall(bytes([byte]))
            except OSError:  # the client gave up
                return

    def serve() -> None:
        while not stop.is_set() and len(connections) < 20:
            try:
                conn, _ = listener.accept()
            except OSError:  # the accept timed out, or the listener closed
                continue
            connections.append(time.monotonic())
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener, connections


@pytest.mark.parametrize("headers_at_once", [False, True])
def test_a_hub_that_drips_its_answer_is_cut_at_the_request_limit(folder, monkeypatch, capsys, headers_at_once) -> None:
    """A read limit starts again with every byte: a byte each 0.2 s would never reach it."""
    stop = threading.Event()
    listener, connections = _drip_server(0.2, stop, headers_at_once)
    _cli_against(f"http://127.0.0.1:{listener.getsockname()[1]}", monkeypatch)
    try:
        start = time.monotonic()
        code = main(["publish", str(folder), "--repo-id", "me/sed", "--request-timeout-s", "1.5"])
        took = time.monotonic() - start
    finally:
        stop.set()
        listener.close()
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert re.match(
        r"sedsynth publish: error: publish to me/sed: listing the repo's files failed, the hub did not answer in time "
        r"\(ReadTimeout after \d+\.\d s; a request may take 1.5 s in all, --request-timeout-s",
        err,
    ), err
    assert err.strip().endswith("then run the same command again (it uploads only what is missing)"), err
    assert 1.4 < took < 5 and len(connections) == 1, (took, connections)  # not retried


def test_a_hub_that_takes_the_connection_and_never_answers_is_cut_at_the_request_limit(folder) -> None:
    """With the default 120 s wait for a byte and five retries this took 745 s."""
    from huggingface_hub import HfApi

    listener = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog) and never answers
    try:
        api = HfApi(endpoint=f"http://127.0.0.1:{listener.getsockname()[1]}", token="hf_not_a_real_token")
        start = time.monotonic()
        with pytest.raises(
            pub.PublishError,
            match=r"^publish to me/sed: listing the repo's files failed, the hub did not answer in time "
            r"\(ReadTimeout after \d+\.\d s; a request may take 1 s in all",
        ):
            pub.publish(folder, "me/sed", api=api, request_timeout_s=1)
        assert time.monotonic() - start < 4
    finally:
        listener.close()


def test_a_hub_call_still_going_at_the_deadline_is_given_up(folder) -> None:
    """What no request limit reaches (another client library's upload, a retry's sleep) ends at ``deadline_s``."""
    release = threading.Event()

    class Stuck:
        def list_repo_tree(self, repo_id, repo_type, recursive):
            release.wait(30)  # let go at the end of the test
            return []

    try:
        start = time.monotonic()
        with pytest.raises(pub.PublishError) as raised:
            pub.publish(folder, "me/sed", api=Stuck(), deadline_s=0.5)
        took = time.monotonic() - start
    finally:
        release.set()
    message = str(raised.value)
    assert message.startswith(
        "publish to me/sed: listing the repo's files stopped at the run's time limit of 0.5 s (--deadline-s)"
    ), message
    assert message.endswith(
        "run the same command again, on a slow link with a larger --deadline-s (it uploads only what is missing)"
    )
    assert "\n" not in message
    assert took < 0.5 + pub.GIVE_UP_GRACE_S + 1.5, took


@pytest.mark.parametrize(
    "name, value",
    [
        ("request_timeout_s", 0),
        ("request_timeout_s", float("nan")),
        ("deadline_s", -1.0),
        ("deadline_s", float("inf")),
        ("deadline_s", "60"),
        ("request_timeout_s", True),
    ],
)
def test_a_time_limit_that_is_not_a_positive_number_is_refused(folder, name, value, capsys) -> None:
    class Hub:
        def list_repo_tree(self, *args, **kwargs):
            raise AssertionError("the hub was asked")

    with pytest.raises(pub.PublishError, match=rf"^{name} is .*: pass a number of seconds above 0 \(--{name.replace('_', '-')} "):
        pub.publish(folder, "me/sed", api=Hub(), **{name: value})
    assert main(["publish", str(folder), "--repo-id", "me/sed", "--dry-run", "--deadline-s", "nan"]) == 2
    assert "pass a number of seconds above 0 (--deadline-s 21600)" in capsys.readouterr().err


def test_the_bounded_client_still_goes_through_the_proxy_the_environment_names(folder, monkeypatch) -> None:
    """A client given its own transport leaves out the environment's proxies: a hub behind ``HTTP_PROXY`` was unreachable."""
    from huggingface_hub import HfApi

    proxy = type("Handler", (_AsksToWait,), {"status": 401, "wait_s": "0", "seen": []})  # answers as the hub, for any host
    server, url = _serve(proxy)
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("HTTP_PROXY", url)
    try:
        with pytest.raises(
            pub.PublishError, match=r"^publish to me/sed: listing the repo's files failed \(.*401.*\); the token in \$HF_TOKEN"
        ):
            pub.publish(folder, "me/sed", api=HfApi(endpoint="http://hub.invalid", token="hf_x"))
    finally:
        server.shutdown()
        server.server_close()
    assert [p.split("/api/")[0] for p in proxy.seen] == ["http://hub.invalid"], proxy.seen


def test_a_request_that_sends_a_body_gets_time_for_it() -> None:
    """A 500 MB shard over a 2 Mbit/s uplink is not cut at the 300 s an answer gets."""
    assert pub.request_budget_s(300, None) == pub.request_budget_s(300, "not a number") == pub.request_budget_s(300, "0") == 300
    assert pub.request_budget_s(300, str(500 * 10**6)) == 300 + 500 * 10**6 / pub.UPLOAD_FLOOR_BYTES_S > 500 * 10**6 / (2e6 / 8)
