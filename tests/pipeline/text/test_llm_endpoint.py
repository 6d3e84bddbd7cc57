"""The LLM client (pipeline/text/llm.py) and the LLM paths of the captions stage, with the real
``openai`` client over real HTTP against a scripted OpenAI-compatible server on 127.0.0.1.

The server (``FakeLLM``) answers ``POST /v1/chat/completions`` from a script of replies (then a
fallback), records every request (path, headers, JSON body) and can delay, fail with a status,
or send bodies that are not chat completions. An autouse guard checks after every test that
the API key never reached a file under ``tmp_path``, stdout/stderr or a log record.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.config.params import LLMParams
from pipeline.schema import Caption, LabelPhrase, MixtureRecipe, from_table
from pipeline.stages import captions
from pipeline.text import templates
from pipeline.text.label_phrases import LABELS_PER_PROMPT, PHRASE_PROMPT, llm_phrase_variants
from pipeline.text.llm import Completer, LLMError, MalformedCompletion, ResponseCache, strip_fences
from pipeline.text.templates import MIN_LLM_TEMPLATES, TEMPLATE_PROMPT, load_templates, validate_templates
from pipeline.text.timeline import TIMELINE_PROMPT, timeline_text, validate_timeline_caption
from tests.conftest import ROOT
from trainer.config import load_params

KEY_ENV = "TEST_LLM_KEY"
KEY = "sk-secret-123"
PATH = "/v1/chat/completions"

TEMPLATES = [
    "The clip has {} in it.",
    "You can hear {} here.",
    "Listen closely: {} fill the scene.",
    "A short recording with {}.",
    "Sounds of {} are present.",
    "{} can be heard throughout.",
]
# How a model might answer: fenced, numbered, one line with no slot, one duplicate.
TEMPLATES_COMPLETION = (
    "```\n"
    + "\n".join(f"{i}. {t}" for i, t in enumerate(TEMPLATES, 1))
    + "\nA line without any slot.\n- The clip has {} in it.\n```"
)


# --------------------------------------------------------------------------- the server


def completion_body(content, model: str = "m") -> dict:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
    }


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    delay_s: float = 0.0
    headers: dict = field(default_factory=dict)  # more response headers (Retry-After)


def ok(content, delay_s: float = 0.0) -> Reply:
    return Reply(body=json.dumps(completion_body(content)).encode(), delay_s=delay_s)


def failure(status: int, message: str = "scripted failure") -> Reply:
    return Reply(status, json.dumps({"error": {"message": message, "type": "test_error", "code": None}}).encode())


def body_reply(data: dict) -> Reply:
    return Reply(body=json.dumps(data).encode())


def prompt_of(request: dict) -> str:
    return request["body"]["messages"][-1]["content"]


class FakeLLM:
    """A scripted OpenAI-compatible server; ``script`` is consumed first, then ``fallback``."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.script: list[Reply] = []
        self.fallback: Callable[[dict], Reply] = lambda request: failure(500, "no scripted reply left")
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                request = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
                with fake._lock:
                    fake.requests.append(request)
                    scripted = fake.script.pop(0) if fake.script else None
                if self.path != PATH:
                    reply = failure(404, f"no route {self.path}")
                else:
                    reply = scripted or fake.fallback(request)
                time.sleep(reply.delay_s)
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.content_type)
                    self.send_header("Content-Length", str(len(reply.body)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()
        self._stopped = False

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.httpd.shutdown()
            self.httpd.server_close()


@pytest.fixture
def server():
    fake = FakeLLM()
    yield fake
    fake.stop()


def llm_params(server: FakeLLM, tmp_path: Path, **kw) -> LLMParams:
    base = {
        "base_url": server.url,
        "model": "m",
        "api_key_env": KEY_ENV,
        "cache": str(tmp_path / "cache.json"),
        "backoff_s": 0.01,
        "requests_per_minute": 0,
    }
    return LLMParams(**{**base, **kw})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- the key guard


def _assert_no_key(text: str, where: str) -> None:
    assert KEY not in text, f"the API key leaked into {where}"


@pytest.fixture(autouse=True)
def key_guard(tmp_path, capsys, caplog, monkeypatch):
    """Set the key for every test; afterwards it must not be in any file, output or log record."""
    monkeypatch.setenv(KEY_ENV, KEY)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    caplog.set_level(logging.DEBUG)
    yield
    out, err = capsys.readouterr()
    _assert_no_key(out, "stdout")
    _assert_no_key(err, "stderr")
    fmt = logging.Formatter("%(name)s %(levelname)s %(message)s")
    for phase in ("setup", "call"):
        for record in caplog.get_records(phase):
            _assert_no_key(fmt.format(record) + repr(record.args), f"log record {record.name}")
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), f"the API key leaked into {path}"


def assert_no_key_in_error(error: BaseException) -> None:
    import traceback

    _assert_no_key("".join(traceback.format_exception(error)), "the exception")


def warnings_text(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "pipeline.text.llm")


def templates_of(completer: Completer) -> list[str]:
    return load_templates("llm", lambda: completer, 30)


# --------------------------------------------------------------------------- happy path and cache


def test_templates_from_endpoint_then_from_cache(server, tmp_path, monkeypatch) -> None:
    server.script = [ok(TEMPLATES_COMPLETION)]
    params = llm_params(server, tmp_path)
    completer = Completer(params)
    assert templates_of(completer) == TEMPLATES
    assert completer.requests == 1 and len(server.requests) == 1

    request = server.requests[0]
    assert request["path"] == PATH
    assert request["headers"]["authorization"] == f"Bearer {KEY}"
    assert request["body"]["model"] == "m"
    prompt = TEMPLATE_PROMPT.format(n=30)
    assert request["body"]["messages"] == [{"role": "user", "content": prompt}]
    assert request["body"]["temperature"] == 1.0

    lines = (tmp_path / "cache.json").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {"format": "sedsynth-llm-cache", "version": 2},
        {"key": ResponseCache.key("m", prompt), "model": "m", "prompt": prompt, "response": TEMPLATES_COMPLETION},
    ]

    # a later run: no server, no key, a new Completer -> the same templates from the cache
    server.stop()
    monkeypatch.delenv(KEY_ENV)
    again = Completer(params)
    assert templates_of(again) == TEMPLATES
    assert again.requests == 0 and len(server.requests) == 1

    # another model is another key: a miss, and with no key set it says so
    with pytest.raises(LLMError, match=KEY_ENV):
        templates_of(Completer(replace(params, model="other")))


def test_cache_hit_with_failing_server_makes_no_request(server, tmp_path) -> None:
    params = llm_params(server, tmp_path)
    prompt = TEMPLATE_PROMPT.format(n=30)
    ResponseCache(params.cache).put("m", prompt, TEMPLATES_COMPLETION)
    server.fallback = lambda request: failure(500)
    completer = Completer(params)
    assert templates_of(completer) == TEMPLATES
    assert completer.requests == 0 and server.requests == []


def test_system_message_and_api_key_env_none(server, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(KEY_ENV)
    server.script = [ok("fine")]
    completer = Completer(llm_params(server, tmp_path, api_key_env=None, temperature=0.2), system="You write captions.")
    assert completer.complete("say fine", str.strip) == "fine"
    body = server.requests[0]["body"]
    assert body["messages"] == [{"role": "system", "content": "You write captions."}, {"role": "user", "content": "say fine"}]
    assert body["temperature"] == 0.2
    assert KEY not in server.requests[0]["headers"].get("authorization", "")


# --------------------------------------------------------------------------- retries


def test_timeout_is_retried_once(server, tmp_path, caplog) -> None:
    server.script = [ok(TEMPLATES_COMPLETION, delay_s=1.5), ok(TEMPLATES_COMPLETION)]
    completer = Completer(llm_params(server, tmp_path, timeout_s=0.3))
    start = time.monotonic()
    assert templates_of(completer) == TEMPLATES
    assert time.monotonic() - start < 1.4, "the client gave up on the slow answer"
    assert len(server.requests) == 2 and completer.requests == 2
    assert "no answer within 0.3 s" in warnings_text(caplog)


def test_timeouts_on_every_attempt_raise(server, tmp_path) -> None:
    server.fallback = lambda request: ok(TEMPLATES_COMPLETION, delay_s=1.0)
    completer = Completer(llm_params(server, tmp_path, timeout_s=0.2, max_retries=1))
    with pytest.raises(LLMError) as e:
        templates_of(completer)
    message = str(e.value)
    assert "after 2 attempts" in message and "no answer within 0.2 s" in message and "timeout_s" in message
    assert completer.requests == 2 and len(server.requests) == 2
    assert not (tmp_path / "cache.json").exists()
    assert_no_key_in_error(e.value)


@pytest.mark.parametrize("statuses", [(500,), (503,), (429,), (500, 429, 502)])
def test_server_errors_and_rate_limits_are_retried(server, tmp_path, caplog, statuses) -> None:
    server.script = [failure(s) for s in statuses] + [ok(TEMPLATES_COMPLETION)]
    completer = Completer(llm_params(server, tmp_path))
    assert templates_of(completer) == TEMPLATES
    assert len(server.requests) == len(statuses) + 1 == completer.requests
    logged = warnings_text(caplog)
    for s in statuses:
        assert ("rate limited (HTTP 429)" if s == 429 else f"server error (HTTP {s})") in logged
    assert all(r["headers"]["authorization"] == f"Bearer {KEY}" for r in server.requests)


def test_backoff_doubles(server, tmp_path, caplog) -> None:
    server.script = [failure(500), failure(500), failure(500), ok("fine")]
    completer = Completer(llm_params(server, tmp_path, backoff_s=0.05, max_backoff_s=0.1))
    start = time.monotonic()
    assert completer.complete("p", str.strip) == "fine"
    assert time.monotonic() - start >= 0.05 + 0.1 + 0.1  # 0.05, 0.1, then capped at 0.1
    assert "in 0.1 s" in warnings_text(caplog)


def test_unreachable_endpoint_raises_after_retries(tmp_path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    completer = Completer(
        LLMParams(
            base_url=url,
            model="m",
            api_key_env=KEY_ENV,
            cache=str(tmp_path / "c.json"),
            backoff_s=0.01,
            max_retries=2,
            requests_per_minute=0,
        )
    )
    with pytest.raises(LLMError) as e:
        completer.complete("p", str.strip)
    assert "after 3 attempts" in str(e.value) and "cannot connect to" in str(e.value) and url in str(e.value)
    assert completer.requests == 3
    assert_no_key_in_error(e.value)


MALFORMED = {
    "no slot": ok("Here are some caption templates for you, none with a slot."),
    "too few templates": ok("\n".join(TEMPLATES[: MIN_LLM_TEMPLATES - 1])),
    "empty content": ok(""),
    "null content": ok(None),
    "no choices": body_reply({k: v for k, v in completion_body("x").items() if k != "choices"}),
    "empty choices": body_reply({**completion_body("x"), "choices": []}),
    "text/plain body": Reply(body=b"upstream says hello", content_type="text/plain"),
    "JSON content type, body not JSON": Reply(body=b"<html>502 bad gateway</html>"),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_completion_is_retried(server, tmp_path, caplog, kind) -> None:
    server.script = [MALFORMED[kind], ok(TEMPLATES_COMPLETION)]
    completer = Completer(llm_params(server, tmp_path))
    assert templates_of(completer) == TEMPLATES
    assert len(server.requests) == 2 and completer.requests == 2
    assert "malformed completion" in warnings_text(caplog)
    # only the accepted completion is cached
    entries = ResponseCache(tmp_path / "cache.json").entries
    assert [e["response"] for e in entries.values()] == [TEMPLATES_COMPLETION]


@pytest.mark.parametrize("kind", ["no slot", "no choices", "JSON content type, body not JSON"])
def test_malformed_on_every_attempt_raises_and_caches_nothing(server, tmp_path, kind) -> None:
    params = llm_params(server, tmp_path, max_retries=2)
    server.script = [ok("fine")]
    Completer(params).complete("an earlier prompt", str.strip)  # the cache holds one good entry
    before = (tmp_path / "cache.json").read_bytes()

    server.fallback = lambda request: MALFORMED[kind]
    completer = Completer(params)
    with pytest.raises(LLMError) as e:
        templates_of(completer)
    message = str(e.value)
    assert "no usable completion after 3 attempts" in message and "malformed completion" in message
    assert "check the endpoint and model" in message and "offline defaults" in message  # what to do
    assert completer.requests == 3 and len(server.requests) == 1 + 3
    assert (tmp_path / "cache.json").read_bytes() == before
    assert ResponseCache(params.cache).get("m", TEMPLATE_PROMPT.format(n=30)) is None
    assert_no_key_in_error(e.value)


# --------------------------------------------------------------------------- errors that are not retried


@pytest.mark.parametrize("status", [401, 403])
def test_rejected_key_fails_at_once(server, tmp_path, status) -> None:
    server.fallback = lambda request: failure(status, "Incorrect API key provided")
    completer = Completer(llm_params(server, tmp_path))
    with pytest.raises(LLMError) as e:
        templates_of(completer)
    message = str(e.value)
    assert f"HTTP {status}" in message and f"${KEY_ENV}" in message and KEY not in message
    assert len(server.requests) == 1 and completer.requests == 1
    assert not (tmp_path / "cache.json").exists()
    assert_no_key_in_error(e.value)


@pytest.mark.parametrize(("status", "says"), [(404, "does not know model 'm'"), (400, "rejected the request (HTTP 400)")])
def test_other_client_errors_fail_at_once(server, tmp_path, status, says) -> None:
    server.fallback = lambda request: failure(status)
    completer = Completer(llm_params(server, tmp_path))
    with pytest.raises(LLMError, match="check captions.llm.model") as e:
        completer.complete("p", str.strip)
    assert says in str(e.value)
    assert len(server.requests) == 1 and completer.requests == 1


@pytest.mark.parametrize("value", [None, ""])
def test_missing_key_fails_before_any_request(server, tmp_path, monkeypatch, value) -> None:
    if value is None:
        monkeypatch.delenv(KEY_ENV)
    else:
        monkeypatch.setenv(KEY_ENV, value)
    completer = Completer(llm_params(server, tmp_path))
    with pytest.raises(LLMError) as e:
        templates_of(completer)
    message = str(e.value)
    assert f"${KEY_ENV} is not set" in message and "api_key_env" in message and "templates: default" in message
    assert server.requests == [] and completer.requests == 0


def test_bad_cache_files_are_reported(tmp_path) -> None:
    path = tmp_path / "cache.json"
    path.write_text("{not json")
    with pytest.raises(LLMError, match="is not an LLM cache"):
        ResponseCache(path)
    path.write_text(json.dumps({"version": 99, "entries": {}}))
    with pytest.raises(LLMError, match="version 99"):
        ResponseCache(path)


def test_rate_limit_spaces_requests(server, tmp_path) -> None:
    server.fallback = lambda request: ok("fine")
    completer = Completer(llm_params(server, tmp_path, requests_per_minute=600))  # one per 0.1 s
    start = time.monotonic()
    for i in range(3):
        completer.complete(f"prompt {i}", str.strip)
    assert time.monotonic() - start >= 0.2 - 0.01
    assert completer.requests == 3


# --------------------------------------------------------------------------- phrases and timeline captions


def phrase_answer(labels: list[str], wrap: bool = False) -> str:
    text = json.dumps({label: [f"the {label.lower()} sound", f"A  {label}  Noise"] for label in labels})
    return f"```json\n{text}\n```" if wrap else text


def labels_in(prompt: str) -> list[str]:
    return prompt.split("Labels:\n", 1)[1].splitlines()


def test_phrase_variants_parse_json_and_fenced_json(server, tmp_path) -> None:
    answer = {
        "Bark": ["A dog  barking", "WOOF", "a phrase with far too many words to be a short label phrase", 7],
        "Meow": ["a cat meowing"],
        "Knock": [],
    }
    server.script = [ok("```json\n" + json.dumps(answer) + "\n```")]
    completer = Completer(llm_params(server, tmp_path))
    got = llm_phrase_variants(["Bark", "Meow", "Knock"], completer, 3)
    assert got == {"Bark": ["a dog barking", "woof"], "Meow": ["a cat meowing"], "Knock": []}
    assert prompt_of(server.requests[0]) == PHRASE_PROMPT.format(n=3, labels="Bark\nMeow\nKnock")

    server.script = [ok(json.dumps({"Rain": ["rain falling"]}))]
    assert llm_phrase_variants(["Rain"], completer, 2) == {"Rain": ["rain falling"]}
    assert completer.requests == 2


def test_phrase_variants_missing_label_is_retried(server, tmp_path, caplog) -> None:
    server.script = [
        ok(phrase_answer(["Bark", "Meow"])),
        ok("Sure! Here you go: Bark -> a dog"),
        ok(phrase_answer(["Bark", "Meow", "Knock"], wrap=True)),
    ]
    completer = Completer(llm_params(server, tmp_path))
    got = llm_phrase_variants(["Bark", "Meow", "Knock"], completer, 2)
    assert set(got) == {"Bark", "Meow", "Knock"} and got["Knock"] == ["the knock sound", "a knock noise"]
    assert completer.requests == 3
    logged = warnings_text(caplog)
    assert "no phrase list for label 'Knock'" in logged and "not JSON" in logged


def test_phrase_variants_are_asked_in_batches(server, tmp_path) -> None:
    server.fallback = lambda request: ok(phrase_answer(labels_in(prompt_of(request))))
    labels = [f"Label_{i:02d}" for i in range(LABELS_PER_PROMPT + 5)]
    completer = Completer(llm_params(server, tmp_path))
    got = llm_phrase_variants(labels, completer, 2)
    assert list(got) == labels
    assert [len(labels_in(prompt_of(r))) for r in server.requests] == [LABELS_PER_PROMPT, 5]
    assert llm_phrase_variants(labels, Completer(llm_params(server, tmp_path)), 2) == got  # cached
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("text", "caption"),
    [
        ("Caption: A dog barks while rain falls.", "A dog barks while rain falls."),
        ('caption:   "Footsteps, then a door slams."', "Footsteps, then a door slams."),
        ("```\nCAPTION: Birds sing.\nsecond line\n```", "Birds sing."),
        ("A dog barks twice.", "A dog barks twice."),
    ],
)
def test_validate_timeline_caption(text, caption) -> None:
    assert validate_timeline_caption(text) == caption


@pytest.mark.parametrize("text", ["", "   \n ", "Caption:", "Caption: A {} sound.", " ".join(["word"] * 81)])
def test_validate_timeline_caption_rejects(text) -> None:
    with pytest.raises(MalformedCompletion):
        validate_timeline_caption(text)


def test_timeline_caption_through_endpoint(server, tmp_path) -> None:
    server.script = [ok('Caption: "A dog barks as rain falls."')]
    prompt = TIMELINE_PROMPT.format(duration=10.0, events="a dog barking 0.5-2.1; rain 0.0-10.0")
    completer = Completer(llm_params(server, tmp_path))
    assert completer.complete(prompt, validate_timeline_caption) == "A dog barks as rain falls."
    assert ResponseCache(tmp_path / "cache.json").get("m", prompt) == 'Caption: "A dog barks as rain falls."'


def test_validate_templates_and_strip_fences() -> None:
    assert strip_fences('```json\n{"a": 1}\n```') == '{"a": 1}'
    assert validate_templates(['1) "Hear {} now."', "* hear {} now.", "# comment {}", "two {} {}", "odd { brace {}"]) == [
        "Hear {} now."
    ]
    with pytest.raises(MalformedCompletion):
        validate_templates(["no slot"], 1)


# --------------------------------------------------------------------------- the captions stage


@pytest.fixture
def mix_dir(mixed) -> Path:
    """The small mix stage output of tests/conftest.py (session fixture ``mixed``)."""
    return mixed[1]


def stage_params(overrides: dict):
    return load_params(ROOT / "params.yaml", {"captions": overrides})


def llm_overrides(server: FakeLLM, tmp_path: Path, **captions_kw) -> dict:
    return {
        **captions_kw,
        "llm": {
            "base_url": server.url,
            "model": "m",
            "api_key_env": KEY_ENV,
            "cache": str(tmp_path / "cache.json"),
            "backoff_s": 0.01,
            "requests_per_minute": 0,
        },
    }


def read_outputs(out: Path):
    caps = from_table(pq.read_table(out / "captions.parquet"), Caption)
    phrases: dict[str, list[LabelPhrase]] = defaultdict(list)
    for ph in from_table(pq.read_table(out / "phrases.parquet"), LabelPhrase):
        phrases[ph.mixture_id].append(ph)
    return caps, phrases


def words_of(phrases: list[LabelPhrase]) -> list[str]:
    return list(dict.fromkeys(ph.phrase for ph in phrases))


@pytest.fixture
def in_project_root(monkeypatch, tmp_path):
    # the stage must not depend on the working directory: run from an unrelated folder
    monkeypatch.chdir(tmp_path)


def test_stage_default_run_needs_no_network(mix_dir, tmp_path, monkeypatch, in_project_root) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    shipped_cache = ROOT / "configs" / "llm_cache.jsonl"
    before = shipped_cache.read_bytes() if shipped_cache.exists() else None

    def no_network(self, address, *args, **kwargs):
        raise AssertionError(f"the default captions run opened a connection to {address}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    params = stage_params({"llm": {"base_url": f"http://127.0.0.1:{closed_port()}/v1"}})
    assert (params.captions.templates, params.captions.phrases, params.captions.timeline) == ("default", "default", False)
    assert params.captions.llm.api_key_env == "OPENAI_API_KEY"

    out = tmp_path / "captions"
    summary = captions.run(params, mix_dir, out)
    monkeypatch.undo()

    recipes = from_table(pq.read_table(mix_dir / "mixtures.parquet"), MixtureRecipe)
    caps, phrases = read_outputs(out)
    assert summary["llm_requests"] == 0 and summary["mixtures"] == len(recipes) == len(caps) > 0
    default = templates.read_templates(templates.DEFAULT_TEMPLATES)
    assert (out / "templates.txt").read_text().splitlines() == default
    for c in caps:
        if c.source == "template":
            assert c.template in default and c.caption == templates.fill(c.template, words_of(phrases[c.mixture_id]))
        else:
            assert c.source == "empty" and not phrases[c.mixture_id]
    assert (shipped_cache.read_bytes() if shipped_cache.exists() else None) == before


def test_stage_llm_templates_end_to_end(server, mix_dir, tmp_path, in_project_root) -> None:
    prompt = TEMPLATE_PROMPT.format(n=30)
    server.fallback = lambda request: ok(TEMPLATES_COMPLETION) if prompt_of(request) == prompt else failure(400)
    params = stage_params(llm_overrides(server, tmp_path, templates="llm"))
    out = tmp_path / "captions"
    summary = captions.run(params, mix_dir, out)

    assert summary["llm_requests"] == 1 and summary["templates"] == len(TEMPLATES)
    assert len(server.requests) == 1 and server.requests[0]["headers"]["authorization"] == f"Bearer {KEY}"
    assert (out / "templates.txt").read_text().splitlines() == TEMPLATES
    caps, phrases = read_outputs(out)
    assert len(caps) == summary["mixtures"] > 0 and any(c.source == "template" for c in caps)
    for c in caps:
        if c.source == "template":
            assert c.template in TEMPLATES
            assert c.caption == templates.fill(c.template, words_of(phrases[c.mixture_id]))
    assert ResponseCache(tmp_path / "cache.json").get("m", prompt) == TEMPLATES_COMPLETION

    # again, with the server gone: the same captions from the cache
    server.stop()
    again = captions.run(params, mix_dir, tmp_path / "captions2")
    assert again["llm_requests"] == 0
    assert read_outputs(tmp_path / "captions2")[0] == caps


def timeline_caption(events: str) -> str:
    return f"Timeline {hashlib.sha1(events.encode()).hexdigest()[:10]} with every event in order."


def test_stage_timeline_end_to_end(server, mix_dir, tmp_path, in_project_root) -> None:
    def answer(request: dict) -> Reply:
        prompt = prompt_of(request)
        if "Events: " not in prompt:
            return failure(400)
        events = prompt.rsplit("Events: ", 1)[1].split("\n", 1)[0]
        return ok(f"Caption: {timeline_caption(events)}")

    server.fallback = answer
    params = stage_params(llm_overrides(server, tmp_path, timeline=True))
    out = tmp_path / "captions"
    summary = captions.run(params, mix_dir, out)

    caps, phrases = read_outputs(out)
    timeline = [c for c in caps if c.source == "timeline"]
    assert len(caps) == summary["mixtures"] > 0 and timeline
    assert all(c.source == "empty" for c in caps if c not in timeline)
    prompts = set()
    recipes = {r.mixture_id: r for r in from_table(pq.read_table(mix_dir / "mixtures.parquet"), MixtureRecipe)}
    for c in timeline:
        events = timeline_text(phrases[c.mixture_id])
        assert c.caption == timeline_caption(events) and c.template == ""
        prompts.add(TIMELINE_PROMPT.format(duration=recipes[c.mixture_id].duration_s, events=events))
    assert {prompt_of(r) for r in server.requests} == prompts
    assert summary["llm_requests"] == len(server.requests) == len(prompts)

    again = captions.run(params, mix_dir, tmp_path / "captions2")
    assert again["llm_requests"] == 0 and len(server.requests) == len(prompts)
    assert read_outputs(tmp_path / "captions2")[0] == caps


def test_a_cached_completion_that_no_longer_validates_names_the_entry(tmp_path) -> None:
    from pipeline.config.params import LLMParams
    from pipeline.text.llm import Completer, LLMError, ResponseCache

    cache = ResponseCache(tmp_path / "cache.json")
    prompt = TEMPLATE_PROMPT.format(n=30)
    cache.put("m", prompt, "no slot in this line")
    completer = Completer(LLMParams(model="m", api_key_env=None, cache=str(tmp_path / "cache.json")))
    with pytest.raises(LLMError, match="delete that entry"):
        load_templates("llm", lambda: completer, 30)
    assert completer.requests == 0
