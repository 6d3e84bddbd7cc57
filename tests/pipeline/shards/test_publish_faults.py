"""``publish`` when the hub says no or does not answer: one :class:`PublishError` line naming the
repo, what was being done and what to do; a batch size below 1 is refused before anything is sent.

The hub is a fake ``api`` object raising huggingface_hub's own errors, and once the real
``HfApi`` against a local server that refuses every token (no network is used).
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
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


def _response(status: int):
    import httpx2

    return httpx2.Response(status, request=httpx2.Request("POST", "https://huggingface.co/api/repos/create"))


class Hub:
    """An HfApi stand-in: an empty repo whose ``fail_at`` call raises ``error``."""

    def __init__(self, fail_at: str, error: BaseException):
        self.fail_at, self.error, self.uploads = fail_at, error, []

    def _maybe_fail(self, call: str) -> None:
        if call == self.fail_at:
            raise self.error

    def list_repo_tree(self, repo_id, repo_type, recursive):
        self._maybe_fail("list_repo_tree")
        return []

    def create_repo(self, repo_id, repo_type, private, exist_ok):
        self._maybe_fail("create_repo")

    def upload_folder(self, repo_id, folder_path, repo_type, allow_patterns, commit_message):
        self._maybe_fail("upload_folder")
        self.uploads.append(list(allow_patterns))


def _hub_http_error(status: int, message: str):
    from huggingface_hub.errors import HfHubHTTPError

    return HfHubHTTPError(message, response=_response(status))


def _cases():
    import httpx2

    return [
        (
            "create_repo",
            _hub_http_error(401, "401 Client Error: Unauthorized\n\nInvalid credentials"),
            "creating the dataset repo failed (401 Client Error: Unauthorized); the token in $HF_TOKEN is not valid",
        ),
        (
            "create_repo",
            _hub_http_error(403, "403 Forbidden: you may not create a repo under acme"),
            "the token in $HF_TOKEN may not write to me/sed",
        ),
        ("upload_folder", _hub_http_error(429, "429 Too Many Requests"), "wait a few minutes, then run the same command again"),
        (
            "upload_folder",
            _hub_http_error(503, "503 Service Unavailable"),
            "uploading batch 1 of 2 failed (503 Service Unavailable)",
        ),
        (
            "list_repo_tree",
            httpx2.ConnectError("[Errno 111] Connection refused"),
            "listing the repo's files failed, the hub did not answer (ConnectError: [Errno 111] Connection refused); check the network",
        ),
        ("upload_folder", httpx2.ReadTimeout("The read operation timed out"), "the hub did not answer (ReadTimeout"),
        ("create_repo", ConnectionResetError(104, "Connection reset by peer"), "the hub did not answer (ConnectionResetError"),
    ]


@pytest.mark.parametrize("case", range(7))
def test_a_hub_that_refuses_or_does_not_answer_is_one_line(folder, case) -> None:
    call, error, expected = _cases()[case]
    with pytest.raises(pub.PublishError) as raised:
        pub.publish(folder, "me/sed", batch_files=2, api=Hub(call, error))
    message = str(raised.value)
    assert message.startswith("publish to me/sed: ") and expected in message, message
    assert "\n" not in message
    assert "(it uploads only what is missing)" in message or "token" in message


def test_the_cli_prints_a_hub_failure_as_one_line(folder, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    hub = Hub("create_repo", _hub_http_error(401, "401 Client Error: Unauthorized"))
    monkeypatch.setattr("huggingface_hub.HfApi", lambda token: hub)
    code = main(["publish", str(folder), "--repo-id", "me/sed"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("sedsynth publish: error: publish to me/sed: "), (
        err
    )


class _Refuses(BaseHTTPRequestHandler):
    """Every request: 401, as the hub answers a token it does not know."""

    def _refuse(self) -> None:
        body = json.dumps({"error": "Invalid username or password."}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_HEAD = _refuse

    def log_message(self, *args) -> None:
        pass


def test_the_real_client_against_a_hub_that_refuses_the_token(folder) -> None:
    from huggingface_hub import HfApi

    server = HTTPServer(("127.0.0.1", 0), _Refuses)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        api = HfApi(endpoint=f"http://127.0.0.1:{server.server_address[1]}", token="hf_not_a_real_token")
        with pytest.raises(
            pub.PublishError,
            match=r"^publish to me/sed: listing the repo's files failed \(.*401 Unauthorized.*\); the token in \$HF_TOKEN is not valid",
        ):
            pub.publish(folder, "me/sed", api=api)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("batch_files", [0, -1, 1.5, True])
def test_a_batch_below_one_file_is_refused_before_anything_is_sent(folder, batch_files) -> None:
    hub = Hub("", RuntimeError())
    with pytest.raises(pub.PublishError, match="1 or more"):
        pub.publish(folder, "me/sed", batch_files=batch_files, api=hub)
    assert hub.uploads == []
    assert pub.publish(folder, "me/sed", batch_files=1, api=hub) and hub.uploads == [
        ["data/train-00000-of-00002.parquet"],
        ["data/train-00001-of-00002.parquet"],
        ["README.md", "index.json"],
    ]


def test_an_unreadable_local_file_is_not_taken_for_a_hub_error(folder) -> None:
    hub = Hub("upload_folder", PermissionError(13, "Permission denied", str(folder / "README.md")))
    with pytest.raises(PermissionError):  # the command's own handler names the file and what to do
        pub.publish(folder, "me/sed", api=hub)


def test_a_hub_that_takes_the_connection_and_never_answers_is_one_line(folder, monkeypatch) -> None:
    """huggingface_hub sends its requests without a time limit: publish gives each one."""
    import socket
    import time

    from huggingface_hub import HfApi

    listener = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog) and never answers
    monkeypatch.setattr(pub, "HUB_TIMEOUTS_S", {"connect": 1.0, "read": 1.0, "write": 1.0, "pool": 1.0})
    try:
        api = HfApi(endpoint=f"http://127.0.0.1:{listener.getsockname()[1]}", token="hf_not_a_real_token")
        start = time.monotonic()
        with pytest.raises(
            pub.PublishError, match=r"^publish to me/sed: listing the repo's files failed, the hub did not answer"
        ):
            pub.publish(folder, "me/sed", api=api)
        assert time.monotonic() - start < 60
    finally:
        listener.close()
