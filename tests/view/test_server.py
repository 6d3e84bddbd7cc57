"""``sedsynth view`` without a browser: the catalog against the folders it reads, the evaluation's errors against
their definitions, the API over a real server, what it refuses (paths out of its folders, oversized or
undecodable uploads) and the command's one-line errors."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from sedsynth.cli import main
from sedsynth.view.catalog import open_catalog, open_mixtures, open_shards
from sedsynth.view.evaluation import open_evaluation
from sedsynth.view.server import make_app, running
from tests.conftest import tone_burst
from tests.view.conftest import copy_mixtures

TIMEOUT_S = 30


def get(url: str, headers: dict | None = None) -> tuple[int, bytes, dict]:
    """(status, body, headers) of a GET, errors included (never raises for an HTTP status)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=TIMEOUT_S) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def post(url: str, body: bytes, content_type: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data=body, headers={"Content-Type": content_type}), timeout=TIMEOUT_S
        ) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def multipart(name: str, data: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


def rounded(segments: list[tuple]) -> list[tuple]:
    """Segments to the microsecond: the shards store what the mix stage's table does, through another writer."""
    return [(round(a, 6), round(b, 6), label) for a, b, label in segments]


@pytest.fixture(scope="module")
def catalogs(view_data):
    return open_shards(view_data.shards), open_mixtures(view_data.mixtures)


@pytest.fixture(scope="module")
def server(view_data, catalogs):
    app = make_app(
        catalogs[0],
        open_evaluation(view_data.evaluation),
        str(view_data.checkpoint),
        view_data.params.evaluate,
        max_upload_bytes=200_000,
        device="cpu",
    )
    with running(app) as url:
        yield url


def test_the_shard_and_mixture_catalogs_list_the_same_mixtures_and_events(catalogs, view_data):
    shards, mixtures = catalogs
    assert sorted(shards.ids) == sorted(mixtures.ids) and len(shards) == 30
    segments = pq.read_table(view_data.mixtures / "segments.parquet").to_pylist()
    for mixture_id in shards.ids:
        mine = sorted((s["onset_s"], s["offset_s"], s["label"]) for s in segments if s["mixture_id"] == mixture_id)
        for catalog in (shards, mixtures):
            found = catalog.mixture(mixture_id)
            drawn = sorted((a, b, p["label"]) for p in found["phrases"] for a, b in p["segments"])
            assert rounded(drawn) == rounded(mine), (catalog.kind, mixture_id)
            assert catalog.events[catalog.position[mixture_id]] == len(mine)
    k = shards.position["test_0000000"]
    assert shards.snr_min[k] == min(x for p in shards.mixture("test_0000000")["phrases"] for x in p["snr_db"])
    assert mixtures.snr_min[mixtures.position["test_0000000"]] == pytest.approx(shards.snr_min[k])


def test_filters_select_what_they_say(catalogs):
    shards, _ = catalogs
    test = shards.select(split="test")
    assert [shards.ids[k] for k in test] == [f"test_{i:07d}" for i in range(5)]
    label = shards.summary()["labels"][0]
    assert all(label in shards.labels[k] for k in shards.select(label=label)) and len(shards.select(label=label)) > 0
    few = shards.select(max_events=2)
    assert all(shards.events[k] <= 2 for k in few) and len(few) < len(shards)
    low, high = 13.0, 18.0
    inside = shards.select(min_snr_db=low, max_snr_db=high)
    for k in range(len(shards)):
        snrs = [x for p in shards.mixture(shards.ids[k])["phrases"] for x in p["snr_db"]]
        assert (k in inside) == (bool(snrs) and min(snrs) >= low and max(snrs) <= high)
    caption = shards.mixture("test_0000001")["caption"]
    word = max(caption.split(), key=len).strip(".,").upper()  # case does not matter
    assert shards.position["test_0000001"] in shards.select(text=word)
    cluster = shards.summary()["clusters"][0]
    assert len(shards.select(cluster=cluster["id"])) == cluster["mixtures"]


def test_a_mixture_s_audio_is_its_own(catalogs, view_data):
    shards, mixtures = catalogs
    from_shard, from_file = shards.audio("test_0000003"), mixtures.audio("test_0000003")
    assert from_shard[:4] == b"fLaC"
    a, _ = sf.read(io.BytesIO(from_shard))
    b, _ = sf.read(view_data.mixtures / "audio" / "test" / "test_0000003.flac")
    np.testing.assert_array_equal(a, b)
    assert from_file == (view_data.mixtures / "audio" / "test" / "test_0000003.flac").read_bytes()


def test_errors_follow_their_definitions(view_data):
    ev = open_evaluation(view_data.evaluation)
    found = ev.errors("trained", limit=10_000)
    t = ev.threshold
    assert t == 0.5 and found["false_alarm_count"] > 0 and found["miss_count"] > 0
    peaks = [e["peak"] for e in found["false_alarms"]]
    assert peaks == sorted(peaks, reverse=True) and min(peaks) >= t
    for e in found["false_alarms"]:
        assert not any(a < e["offset_s"] and e["onset_s"] < b for a, b, lab in ev.truth[e["clip"]] if lab == e["class"])
    for e in found["misses"]:
        assert (e["onset_s"], e["offset_s"], e["class"]) in ev.truth[e["clip"]] and e["peak"] < t
        stored = ev.scores("trained", e["clip"], e["class"])
        edges, probs = np.array(stored["timestamps_s"]), np.array(stored["probs"])
        inside = (edges[:-1] < e["offset_s"]) & (edges[1:] > e["onset_s"])
        assert probs[inside].max() == pytest.approx(e["peak"])
    rows = ev.summary()["per_class"]["trained"]
    assert [r["class"] for r in rows] == ev.classes


def test_the_api_pages_filters_and_describes(server, catalogs):
    shards, _ = catalogs
    status, body, _ = get(server + "api/mixtures?split=train&per_page=7&page=3")
    page = json.loads(body)
    assert status == 200 and page["total"] == 20 and [r["id"] for r in page["rows"]] == [f"train_{i:07d}" for i in range(14, 20)]
    assert get(server + "api/mixtures?min_events=abc")[0] == 400
    status, body, _ = get(server + "api/mixture?id=test_0000000")
    assert status == 200 and json.loads(body)["phrases"] == shards.mixture("test_0000000")["phrases"]
    status, png, headers = get(server + "api/spectrogram?id=test_0000000")
    assert status == 200 and png[:8] == b"\x89PNG\r\n\x1a\n" and headers["Content-Type"] == "image/png"
    status, part, headers = get(server + "api/audio?id=test_0000000", {"Range": "bytes=10-109"})
    whole = shards.audio("test_0000000")
    assert status == 206 and part == whole[10:110] and headers["Content-Range"] == f"bytes 10-109/{len(whole)}"
    assert get(server + "api/audio?id=test_0000000", {"Range": f"bytes={len(whole)}-"})[0] == 416


@pytest.mark.parametrize(
    "path",
    [
        "static/../../../../etc/passwd",
        "static/%2e%2e/%2e%2e/etc/passwd",
        "static/..%2f..%2fetc%2fpasswd",
        "static/%2fetc%2fpasswd",
        "api/audio?id=../../etc/passwd",
        "api/audio?id=%2Fetc%2Fpasswd",
        "api/audio?id=%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "api/audio?upload=../../etc/passwd",
        "api/spectrogram?id=/etc/passwd",
        "api/evaluation/scores?model=trained&clip=../../../etc/passwd&class=Bark",
        "api/evaluation/scores?model=..&clip=x&class=y",
        "../../etc/passwd",
        "%2e%2e/%2e%2e/etc/passwd",
    ],
)
def test_nothing_outside_the_folders_is_served(server, path):
    status, body, _ = get(server + path)
    assert status in (403, 404), (path, status)
    assert b"root:" not in body


def test_audio_paths_out_of_a_mixtures_folder_are_refused(view_data, tmp_path):
    folder = copy_mixtures(view_data.mixtures, tmp_path / "mix")
    secret = tmp_path / "secret.flac"
    secret.write_bytes((view_data.mixtures / "audio" / "test" / "test_0000000.flac").read_bytes())
    (folder / "audio" / "test" / "test_0000001.flac").unlink()
    os.symlink(secret, folder / "audio" / "test" / "test_0000001.flac")  # a link inside, pointing out
    table = pq.read_table(folder / "mixtures.parquet")
    paths = table.column("audio_path").to_pylist()
    planted = {"test_0000002": "../secret.flac", "test_0000003": str(secret), "test_0000004": "audio/../../secret.flac"}
    ids = table.column("mixture_id").to_pylist()
    paths = [planted.get(i, p) for i, p in zip(ids, paths)]
    pq.write_table(
        table.set_column(table.schema.get_field_index("audio_path"), "audio_path", pa.array(paths, pa.string())),
        folder / "mixtures.parquet",
    )
    app = make_app(open_catalog(folder), None, None, view_data.params.evaluate)
    with running(app) as url:
        for mixture_id in ("test_0000001", *planted):
            assert get(url + f"api/audio?id={mixture_id}")[0] == 403, mixture_id
            assert get(url + f"api/spectrogram?id={mixture_id}")[0] == 403, mixture_id
        assert get(url + "api/audio?id=test_0000000")[0] == 200
        status, body = post(
            url + "api/detect", json.dumps({"id": "test_0000000", "queries": ["bark"]}).encode(), "application/json"
        )
        assert status == 409 and "checkpoint" in body["error"]  # no checkpoint: queries are off, the rest works


def test_uploads_are_limited_checked_and_queryable(server):
    status, body = post(server + "api/upload", *multipart("big.wav", b"\0" * 250_000))
    assert status == 413
    status, body = post(server + "api/upload", *multipart("noise.wav", b"not audio " * 100))
    assert status == 422
    buf = io.BytesIO()
    sf.write(buf, tone_burst(22050, 3.0, 0.5, 2.0), 22050, format="WAV", subtype="PCM_16")
    status, record = post(server + "api/upload", *multipart("../../tone.wav", buf.getvalue()))
    assert status == 200 and record["name"] == "tone.wav" and record["duration_s"] == pytest.approx(3.0) and "path" not in record
    assert get(server + f"api/audio?upload={record['token']}")[1] == buf.getvalue()
    status, found = post(
        server + "api/detect",
        json.dumps({"upload": record["token"], "queries": ["a beep", "a beep", "silence"]}).encode(),
        "application/json",
    )
    assert status == 200 and found["queries"] == ["a beep", "silence"] and found["truth"] == [None, None]
    assert len(found["timestamps_s"]) == len(found["probs"][0]) + 1 and found["timestamps_s"][-1] == pytest.approx(3.0)
    for bad in ([], [""], ["a\tb"], "bark", [1], ["x"] * 17):
        assert (
            post(server + "api/detect", json.dumps({"upload": record["token"], "queries": bad}).encode(), "application/json")[0]
            == 400
        )


def test_a_query_on_a_mixture_is_what_sedsynth_detect_prints(server, view_data, tmp_path, capsys):
    status, found = post(
        server + "api/detect", json.dumps({"id": "test_0000000", "queries": ["bark", "siren"]}).encode(), "application/json"
    )
    assert status == 200 and found["threshold"] == 0.5 and found["median_filter_frames"] == 3
    bark = [p for p in json.loads(get(server + "api/mixture?id=test_0000000")[1])["phrases"] if p["label"] == "Bark"]
    assert found["truth"][0] == sorted(s for p in bark for s in p["segments"]) and found["truth"][1] is None
    wav = tmp_path / "test_0000000.flac"
    wav.write_bytes((view_data.mixtures / "audio" / "test" / "test_0000000.flac").read_bytes())
    assert (
        main(
            [
                "detect",
                str(wav),
                "--query",
                "bark",
                "--query",
                "siren",
                "--checkpoint",
                str(view_data.checkpoint),
                "--params",
                str(tmp_path / "none.yaml"),
                "--device",
                "cpu",
                "--format",
                "tsv",
            ]
        )
        == 0
    )
    rows = [line.split("\t") for line in capsys.readouterr().out.strip().splitlines()[1:]]
    printed = sorted((q, round(float(a), 6), round(float(b), 6)) for _, a, b, q in rows)
    shown = sorted((q, round(a, 6), round(b, 6)) for q, evs in zip(found["queries"], found["events"]) for a, b, _ in evs)
    assert printed == shown and printed


def test_a_bad_path_is_one_line_and_status_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "absent"):
        assert main(["view", str(path), "--port", "0"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("sedsynth view: error: ") and "shard folder" in err, err


def test_the_command_prints_its_url_and_serves(view_data, tmp_path):
    """The real command in its own process, on a free port, stopped once it answered."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sedsynth", "view", str(view_data.evaluation), "--data", str(view_data.shards), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        line = proc.stdout.readline().strip()  # the URL, once it listens (or "" if it died)
        assert line.startswith("http://127.0.0.1:"), (line, proc.poll(), proc.stderr.read() if proc.poll() is not None else "")
        info = json.loads(get(line + "api/info")[1])
        assert (
            info["dataset"]["mixtures"] == 30 and info["evaluation"]["split"] == "test" and info["detect"]["available"] is False
        )
    finally:
        proc.terminate()
        proc.wait(TIMEOUT_S)


def test_a_port_in_use_or_a_missing_checkpoint_is_one_line_and_status_2(view_data, tmp_path, capsys):
    import socket
    import tempfile

    folders = set(Path(tempfile.gettempdir()).glob("sedsynth-view-*"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["view", str(view_data.shards), "--port", str(port), "--checkpoint", str(view_data.checkpoint)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("sedsynth view: error: port ") and "in use" in err[-1]
    assert set(Path(tempfile.gettempdir()).glob("sedsynth-view-*")) == folders  # no upload folder left behind
    assert main(["view", str(view_data.shards), "--port", "0", "--checkpoint", str(tmp_path / "none.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sedsynth view: error: --checkpoint ") and "does not exist" in err[0]


@pytest.mark.parametrize("entry", ["../outside.parquet", "/etc/passwd", "data/link.parquet"])
def test_an_index_entry_out_of_the_shard_folder_is_refused(view_data, tmp_path, capsys, entry):
    folder = tmp_path / "shards"
    (folder / "data").mkdir(parents=True)
    shutil.copy(view_data.shards / "data" / "test-00000-of-00001.parquet", tmp_path / "outside.parquet")
    os.symlink(tmp_path / "outside.parquet", folder / "data" / "link.parquet")
    (folder / "index.json").write_text(json.dumps({"files": [{"path": entry, "split": "test"}]}))
    assert main(["view", str(folder), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sedsynth view: error: ") and "index.json entry" in err[0], err
