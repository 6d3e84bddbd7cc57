"""The source bank: every event clip and background segment, decoded once, memory-mapped.

Input: the event and background manifests and their folders. Output: a folder holding
``events.pcm`` and ``backgrounds.pcm`` (16-bit samples at the mixing rate, one clip after the
other) and ``index.json`` (id -> offset and length). Each worker maps the files read-only, so
sources are decoded once per run instead of once per mixture, the operating system shares the
pages between workers, and a worker's memory does not grow with the number of mixtures.
:meth:`SourceBank.release` drops the pages a worker has touched from its mapping (they stay in
the page cache), so its resident size stays at one partition's sources, not the whole bank's.

:class:`FileSources` reads the same samples straight from the FLAC files; it re-renders a
mixture from its recipe without a bank.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from pipeline.audio import AudioError, downmix, open_audio, quantize_int16, read_audio, read_int16, resample
from pipeline.outputs import write_atomic

if TYPE_CHECKING:
    from pipeline.schema import BackgroundSegment, EventClip

INDEX = "index.json"
COMPLETE = "complete"


def load_source(path: Path, sample_rate_hz: int) -> np.ndarray:
    """One stored clip as int16 at ``sample_rate_hz`` (resampled with libsoxr if needed).

    A 16-bit mono file at that rate (what the clip and ambience stages write) is read as its
    integers: scaling them to float and quantizing back gives the same values, in a third of the time.
    """
    with open_audio(path) as f:
        if f.subtype == "PCM_16" and f.channels == 1 and f.samplerate == sample_rate_hz:
            q = read_int16(f)
            if q.shape[0] == 0:
                raise AudioError("empty", "the file has no samples")
            return q
    decoded = read_audio(path)
    if decoded.sample_rate_hz == sample_rate_hz and decoded.channels == 1:
        return quantize_int16(decoded.samples[:, 0])
    return quantize_int16(resample(downmix(decoded.samples), decoded.sample_rate_hz, sample_rate_hz))


def build_bank(bank_dir: Path, sample_rate_hz: int, events: list[tuple[str, Path]], backgrounds: list[tuple[str, Path]]) -> None:
    """Decode ``(id, path)`` lists into ``bank_dir``; a ``complete`` marker is written last."""
    bank_dir.mkdir(parents=True, exist_ok=True)
    index: dict = {"sample_rate_hz": sample_rate_hz}
    for kind, items in (("events", events), ("backgrounds", backgrounds)):
        offsets, lengths = [], []
        position = 0
        with open(bank_dir / f"{kind}.pcm", "wb") as f:
            for _, path in tqdm(items, desc=f"bank {kind}", unit="clip", disable=None, dynamic_ncols=True):
                q = load_source(path, sample_rate_hz)
                f.write(q.tobytes())
                offsets.append(position)
                lengths.append(int(q.shape[0]))
                position += q.shape[0]
        index[kind] = {"ids": [i for i, _ in items], "offsets": offsets, "lengths": lengths}
    write_atomic(bank_dir / INDEX, json.dumps(index).encode("utf-8"))
    write_atomic(bank_dir / COMPLETE, b"")


def bank_sources(
    event_pools: dict[str, list[EventClip]], bg_pools: dict[str, list[BackgroundSegment]], events_dir: Path, backgrounds_dir: Path
) -> tuple[list[tuple[str, Path]], list[tuple[str, Path]]]:
    """Every source the pools use, once, in id order: the ``(id, path)`` lists a bank is built from."""
    ev = {e.clip_id: e for pool in event_pools.values() for e in pool}
    bg = {b.segment_id: b for pool in bg_pools.values() for b in pool}
    return (
        [(i, events_dir / ev[i].audio_path) for i in sorted(ev)],
        [(i, backgrounds_dir / bg[i].audio_path) for i in sorted(bg)],
    )


def ensure_bank(bank_dir: Path, sample_rate_hz: int, events: list[tuple[str, Path]], backgrounds: list[tuple[str, Path]]) -> None:
    """:func:`build_bank`, unless ``bank_dir`` already holds a complete bank (a partial one is built again)."""
    if (bank_dir / COMPLETE).exists():
        return
    shutil.rmtree(bank_dir, ignore_errors=True)
    build_bank(bank_dir, sample_rate_hz, events, backgrounds)


class _Table:
    def __init__(self, pcm: Path, entry: dict):
        # a plain ndarray over the mapped pages, not np.memmap: a memmap's slices are memmaps
        # too, and numpy's subclass hooks cost every operation on them (15 us on 10 s of samples)
        self._map: mmap.mmap | None = None
        if os.path.getsize(pcm):
            with open(pcm, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self.samples = np.frombuffer(self._map, dtype=np.int16)
        else:
            self.samples = np.zeros(0, np.int16)
        self.rows = {cid: (o, n) for cid, o, n in zip(entry["ids"], entry["offsets"], entry["lengths"])}

    def release(self) -> None:
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def get(self, item_id: str) -> np.ndarray:
        offset, length = self.rows[item_id]
        return self.samples[offset : offset + length]


class SourceBank:
    """Read-only access to a built bank: ``event(clip_id)`` and ``background(segment_id)`` as int16."""

    def __init__(self, bank_dir: Path):
        bank_dir = Path(bank_dir)
        if not (bank_dir / COMPLETE).exists():
            raise FileNotFoundError(f"{bank_dir} is not a complete source bank; re-run the mix stage to rebuild it")
        index = json.loads((bank_dir / INDEX).read_text(encoding="utf-8"))
        self.sample_rate_hz = int(index["sample_rate_hz"])
        self._events = _Table(bank_dir / "events.pcm", index["events"])
        self._backgrounds = _Table(bank_dir / "backgrounds.pcm", index["backgrounds"])

    def event(self, clip_id: str) -> np.ndarray:
        return self._events.get(clip_id)

    def background(self, segment_id: str) -> np.ndarray:
        return self._backgrounds.get(segment_id)

    def release(self) -> None:
        """Unmap the pages read so far from this process (read again from the page cache when next
        touched). Every array handed out stays valid and keeps its samples; a worker calls this
        after each partition, so its resident size does not grow to the whole bank's."""
        self._events.release()
        self._backgrounds.release()


class FileSources:
    """The bank's interface over the stage folders: reads FLAC files on demand (cached)."""

    def __init__(
        self,
        events_dir: Path,
        backgrounds_dir: Path,
        sample_rate_hz: int,
        event_paths: dict[str, str],
        background_paths: dict[str, str],
    ):
        self.sample_rate_hz = sample_rate_hz
        self._dirs = (Path(events_dir), Path(backgrounds_dir))
        self._paths = (event_paths, background_paths)
        self._cache: dict[tuple[int, str], np.ndarray] = {}

    def _get(self, kind: int, item_id: str) -> np.ndarray:
        key = (kind, item_id)
        if key not in self._cache:
            self._cache[key] = load_source(self._dirs[kind] / self._paths[kind][item_id], self.sample_rate_hz)
        return self._cache[key]

    def event(self, clip_id: str) -> np.ndarray:
        return self._get(0, clip_id)

    def background(self, segment_id: str) -> np.ndarray:
        return self._get(1, segment_id)
