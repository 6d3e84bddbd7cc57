"""``sedsynth ablate``, the command around :mod:`trainer.ablations`: which variants and seeds it
trains (a recording ``run_variant`` stands in for training) or queues, and the usage it refuses."""

from __future__ import annotations

from sedsynth.cli import main
from tests.conftest import ROOT
from trainer import ablations

SEEDS = (1234, 1235, 1236)
EXTRAS = ("caption_loss", "sam")


def test_the_command_runs_one_seed_or_all_in_turn(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(ablations, "run_variant", lambda params, variant, seed, **stages: ran.append((variant, seed)))
    params_file = str(ROOT / "params.yaml")
    assert main(["ablate", "no_frame_loss", "--seed", "1235", "--params", params_file]) == 0
    assert ran == [("no_frame_loss", 1235)]
    ran.clear()
    assert main(["ablate", "no_frame_loss", "full", "--params", params_file]) == 0
    assert ran == [("no_frame_loss", s) for s in SEEDS] + [("full", s) for s in SEEDS]
    ran.clear()
    assert main(["ablate", "full", "nope", "--params", params_file]) == 2 and ran == []  # names checked first
    assert main(["ablate", "--table", "--seed", "1234", "--params", params_file]) == 2
    assert "--seed" in capsys.readouterr().err


def test_queueing_without_names_queues_table_5_only(monkeypatch):
    queued = []
    monkeypatch.setattr(ablations, "queue_experiments", lambda params, variants, seeds: queued.append(variants) or {})
    assert main(["ablate", "--queue", "--params", str(ROOT / "params.yaml")]) == 0
    assert queued == [list(ablations.TABLE5)] and not set(EXTRAS) & set(queued[0])
    assert set(EXTRAS) <= set(ablations.VARIANTS)
