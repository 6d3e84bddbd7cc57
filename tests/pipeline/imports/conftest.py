"""Helpers for the import tests: stand-in audio, an AudioSet-Strong root in the published layout, a small cluster index.

:func:`write_tone` writes a sine file of any length, rate and channel count (the format follows
the suffix: ``.wav`` or ``.flac``, 16-bit). :func:`write_audioset_strong` lays out the released
TSVs with the quirks real ones have (ids with leading dashes and inner underscores, MIDs the
class list lacks, rows without audio, overlapping same-label regions, regions past the clip's
end, a stereo 44.1 kHz file, a corrupt file, a silent one). :class:`MidIndex` stands in for
the SentenceBERT :class:`~pipeline.text.clustering.ClusterIndex`: MID match, else cluster 0 at
a low similarity, so writer tests need no model.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pipeline.config.params import ComputeParams
from pipeline.text.clustering import load_inventory
from trainer.config import Params


def write_tone(path: Path, seconds: float, rate_hz: int, freq_hz: float, channels: int = 1) -> Path:
    """A sine at -12 dBFS RMS, ``seconds`` long, written as 16-bit WAV or FLAC (by the suffix); returns ``path``."""
    n = int(round(seconds * rate_hz))
    x = (np.sqrt(2) * 10 ** (-12 / 20) * np.sin(2 * np.pi * freq_hz * np.arange(n) / rate_hz)).astype(np.float32)
    samples = np.stack([x * (1.0 - 0.2 * c) for c in range(channels)], axis=1) if channels > 1 else x
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), samples, rate_hz, subtype="PCM_16", format="FLAC" if path.suffix == ".flac" else "WAV")
    return path


TRAIN_TSV = """segment_id\tstart_time_seconds\tend_time_seconds\tlabel
-0RWZT-miFs_420000\t0.5\t2.0\t/m/05tny_
-0RWZT-miFs_420000\t1.8\t3.0\t/m/05tny_
-0RWZT-miFs_420000\t4.0\t6.0\t/m/09x0r
abc_def_30000\t1.0\t2.0\t/m/09x0r
abc_def_30000\t2.0\t3.0\t/m/zzzz_unknown
abc_def_30000\t8.0\t12.5\t/m/05tny_
abc_def_30000\t12.0\t14.0\t/m/09x0r
--dash_1000\t0.0\t1.0\t/m/09x0r
gone_clip_10000\t0.0\t1.0\t/m/09x0r
corrupt_0\t0.0\t1.0\t/m/09x0r
silent_5000\t0.0\t1.0\t/m/09x0r
nounderscore\t0.0\t1.0\t/m/09x0r
bad_time_0\tabc\t1.0\t/m/09x0r
"""

EVAL_TSV = """segment_id\tstart_time_seconds\tend_time_seconds\tlabel
evalclip_0\t3.0\t3.0\t/m/09x0r
evalclip_0\t0.0\t1.0\t/m/05tny_
"""


def write_audioset_strong(root: Path) -> Path:
    """The fixture corpus (see the module docstring); returns ``root``."""
    audio = root / "audio"
    (root / "audioset_train_strong.tsv").parent.mkdir(parents=True, exist_ok=True)
    (root / "audioset_train_strong.tsv").write_text(TRAIN_TSV, encoding="utf-8")
    (root / "audioset_eval_strong.tsv").write_text(EVAL_TSV, encoding="utf-8")
    (root / "mid_to_display_name.tsv").write_text("/m/09x0r\tSpeech\n/m/05tny_\tBark\n", encoding="utf-8")
    write_tone(audio / "-0RWZT-miFs_420000.wav", 10.0, 44100, 440.0, channels=2)
    write_tone(audio / "abc_def_30000.flac", 10.0, 16000, 300.0)
    write_tone(audio / "Y--dash_1000.wav", 4.0, 8000, 200.0)
    (audio / "corrupt_0.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt garbage that no decoder reads")
    sf.write(str(audio / "silent_5000.wav"), np.zeros(16000, np.float32), 16000, subtype="PCM_16")
    write_tone(audio / "evalclip_0.wav", 5.0, 16000, 500.0)
    return root


class MidIndex:
    """A stand-in ClusterIndex over the shipped inventory: the MID's cluster, else cluster 0 at similarity 0.3 ("sbert")."""

    def __init__(self):
        self.clusters = load_inventory()
        self.by_mid = {c["mid"]: c["id"] for c in self.clusters if c["mid"]}

    def assign(self, phrases: list[str], mids: list[str]) -> list[tuple[int, float, str, int, float]]:
        return [(self.by_mid[m], 0.9, "mid", 0, 0.2) if m in self.by_mid else (0, 0.3, "sbert", 1, 0.25) for m in mids]

    def near_synonyms(self, threshold: float) -> list[tuple[int, ...]]:
        return [() for _ in self.clusters]


@pytest.fixture
def import_params() -> Params:
    """Default params run in-process, with small shards so a split spans several row groups."""
    p = Params()
    return replace(
        p, compute=ComputeParams(workers=1, chunk_size=2), shards=replace(p.shards, shard_size_mb=0.5, row_group_size_mb=0.2)
    )


@pytest.fixture
def audioset_root(tmp_path) -> Path:
    return write_audioset_strong(tmp_path / "audioset_strong")
