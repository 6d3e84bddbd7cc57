"""The LLM client under misuse and failure: a key where its variable's name belongs, servers that
ask for a wait (``Retry-After``), and the response cache at scale and under ``kill -9``.

Requests go over real HTTP to the scripted OpenAI-compatible server of
tests/test_llm_endpoint.py, whose key guard (no key in any file, output or log) runs here too.
"""

from __future__ import annotations

import email.utils
import inspect
import json
import logging
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

from pipeline.config.params import ParamsError
from pipeline.text.llm import CACHE_HEADER, Completer, LLMError, ResponseCache, retry_after_s
from sedsynth.cli import main as cli_main
from tests.pipeline.text.test_llm_endpoint import (  # noqa: F401  (key_guard is an autouse fixture)
    ROOT,
    FakeLLM,
    failure,
    key_guard,
    llm_params,
    ok,
    server,
    warnings_text,
)
from trainer.config import load_params

# --------------------------------------------------------------------------- item 2: a key in api_key_env

KEY_LIKE = [
    "sk-proj-Ab3dEf5gHi7jKl9mNo1pQr3sTu5vWx7y",  # OpenAI project key
    "sk-9f8e7d6c5b4a39281706f5e4d3c2b1a0",  # OpenAI legacy key
    "sk-ant-api03-aB1cD2eF3gH4iJ5kL6mN7oP8",  # Anthropic
    "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345",  # Hugging Face: a valid identifier, still a key
    "gsk_1a2b3c4d5e6f7g8h9i0jKLMNopqr",  # Groq: likewise
]
NOT_A_NAME = ["$OPENAI_API_KEY", "OPENAI API KEY", "openai-key"]
NAMES = [None, "OPENAI_API_KEY", "AZURE_OPENAI_API_KEY_2", "my_llm_key", "TOGETHER_API_KEY", "LLMKEYFORPROJECT2024X"]


def _params_with_key_env(value):
    return load_params(ROOT / "params.yaml", {"captions": {"llm": {"api_key_env": value}}})


@pytest.mark.parametrize("value", KEY_LIKE + NOT_A_NAME)
def test_a_key_in_api_key_env_is_refused_at_params_load_without_echo(value) -> None:
    with pytest.raises(ParamsError) as e:
        _params_with_key_env(value)
    message = str(e.value)
    assert "captions.llm.api_key_env" in message and "export" in message and "\n" not in message
    assert ("looks like an API key" in message) == (value in KEY_LIKE)
    assert value not in "".join(traceback.format_exception(e.value))


@pytest.mark.parametrize("value", NAMES)
def test_variable_names_are_accepted(value) -> None:
    assert _params_with_key_env(value).captions.llm.api_key_env == value


def test_a_key_on_the_command_line_is_refused_without_echo(capsys) -> None:
    value = KEY_LIKE[0]
    assert cli_main(["captions", "--params", str(ROOT / "params.yaml"), "--set", f"captions.llm.api_key_env={value}"]) == 2
    out, err = capsys.readouterr()
    assert "captions.llm.api_key_env" in err and "looks like an API key" in err
    assert value not in out + err


@pytest.mark.parametrize("value", KEY_LIKE[:2] + NOT_A_NAME[:1])
def test_a_key_in_api_key_env_is_refused_by_the_client_without_echo(server, tmp_path, caplog, value) -> None:
    server.fallback = lambda request: ok("fine")
    with pytest.raises(LLMError) as e:
        Completer(llm_params(server, tmp_path, api_key_env=value)).complete("p", str.strip)
    assert "captions.llm.api_key_env" in str(e.value)
    assert value not in "".join(traceback.format_exception(e.value)) + caplog.text
    assert server.requests == []


# --------------------------------------------------------------------------- item 19: Retry-After

NOW = 1_700_000_000.0  # the injected wall clock


def _retry_once(server: FakeLLM, tmp_path: Path, status: int, headers: dict, **kw) -> tuple[list[float], Completer]:
    reply = failure(status)
    reply.headers = headers
    server.script = [reply, ok("fine")]
    sleeps: list[float] = []
    completer = Completer(llm_params(server, tmp_path, **kw), sleep=sleeps.append, clock=lambda: NOW)
    assert completer.complete("p", str.strip) == "fine"
    assert len(server.requests) == 2
    return sleeps, completer


@pytest.mark.parametrize(
    ("status", "headers", "wait_s"),
    [
        (429, {"Retry-After": "5"}, 5.0),
        (429, {"retry-after-ms": "1500"}, 1.5),
        (429, {"Retry-After": "2", "retry-after-ms": "250"}, 0.25),  # the finer one wins
        (429, {"Retry-After": email.utils.formatdate(NOW + 7, usegmt=True)}, 7.0),
        (429, {"Retry-After": email.utils.formatdate(NOW - 30, usegmt=True)}, 0.0),  # a date in the past: at once
        (503, {"Retry-After": "4"}, 4.0),
        (429, {"Retry-After": "soon"}, 0.01),  # unreadable: the usual backoff
        (429, {}, 0.01),
    ],
)
def test_retry_after_is_honoured(server, tmp_path, caplog, status, headers, wait_s) -> None:
    sleeps, _ = _retry_once(server, tmp_path, status, headers, backoff_s=0.01)
    assert sleeps == [wait_s]
    if wait_s != 0.01:
        assert "as the server asked" in warnings_text(caplog)


def test_retry_after_is_capped_by_max_backoff(server, tmp_path, caplog) -> None:
    sleeps, _ = _retry_once(server, tmp_path, 429, {"Retry-After": "120"}, max_backoff_s=3.0)
    assert sleeps == [3.0]
    assert "asked for 120.0 s; capped at captions.llm.max_backoff_s" in warnings_text(caplog)


def test_retry_after_is_waited_for_in_real_time(server, tmp_path) -> None:
    reply = failure(429)
    reply.headers = {"retry-after-ms": "400"}
    replies = [reply, ok("fine")]
    arrived: list[float] = []  # when each request reached the server

    def answer(request: dict):
        arrived.append(time.monotonic())
        return replies.pop(0)

    server.fallback = answer
    completer = Completer(llm_params(server, tmp_path, backoff_s=0.01))
    assert completer.complete("p", str.strip) == "fine"
    assert len(arrived) == 2 and arrived[1] - arrived[0] >= 0.4


def test_retry_after_parsing() -> None:
    assert retry_after_s({"RETRY-AFTER": " 3 "}) == 3.0
    assert retry_after_s({"Retry-After": email.utils.formatdate(NOW + 61, usegmt=True)}, now=NOW) == 61.0
    assert retry_after_s({"retry-after-ms": "x", "retry-after": "2"}) == 2.0
    for headers in ({}, {"Retry-After": ""}, {"Retry-After": "in a while"}, {"Retry-After": "nan"}, {"retry-after-ms": "inf"}):
        assert retry_after_s(headers) is None


# --------------------------------------------------------------------------- item 20: the cache


def _written_bytes() -> int:
    """Bytes this process has passed to write(2) so far (Linux /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def _prompt(i: int) -> str:
    return f"Timeline {i:06d}: a dog barking 0.5-2.1; rain 0.0-10.0. Write one caption."


def _response(i: int) -> str:
    return f"Caption: a dog barks twice as rain falls ({i:06d})."


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="counts bytes written through /proc/self/io (Linux)")
def test_a_put_writes_one_line_whatever_the_cache_size(tmp_path) -> None:
    cache = ResponseCache(tmp_path / "cache.jsonl")
    written: dict[int, int] = {}
    for i in range(400):
        before = _written_bytes()
        cache.put("m", _prompt(i), _response(i))
        written[i] = _written_bytes() - before
    assert written[10] == written[100] == written[399]  # entries of one length cost the same at any size
    line = len(
        ResponseCache.line(
            ResponseCache.key("m", _prompt(399)), {"model": "m", "prompt": _prompt(399), "response": _response(399)}
        )
    )
    assert written[399] == line and written[0] == len(CACHE_HEADER) + line  # the first put also writes the header
    assert len(ResponseCache(tmp_path / "cache.jsonl").entries) == 400


def test_lines_are_stable_sorted_and_one_per_entry(tmp_path) -> None:
    prompt = "Describe: «café» at 0.5 s\nthen a second line \u2028 and a separator"
    for name in ("a.jsonl", "b.jsonl"):
        cache = ResponseCache(tmp_path / name)
        cache.put("m", prompt, "Un café, then a door.")
        cache.put("m", "second", "two")
    data = (tmp_path / "a.jsonl").read_bytes()
    assert data == (tmp_path / "b.jsonl").read_bytes()
    lines = data.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 4 and lines[0] + b"\n" == CACHE_HEADER
    first = json.loads(lines[1])
    assert list(first) == sorted(first) == ["key", "model", "prompt", "response"]
    assert "«café»".encode() in lines[1]  # readable in a diff, not \u-escaped
    assert ResponseCache(tmp_path / "a.jsonl").get("m", prompt) == "Un café, then a door."


def test_a_later_line_for_the_same_key_wins(tmp_path) -> None:
    cache = ResponseCache(tmp_path / "cache.jsonl")
    cache.put("m", "p", "old")
    cache.put("m", "p", "new")
    assert cache.get("m", "p") == "new"
    assert ResponseCache(tmp_path / "cache.jsonl").get("m", "p") == "new"


def test_a_torn_last_line_is_ignored_then_cut_off(tmp_path, caplog) -> None:
    path = tmp_path / "cache.jsonl"
    cache = ResponseCache(path)
    for i in range(3):
        cache.put("m", _prompt(i), _response(i))
    torn = ResponseCache.line(ResponseCache.key("m", _prompt(3)), {"model": "m", "prompt": _prompt(3), "response": _response(3)})
    with path.open("ab") as f:
        f.write(torn[: len(torn) // 2])

    caplog.set_level(logging.WARNING, logger="pipeline.text.llm")
    again = ResponseCache(path)
    assert set(again.entries) == set(cache.entries) and again.get("m", _prompt(3)) is None
    assert "cut short by an interrupted run" in caplog.text

    again.put("m", _prompt(4), _response(4))
    assert path.read_bytes().endswith(b"\n")
    caplog.clear()
    third = ResponseCache(path)
    assert [third.get("m", _prompt(i)) for i in (0, 1, 2, 4)] == [_response(i) for i in (0, 1, 2, 4)]
    assert third.get("m", _prompt(3)) is None and caplog.text == "" and third.skipped_lines == []


def test_a_torn_header_reads_as_empty(tmp_path, caplog) -> None:
    path = tmp_path / "cache.jsonl"
    path.write_bytes(CACHE_HEADER[:9])
    cache = ResponseCache(path)
    assert cache.entries == {} and "cut-short header" in caplog.text
    cache.put("m", "p", "r")
    assert path.read_bytes().startswith(CACHE_HEADER) and ResponseCache(path).get("m", "p") == "r"


def test_a_whole_last_entry_without_its_newline_is_kept(tmp_path) -> None:
    path = tmp_path / "cache.jsonl"
    cache = ResponseCache(path)
    cache.put("m", "first", "one")
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # as some editors save it
    again = ResponseCache(path)
    assert again.get("m", "first") == "one"
    again.put("m", "second", "two")
    assert [ResponseCache(path).get("m", p) for p in ("first", "second")] == ["one", "two"]


def test_lines_that_are_not_entries_are_skipped_and_named(tmp_path, caplog) -> None:
    path = tmp_path / "cache.jsonl"
    cache = ResponseCache(path)
    cache.put("m", "a", "1")
    with path.open("ab") as f:
        f.write(b"<<<<<<< HEAD\n[1, 2]\n")
    cache.put("m", "b", "2")
    again = ResponseCache(path)
    assert (again.get("m", "a"), again.get("m", "b")) == ("1", "2")
    assert again.skipped_lines == [3, 4] and "line 3, 4" in caplog.text


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"some notes, not a cache\n", "is not an LLM cache"),
        (b'{"format": "sedsynth-llm-cache", "version": 3}\n', "version 3"),
        (b'{"version": 7, "entries": {}}', "version 7"),
    ],
)
def test_files_that_cannot_be_read_fail_with_one_line(tmp_path, content, says) -> None:
    path = tmp_path / "cache.jsonl"
    path.write_bytes(content)
    with pytest.raises(LLMError, match=says) as e:
        ResponseCache(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert path.read_bytes() == content


def test_an_old_json_cache_is_read_and_converted_on_the_first_put(tmp_path, caplog) -> None:
    path = tmp_path / "llm_cache.json"
    old = {ResponseCache.key("m", p): {"model": "m", "prompt": p, "response": r} for p, r in (("b", "2"), ("a", "1"))}
    before = (json.dumps({"version": 1, "entries": old}, indent=1, ensure_ascii=False) + "\n").encode()
    path.write_bytes(before)

    cache = ResponseCache(path)
    assert cache.legacy and (cache.get("m", "a"), cache.get("m", "b")) == ("1", "2")
    assert path.read_bytes() == before  # reading alone changes nothing

    cache.put("m", "c", "3")
    assert "old one-document format" in caplog.text
    lines = path.read_bytes().split(b"\n")
    assert lines[0] + b"\n" == CACHE_HEADER and len(lines) == 5 and lines[-1] == b""
    assert [json.loads(line)["key"] for line in lines[1:4]] == sorted(json.loads(line)["key"] for line in lines[1:4])
    cache.put("m", "d", "4")  # from here on, appends
    again = ResponseCache(path)
    assert not again.legacy and [again.get("m", p) for p in "abcd"] == ["1", "2", "3", "4"]


def _killed_entry(i: int) -> tuple[str, str]:
    """Prompt and response number ``i`` of the killed writer: up to ~1 MB, so a kill can land inside one write."""
    return f"killed writer, prompt {i}", f"{i}:" + "abcdefghij" * (1 + (i * 7919) % 100_000)


# the writer process: appends entries until it is killed; it prints once the first few are in
WRITER = (
    inspect.getsource(_killed_entry)
    + """
import sys
from pipeline.text.llm import ResponseCache
cache = ResponseCache(sys.argv[1])
start = len(cache.entries)
for i in range(start, start + 1_000_000):
    cache.put("m", *_killed_entry(i))
    if i == start + 5:
        print("writing", flush=True)
"""
)


def test_kill_9_while_appending_leaves_a_readable_cache(tmp_path) -> None:
    path = tmp_path / "cache.jsonl"
    done = 0
    for delay_s in (0.0, 0.05, 0.2):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE)
        assert writer.stdout.readline() == b"writing\n"
        time.sleep(delay_s)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        writer.stdout.close()

        cache = ResponseCache(path)  # must load, whatever the moment of the kill
        n = len(cache.entries)
        assert n >= done + 6
        assert all(cache.get("m", _killed_entry(i)[0]) == _killed_entry(i)[1] for i in range(n))  # exactly the first n
        assert cache.skipped_lines == []
        done = n

    cache.put("m", "after the kills", "fine")
    again = ResponseCache(path)
    assert len(again.entries) == done + 1 and again.get("m", "after the kills") == "fine"
    assert path.read_bytes().endswith(b"\n")


def test_bench_llm_cache_runs_and_compares(capsys) -> None:
    from benchmarks.llm_cache import bench_llm_cache, print_figures

    figures = bench_llm_cache(sizes=(20, 200), appends=5, rewrites=2)
    small, large = figures["sizes"][20], figures["sizes"][200]
    assert small["append_bytes_per_entry"] == pytest.approx(large["append_bytes_per_entry"], rel=0.05)
    assert large["rewrite_bytes_per_entry"] > 5 * small["rewrite_bytes_per_entry"] > 5 * small["append_bytes_per_entry"]
    print_figures(figures)
    assert "rewrite (peer)" in capsys.readouterr().out


# --------------------------------------------------------------------------- credentials in base_url

PASSWORD = "pw-Zq81xLm4"


@pytest.mark.parametrize("status", [404, 500, None])  # None: nothing listens on the port
def test_a_password_in_base_url_is_never_shown(server, tmp_path, caplog, status) -> None:
    from tests.pipeline.text.test_llm_endpoint import closed_port

    base = server.url if status else f"http://127.0.0.1:{closed_port()}/v1"
    url = base.replace("http://", f"http://alice:{PASSWORD}@")
    if status:
        server.fallback = lambda request: failure(status)
    completer = Completer(llm_params(server, tmp_path, base_url=url, max_retries=1))
    with pytest.raises(LLMError) as e:
        completer.complete("p", str.strip)
    assert base.replace("http://", "http://alice:***@") in str(e.value)
    fmt = logging.Formatter("%(name)s %(levelname)s %(message)s")
    shown = "".join(traceback.format_exception(e.value)) + "".join(fmt.format(r) + repr(r.args) for r in caplog.records)
    assert PASSWORD not in shown
    if status == 500:
        assert "server error (HTTP 500)" in warnings_text(caplog)


def test_credentials_in_base_url_still_reach_the_server_as_basic_auth(server, tmp_path) -> None:
    import base64

    server.script = [ok("fine")]
    url = server.url.replace("http://", "http://alice:p%40ss@")
    assert Completer(llm_params(server, tmp_path, base_url=url)).complete("p", str.strip) == "fine"
    assert server.requests[0]["headers"]["authorization"] == "Basic " + base64.b64encode(b"alice:p@ss").decode()
