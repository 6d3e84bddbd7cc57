"""``sedsynth bench view``: the view's speed on a large dataset, against a real server on 127.0.0.1.

Input: the parsed arguments (``rows``, the dataset's size, default 100,000; ``repeat``, the
warm passes timed per figure, the fastest reported; ``save``, where given, a result file to write) and the params
(``evaluate.checkpoint``, ``evaluate`` settings, ``sample_rate_hz``, ``shards``). Output: a
table on stdout, each figure against its target, and the figures as a dict
(:func:`bench_view`); :func:`main` returns the exit status.

What it builds, in a temporary folder: a shard folder of ``rows`` mixtures in the real shard
schema, written by the shards stage's writer (:func:`~pipeline.shards.writer.write_shards`),
with real metadata (ids, splits, captions, 1 to 4 phrases with segments, SNRs, clusters) and
files and row groups cut as a dataset of 10 s FLAC mixtures would be (about 220 KB each). The
audio cells are one short FLAC shared by every row, except the row group holding the mixtures
the page is timed on, whose cells are a real 10 s FLAC: a mixture's audio is then read from
behind a full row group's worth of audio, as in a real folder. A second folder of ``rows / 10``
mixtures is built the same way for the memory figure.

What it times, each server in its own process (so its memory is its own), serving through
:func:`~sedsynth.view.server.make_app` on a free port of 127.0.0.1:

- the first page of the list (``mixtures?page=1&per_page=25``, what the page asks first): cold,
  the first request after the server listens, then warm;
- a mixture page as the page loads it: its metadata, then its audio and spectrogram together;
- a text query (``detect``) on a 10 s mixture, with torch on 2 threads, through
  ``evaluate.checkpoint`` where it exists, else the default model (``train.model``) at fresh
  weights, saved through the trainer's checkpoint writer;
- the server's resident memory after the first page, at ``rows`` and at ``rows / 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import io
import json
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

TARGETS = {
    "first_page_cold_ms": 1000.0,
    "first_page_warm_ms": 1000.0,
    "mixture_page_ms": 300.0,
    "detect_ms": 500.0,
    "rss_ratio": 2.0,
}
MIXTURE_BYTES = 220_000  # a 10 s 16 kHz FLAC mixture: what files and row groups are cut by
TIMED_MIXTURES = 3  # distinct mixtures the mixture page and queries are timed on (each is cached once served)
QUERY_THREADS = 2
PER_PAGE = 25
REQUEST_TIMEOUT_S = 120.0
START_TIMEOUT_S = 300.0
LABELS = (
    "dog_bark",
    "door_knock",
    "speech",
    "siren",
    "car_horn",
    "glass_break",
    "footsteps",
    "rain",
    "alarm_clock",
    "baby_cry",
    "cat_meow",
    "church_bell",
    "engine_idling",
    "gunshot",
    "keyboard_typing",
    "laughter",
    "phone_ring",
    "vacuum_cleaner",
    "water_tap",
    "wind",
    "bird_song",
    "applause",
    "cough",
    "drill",
    "frying",
    "guitar",
    "helicopter",
    "hammer",
    "sneeze",
    "whistle",
    "train",
    "thunder",
)
QUERIES = ("dog barking", "someone knocking on a door", "a siren wailing", "glass breaking", "a car horn")


def flac(seconds: float, rate: int, seed: int) -> bytes:
    """``seconds`` of quiet noise with tone bursts at ``rate``, as 16-bit mono FLAC bytes."""
    import soundfile as sf

    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    audio = 0.05 * rng.standard_normal(n)
    for start in np.arange(0.5, seconds, 2.0):
        on = (t >= start) & (t < start + 0.8)
        audio[on] += 0.3 * np.sin(2 * np.pi * rng.uniform(300, 3000) * t[on])
    buf = io.BytesIO()
    sf.write(buf, np.clip(audio, -1, 1).astype(np.float32), rate, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


def _splits(rows: int) -> dict[str, range]:
    """80% train, 10% valid, the rest test, as consecutive row numbers."""
    train, valid = int(rows * 0.8), int(rows * 0.1)
    return {"train": range(0, train), "valid": range(train, train + valid), "test": range(train + valid, rows)}


def build_dataset(folder: Path, rows: int, rate: int, shards, real_audio: bytes, timed: int = TIMED_MIXTURES) -> list[str]:
    """A shard folder of ``rows`` mixtures in ``folder``; returns the ids of the ``timed`` mixtures that hold ``real_audio``.

    Those are the last rows of the first row group; the rows before them in that group hold
    ``real_audio`` too (as many as a full group holds, at most ``rows // 100``); every other
    row holds one short shared FLAC."""
    import pyarrow as pa

    from pipeline.shards.layout import shard_schema
    from pipeline.shards.writer import MB, plan_chunks, write_shards

    splits = _splits(rows)
    group = plan_chunks([MIXTURE_BYTES] * len(splits["train"]), shards.row_group_size_mb * MB)[0][1]
    heavy = range(max(0, group - max(timed, min(group, rows // 100))), group)
    tiny = flac(0.05, rate, 1)
    sha = {id(tiny): hashlib.sha256(tiny).hexdigest(), id(real_audio): hashlib.sha256(real_audio).hexdigest()}
    rng = np.random.default_rng(0)
    n_phrases = rng.integers(1, 5, rows)
    label_of = rng.integers(0, len(LABELS), (rows, 4))
    onsets = rng.uniform(0.0, 8.0, (rows, 4, 3))
    lengths = rng.uniform(0.2, 2.0, (rows, 4, 3))
    n_segments = rng.integers(1, 4, (rows, 4))
    snrs = rng.uniform(-5.0, 20.0, (rows, 4))
    schema = shard_schema(rate)

    def row(k: int, split: str) -> dict:
        audio = real_audio if k in heavy else tiny
        phrases = []
        for j in range(int(n_phrases[k])):
            label = LABELS[int(label_of[k, j])]
            segments = sorted(
                (float(a), float(min(10.0, a + b))) for a, b in zip(onsets[k, j, : n_segments[k, j]], lengths[k, j])
            )
            phrases.append(
                {
                    "phrase": label.replace("_", " "),
                    "label": label,
                    "mid": f"/m/{int(label_of[k, j]):04d}",
                    "cluster_id": int(label_of[k, j]) % 12,
                    "segments": [{"start_s": a, "end_s": b} for a, b in segments],
                    "source_clip_ids": [f"clip-{(k * 7 + j) % 50000:05d}"],
                    "snr_db": [float(snrs[k, j])] * len(segments),
                }
            )
        caption = " and ".join(p["phrase"] for p in phrases)
        return {
            "id": f"mix-{k:07d}",
            "audio": {"bytes": audio, "path": f"mix-{k:07d}.flac"},
            "audio_sha256": sha[id(audio)],
            "sample_rate_hz": rate,
            "duration_s": 10.0,
            "caption": f"{caption[0].upper()}{caption[1:]}.",
            "phrases": phrases,
            "background_id": f"bg-{k % 997:04d}",
            "split": split,
            "license": "CC-BY-4.0",
            "licenses": ["CC-BY-4.0"],
            "attribution": [f"clip-{(k * 7) % 50000:05d} by someone"],
            "seed": k,
        }

    def table_of(items) -> pa.Table:  # a row group's rows, all of one split
        name = next(n for n, r in splits.items() if items[0] in r)
        return pa.Table.from_pylist([row(k, name) for k in items], schema=schema)

    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stderr(io.StringIO()):  # the writer's progress bar
        write_shards(
            folder,
            rate,
            {name: list(r) for name, r in splits.items() if len(r)},
            lambda k: MIXTURE_BYTES,
            row_of=None,
            shard_size_mb=shards.shard_size_mb,
            row_group_size_mb=shards.row_group_size_mb,
            compression=shards.compression,
            desc="bench view",
            table_of=table_of,
        )
    return [f"mix-{k:07d}" for k in list(heavy)[-timed:]]


def fresh_checkpoint(params, path: Path) -> Path:
    """The default model (``train.model``) at fresh weights, written to ``path`` through the trainer's checkpoint writer."""
    import torch

    from trainer import checkpoint
    from trainer.model import build_model
    from trainer.objective import Objective
    from trainer.stages.train import config_of

    torch.manual_seed(0)
    objective = Objective(build_model(params.train.model), params.train.loss)
    checkpoint.save(path, objective, step=0, epoch=0, batches_in_epoch=0, config=config_of(params))
    return path


def _serve() -> None:
    """A server process (``python -c``): reads ``(folder, checkpoint, evaluate params, threads)`` pickled on stdin, serves the
    catalog of ``folder`` (and the checkpoint) on a free port of 127.0.0.1 until SIGINT, and prints its URL on stdout."""
    import pickle

    from sedsynth.view.catalog import open_catalog
    from sedsynth.view.server import make_app, serve

    folder, checkpoint, evaluate, threads = pickle.loads(sys.stdin.buffer.read())
    if checkpoint is not None:
        import torch

        torch.set_num_threads(threads)
    app = make_app(open_catalog(folder), None, checkpoint, evaluate, device="cpu")
    try:
        asyncio.run(serve(app, "127.0.0.1", 0, lambda url: print(url, flush=True)))
    except KeyboardInterrupt:
        pass


class Server:
    """A view server in a process of its own (so its memory is its own), stopped with SIGINT on exit."""

    def __init__(self, folder: Path, checkpoint: str | None, evaluate):
        self.setting = pickle.dumps((str(folder), checkpoint, evaluate, QUERY_THREADS))

    def __enter__(self) -> Server:
        started = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from sedsynth.view.bench import _serve; _serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=False,
        )
        self.process.stdin.write(self.setting)
        self.process.stdin.close()
        found: list[bytes] = []
        reader = threading.Thread(target=lambda: found.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        if not found or not found[0].startswith(b"http://"):
            self.__exit__()
            raise RuntimeError(
                f"the view server did not start within {START_TIMEOUT_S:.0f} s (exit status {self.process.poll()})"
            )
        self.url = found[0].decode().strip()
        self.start_s = time.perf_counter() - started
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # serve()'s cleanup runs: the upload folder is removed
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self.process.stdout.close()

    def rss_mb(self) -> float:
        import psutil

        return psutil.Process(self.process.pid).memory_info().rss / 1e6

    def get(self, path: str) -> tuple[float, bytes]:
        """Milliseconds to GET ``path`` (under the server's URL) and read the whole body; raises for a status other than 200/206."""
        started = time.perf_counter()
        with urllib.request.urlopen(self.url + path, timeout=REQUEST_TIMEOUT_S) as response:
            body = response.read()
        return (time.perf_counter() - started) * 1000, body

    def post(self, path: str, payload: dict) -> tuple[float, dict]:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(payload).encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            body = response.read()
        return (time.perf_counter() - started) * 1000, json.loads(body)

    def wait_for_model(self) -> None:
        """Until ``info`` says the checkpoint has loaded (or failed to): at most :data:`START_TIMEOUT_S`."""
        deadline = time.perf_counter() + START_TIMEOUT_S
        while time.perf_counter() < deadline:
            detect = json.loads(self.get("api/info")[1])["detect"]
            if not detect.get("loading", False):
                if not detect.get("available"):
                    raise RuntimeError(f"the checkpoint did not load: {detect.get('error')}")
                return
            time.sleep(0.2)
        raise RuntimeError(f"the checkpoint did not load within {START_TIMEOUT_S:.0f} s")


FIRST_PAGE = f"api/mixtures?page=1&per_page={PER_PAGE}"


def mixture_page(server: Server, mixture_id: str, pool: ThreadPoolExecutor) -> float:
    """Milliseconds to load a mixture's page as the page does: its metadata, then its audio and spectrogram together."""
    started = time.perf_counter()
    server.get(f"api/mixture?id={mixture_id}")
    audio, picture = (
        pool.submit(server.get, f"api/audio?id={mixture_id}"),
        pool.submit(server.get, f"api/spectrogram?id={mixture_id}"),
    )
    if not picture.result()[1].startswith(b"\x89PNG") or not audio.result()[1].startswith(b"fLaC"):
        raise RuntimeError(f"mixture {mixture_id}: not the FLAC and PNG expected")
    return (time.perf_counter() - started) * 1000


def _best(values: list[float]) -> float:
    """The fastest of the warm passes (``--repeat``), as every ``sedsynth bench`` reports."""
    return round(float(min(values)), 1)


def bench_view(rows: int, repeat: int, params, out=None) -> dict:
    """Build the datasets, run the servers, time them; print the table to ``out`` (default stdout) and return the figures."""
    if rows < 20:
        raise ValueError(f"--rows {rows}: at least 20 (the memory figure compares it with rows / 10)")
    repeat = max(1, repeat)
    timed = max(TIMED_MIXTURES, repeat + 1)
    rate = int(getattr(params, "sample_rate_hz", 16000))
    evaluate = replace(params.evaluate, device="cpu")
    figures: dict = {"rows": rows, "rows_small": rows // 10, "repeat": repeat}
    with tempfile.TemporaryDirectory(prefix="sedsynth-bench-view-") as tmp:
        tmp = Path(tmp)
        started = time.perf_counter()
        real = flac(10.0, rate, 2)
        ids = build_dataset(tmp / "large", rows, rate, params.shards, real, timed)
        build_dataset(tmp / "small", rows // 10, rate, params.shards, real, timed)
        figures["build_s"] = round(time.perf_counter() - started, 1)
        figures["audio_kb"] = round(len(real) / 1000, 1)

        rss = {}
        for name, folder in (("small", tmp / "small"), ("large", tmp / "large")):
            with Server(folder, None, evaluate) as server:
                cold, body = server.get(FIRST_PAGE)
                if len(json.loads(body)["rows"]) != min(PER_PAGE, rows if name == "large" else rows // 10):
                    raise RuntimeError("the first page does not hold the rows expected")
                rss[name] = server.rss_mb()
                if name == "large":
                    figures["start_s"] = round(server.start_s, 2)
                    figures["first_page_cold_ms"] = round(cold, 1)
                    figures["first_page_warm_ms"] = _best([server.get(FIRST_PAGE)[0] for _ in range(repeat)])
                    figures["filtered_page_ms"] = _best(
                        [
                            server.get(f"api/mixtures?label=siren&min_events=3&text=dog&per_page={PER_PAGE}")[0]
                            for _ in range(repeat)
                        ]
                    )
        figures["rss_mb"] = round(rss["large"], 1)
        figures["rss_small_mb"] = round(rss["small"], 1)
        figures["rss_ratio"] = round(rss["large"] / rss["small"], 2)

        checkpoint = Path(params.evaluate.checkpoint)
        if checkpoint.is_file():
            figures["checkpoint"] = f"evaluate.checkpoint ({checkpoint})"
        else:
            checkpoint = fresh_checkpoint(params, tmp / "fresh.pt")
            figures["checkpoint"] = (
                f"the default model (train.model) at fresh weights; no file at evaluate.checkpoint ({params.evaluate.checkpoint})"
            )
        with Server(tmp / "large", str(checkpoint), evaluate) as server, ThreadPoolExecutor(2) as pool:
            server.wait_for_model()
            pages = [mixture_page(server, mixture_id, pool) for mixture_id in ids[: repeat + 1]]
            figures["mixture_page_cold_ms"] = round(pages[0], 1)
            figures["mixture_page_ms"] = _best(pages[1:])
            queries = [
                server.post("api/detect", {"id": ids[k % len(ids)], "queries": [QUERIES[k % len(QUERIES)]]})
                for k in range(repeat + 1)
            ]
            if any(len(q[1]["probs"]) != 1 or not q[1]["probs"][0] for q in queries):
                raise RuntimeError("a query came back without probabilities")
            figures["detect_cold_ms"] = round(queries[0][0], 1)
            figures["detect_ms"] = _best([q[0] for q in queries[1:]])
            figures["detect_model_ms"] = _best([q[1]["seconds"] * 1000 for q in queries[1:]])
            figures["torch_threads"] = QUERY_THREADS
    figures["met"] = {name: bool(figures[name] <= target) for name, target in TARGETS.items()}
    print_table(figures, out if out is not None else sys.stdout)
    return figures


def print_table(figures: dict, out) -> None:
    rows, small = figures["rows"], figures["rows_small"]
    lines = [
        (f"first page of {rows:,} rows, cold", f"{figures['first_page_cold_ms']:.0f} ms", "first_page_cold_ms"),
        (f"first page of {rows:,} rows, warm", f"{figures['first_page_warm_ms']:.0f} ms", "first_page_warm_ms"),
        ("mixture page (metadata, audio, spectrogram)", f"{figures['mixture_page_ms']:.0f} ms", "mixture_page_ms"),
        (f"detect, one query on a 10 s clip, {figures['torch_threads']} threads", f"{figures['detect_ms']:.0f} ms", "detect_ms"),
        (
            f"server RSS, {rows:,} rows / {small:,} rows",
            f"{figures['rss_mb']:.0f} / {figures['rss_small_mb']:.0f} MB = {figures['rss_ratio']:.2f}x",
            "rss_ratio",
        ),
    ]
    targets = {
        "first_page_cold_ms": "< 1000 ms",
        "first_page_warm_ms": "< 1000 ms",
        "mixture_page_ms": "< 300 ms",
        "detect_ms": "< 500 ms",
        "rss_ratio": f"< {TARGETS['rss_ratio']:.0f}x (10x the rows)",
    }
    width = max(len(w) for w, _, _ in lines)
    print(
        f"bench view: {rows:,} mixtures built in {figures['build_s']} s; server listening {figures['start_s']} s after start",
        file=out,
    )
    print(f"bench view: checkpoint: {figures['checkpoint']}", file=out)
    print(f"{'what':<{width}}  {'measured':>22}  {'target':<26}  met", file=out)
    for what, measured, key in lines:
        print(f"{what:<{width}}  {measured:>22}  {targets[key]:<26}  {'yes' if figures['met'][key] else 'no'}", file=out)
    print(
        f"bench view: cold: first page {figures['first_page_cold_ms']:.0f} ms, mixture page {figures['mixture_page_cold_ms']:.0f} ms, "
        f"detect {figures['detect_cold_ms']:.0f} ms; filtered page {figures['filtered_page_ms']:.0f} ms; "
        f"detect model time {figures['detect_model_ms']:.0f} ms",
        file=out,
    )


def main(args: argparse.Namespace, params) -> int:
    """``sedsynth bench view``: print the table; with ``--save PATH`` also write the result file. Returns the exit status."""
    from trainer.config import Params

    params = params or Params()
    save = getattr(args, "save", None)
    if save is None:
        bench_view(args.rows, args.repeat, params)
        return 0
    from benchmarks.run import _Tee, save_result

    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        figures = bench_view(args.rows, args.repeat, params)
    save_result(Path(save), args, figures, tee.kept.getvalue())
    print(f"bench view: figures saved to {save}", file=sys.stderr)
    return 0
