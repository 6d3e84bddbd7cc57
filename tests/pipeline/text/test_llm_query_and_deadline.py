"""The LLM client against endpoints that take their key in the URL's query, servers that trickle
their answer, and a cache path that is not a regular file (pipeline/text/llm.py, the captions stage).

Requests go over real HTTP to a small server on 127.0.0.1 (``Endpoint``) that records each
request's path and query and answers at once or a byte at a time; every answer it drips stops by
itself after :data:`DRIP_FOR_S`. The key guard of tests/pipeline/text/test_llm_endpoint.py (no API
key in any file, output or log) runs here too.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.config.params import LLMParams
from pipeline.files import NotRegularFileError
from pipeline.text import llm
from pipeline.text.llm import Completer, LLMError, ResponseCache, redacted_url
from sedsynth.cli import main as cli_main
from tests.conftest import ROOT
from tests.pipeline.text.test_llm_endpoint import KEY_ENV, closed_port, completion_body, key_guard  # noqa: F401  (autouse)
from tests.special_files import fifo

SECRET = "qk-Vr7sLm20Xq"  # a key an endpoint takes in the query
DRIP_EVERY_S = 0.1  # well inside the client's per-read timeout, so only a deadline for the whole request ends it
DRIP_FOR_S = 3.0  # a dripping answer stops (the connection closes) after this long


class Endpoint:
    """A chat-completions server on 127.0.0.1: ``mode`` "ok" answers at once, "fail" with HTTP 500,
    "drip-body" sends the headers then the body a byte at a time, "drip-headers" the headers a byte
    at a time. ``requests`` holds each request's path (query included)."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.requests: list[str] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                endpoint.requests.append(self.path)
                body = json.dumps(completion_body("fine")).encode()
                status = 500 if endpoint.mode == "fail" else 200
                head = (
                    f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n"
                ).encode()
                try:
                    if endpoint.mode == "drip-body":
                        self.wfile.write(head)
                        self._drip(body)
                    elif endpoint.mode == "drip-headers":
                        self._drip(head[:-2] + b"X-Slow: " + b"a" * 1000 + b"\r\n\r\n" + body)
                    else:
                        self.wfile.write(head + body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, as it should

            def _drip(self, data: bytes) -> None:
                end = time.monotonic() + DRIP_FOR_S
                for i in range(len(data)):
                    if time.monotonic() > end:
                        return
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    time.sleep(DRIP_EVERY_S)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def endpoint():
    e = Endpoint()
    yield e
    e.stop()


def params(tmp_path, base_url: str, **kw) -> LLMParams:
    return LLMParams(
        **{
            "base_url": base_url,
            "model": "m",
            "api_key_env": KEY_ENV,
            "cache": str(tmp_path / "cache.jsonl"),
            "backoff_s": 0.01,
            "requests_per_minute": 0,
            **kw,
        }
    )


def everything_shown(error: BaseException, caplog) -> str:
    """The exception as a traceback prints it, and every log record (any logger, any level) as a handler shows it."""
    fmt = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "".join(traceback.format_exception(error)) + "".join(fmt.format(r) + repr(r.args) for r in caplog.records)


# --------------------------------------------------------------------------- a key in base_url's query


def test_redacted_url_hides_every_query_value() -> None:
    assert redacted_url("https://h/v1?api_key=abc") == "https://h/v1?api_key=***"
    assert (
        redacted_url("https://h/v1?key=a&api-version=2024-06-01&sig=s%2Fx&empty=")
        == "https://h/v1?key=***&api-version=***&sig=***&empty="
    )
    assert redacted_url("https://u:pw@h/v1?token=t#frag") == "https://u:***@h/v1?token=***#***"
    assert redacted_url("https://h/v1?bare-key-value") == "https://h/v1?***"
    assert redacted_url("http://localhost:8000/v1") == "http://localhost:8000/v1"


def test_split_query_keeps_the_path_and_decodes_the_parameters() -> None:
    assert llm.split_query("https://h/v1?api_key=a%2Bb&api-version=1#x") == (
        "https://h/v1",
        {"api_key": "a+b", "api-version": "1"},
    )
    assert llm.split_query("https://h/v1") == ("https://h/v1", {})


def test_a_query_in_base_url_is_sent_as_the_query_after_the_path(endpoint, tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)  # the HTTP libraries log every request's URL (httpx2 at INFO)
    completer = Completer(params(tmp_path, f"{endpoint.url}?api_key={SECRET}&api-version=2024-06-01"))
    assert completer.complete("p", str.strip) == "fine"
    path, _, query = endpoint.requests[0].partition("?")
    assert path == "/v1/chat/completions"
    assert urllib.parse.parse_qs(query) == {"api_key": [SECRET], "api-version": ["2024-06-01"]}
    logged = "\n".join(logging.Formatter("%(name)s %(message)s").format(r) for r in caplog.records)
    assert "/v1/chat/completions?api_key=***&api-version=***" in logged  # httpx2's request line, redacted
    assert SECRET not in logged
    completer.close()


@pytest.mark.parametrize("answer", ["fail", "nothing listens"])
def test_a_query_key_is_never_shown(endpoint, tmp_path, caplog, answer) -> None:
    caplog.set_level(logging.DEBUG)
    endpoint.mode = "fail"
    base = endpoint.url if answer == "fail" else f"http://127.0.0.1:{closed_port()}/v1"
    url = base.replace("http://", "http://alice:pw-88Zr@") + f"?api_key={SECRET}"
    with pytest.raises(LLMError) as e:
        Completer(params(tmp_path, url, max_retries=1)).complete("p", str.strip)
    assert base.replace("http://", "http://alice:***@") + "?api_key=***" in str(e.value)
    shown = everything_shown(e.value, caplog)
    assert SECRET not in shown and "pw-88Zr" not in shown


# --------------------------------------------------------------------------- a deadline for the whole request


@pytest.mark.parametrize("mode", ["drip-body", "drip-headers"])
def test_a_server_that_trickles_its_answer_is_cut_off_at_timeout_s(endpoint, tmp_path, mode) -> None:
    endpoint.mode = mode
    completer = Completer(params(tmp_path, endpoint.url, timeout_s=0.6, max_retries=0))
    start = time.monotonic()
    with pytest.raises(LLMError) as e:
        completer.complete("p", str.strip)
    took = time.monotonic() - start
    message = str(e.value)
    assert took < 0.6 + 1.0, f"a request trickling its answer ran {took:.1f} s against timeout_s 0.6"
    assert "\n" not in message and "after 1 attempts" in message and "no answer within 0.6 s" in message
    assert "timeout_s" in message
    assert not (tmp_path / "cache.jsonl").exists()
    completer.close()


def test_each_retry_gets_its_own_deadline(endpoint, tmp_path, caplog) -> None:
    endpoint.mode = "drip-body"
    completer = Completer(params(tmp_path, endpoint.url, timeout_s=0.5, max_retries=1))
    start = time.monotonic()
    with pytest.raises(LLMError, match="after 2 attempts"):
        completer.complete("p", str.strip)
    assert time.monotonic() - start < 2 * 0.5 + 1.5
    assert len(endpoint.requests) == 2
    assert "no answer within 0.5 s" in "\n".join(r.getMessage() for r in caplog.records if r.name == "pipeline.text.llm")
    completer.close()


def test_an_answer_within_the_deadline_is_taken_and_the_client_can_be_closed_and_reopened(endpoint, tmp_path) -> None:
    completer = Completer(params(tmp_path, endpoint.url, timeout_s=5))
    assert completer.complete("a", str.strip) == "fine"
    completer.close()
    assert completer.complete("b", str.strip) == "fine"  # a new request starts the thread again
    completer.close()
    assert len(endpoint.requests) == 2


# --------------------------------------------------------------------------- captions.llm.cache must be a file


def test_a_fifo_cache_is_refused_before_it_is_read(tmp_path) -> None:
    path = fifo(tmp_path / "cache.jsonl")
    start = time.monotonic()
    with pytest.raises(NotRegularFileError, match=r"captions\.llm\.cache .*cache\.jsonl is a FIFO"):
        ResponseCache(path)
    assert time.monotonic() - start < 0.4  # a reader that opened it would wait for the FIFO's release at 0.5 s
    with pytest.raises(NotRegularFileError):
        Completer(LLMParams(model="m", api_key_env=None, cache=str(path)))


def test_a_folder_cache_is_refused(tmp_path) -> None:
    (tmp_path / "cache.jsonl").mkdir()
    with pytest.raises(NotRegularFileError, match="is a folder"):
        ResponseCache(tmp_path / "cache.jsonl")


def test_a_fifo_put_at_the_cache_path_after_reading_is_not_written_to(tmp_path) -> None:
    cache = ResponseCache(tmp_path / "cache.jsonl")  # no file yet: an empty cache
    fifo(tmp_path / "cache.jsonl")
    with pytest.raises(NotRegularFileError, match="not a regular file"):
        cache.put("m", "p", "r")


@pytest.mark.parametrize(
    "setting, role",
    [
        (["captions.templates=llm"], "captions.llm.cache"),
        (["captions.phrases=llm"], "captions.llm.cache"),
        (["captions.timeline=true"], "captions.llm.cache"),
        (["captions.templates={fifo}"], "captions.templates"),
    ],
)
def test_the_captions_stage_refuses_a_fifo_in_one_line(tmp_path, capsys, setting, role) -> None:
    path = fifo(tmp_path / "named")
    sets = [s.format(fifo=path) for s in setting]
    if role == "captions.llm.cache":
        sets.append(f"captions.llm.cache={path}")
    argv = [
        "captions",
        "--params",
        str(ROOT / "params.yaml"),
        "--set",
        f"mix.out_dir={tmp_path / 'mix'}",
        "--set",
        f"captions.out_dir={tmp_path / 'captions'}",
    ]
    for s in sets:
        argv += ["--set", s]
    capsys.readouterr()
    start = time.monotonic()
    code = cli_main(argv)
    err = capsys.readouterr().err
    assert time.monotonic() - start < 0.4
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines() == [
        f"sedsynth captions: error: {role} {path} is not a regular file (a folder, FIFO or device); point it at a file"
    ]
