"""The event-clip machinery the clip stage and ``sedsynth bench clip`` share: planning and cutting one clip."""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile as sf

from pipeline.clip.cutting import AUDIO_DIR, clip_one, plan_clips
from pipeline.config.params import ClipParams
from pipeline.schema import EventClip, Skip
from tests.conftest import BARK, BARK_AND_MEOW, ROOT, tone_burst, write_fsd50k
from tests.test_layers import import_graph

SR = 44100


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    dev = [(1, *BARK, "train"), (2, *BARK_AND_MEOW, "train"), (3, *BARK, "val")]
    audio = {
        "1": (tone_burst(SR, 4.0, 1.0, 3.0), SR, "PCM_16"),
        "2": (tone_burst(SR, 4.0, 1.0, 3.0), SR, "PCM_16"),
        "3": (tone_burst(SR, 4.0, 0.5, 0.9), SR, "PCM_16"),
    }
    return write_fsd50k(tmp_path / "FSD50K", dev, [], audio)


def test_plan_keeps_single_label_clips_of_the_asked_splits(corpus: Path) -> None:
    tasks, skips = plan_clips(corpus, ClipParams(splits=("train",)))
    assert [(t.clip.clip_id, t.label, t.audioset_name) for t in tasks] == [("fsd50k-1", "Bark", "Bark")]
    assert [(s.item_id, s.reason) for s in skips] == [("fsd50k-2", "multi-label")]


def test_clip_one_writes_the_segment_it_describes(corpus: Path, tmp_path: Path) -> None:
    p = ClipParams()
    tasks, _ = plan_clips(corpus, p)
    audio_dir = tmp_path / AUDIO_DIR
    audio_dir.mkdir()
    kept, refused = (clip_one(t, p, 16000, audio_dir) for t in tasks)
    assert isinstance(kept, EventClip) and kept.audio_path == f"{AUDIO_DIR}/fsd50k-1.flac"
    assert abs(kept.onset_in_source_s - 1.0) < 0.05 and abs(kept.offset_in_source_s - 3.0) < 0.05
    assert sf.info(str(tmp_path / kept.audio_path)).frames == kept.num_samples
    assert isinstance(refused, Skip) and refused.reason == "too-short"
    assert sorted(f.name for f in audio_dir.iterdir()) == ["fsd50k-1.flac"]


def test_the_clip_benchmark_imports_the_machinery_not_the_stage() -> None:
    imports = import_graph(ROOT)["benchmarks.run"]
    assert "pipeline.clip.cutting" in imports
    assert not any(m.startswith("pipeline.stages") for m in imports)
