"""Numbers as params files and --set write them, and the upper bounds of the mixing spec's costly knobs.

- A float setting written with an exponent and no dot (``1e-4``), which YAML 1.2 (DVC) reads as a
  number and PyYAML as a string, is the number.
- A mix spec knob whose cost grows with its value (tries, events, occurrences, duration) is refused
  above its bound, naming the knob, when params load.
"""

from __future__ import annotations

import pytest

from pipeline.config.mix_spec import MAX_DURATION_S, MAX_EVENTS, MAX_OCCURRENCES, MAX_PLACEMENT_TRIES, resolve_spec
from pipeline.config.params import ParamsError, load_params, parse_override
from tests.conftest import ROOT
from trainer.config import SECTIONS

PARAMS = ROOT / "params.yaml"


@pytest.mark.parametrize("text, value", [("1e-4", 1e-4), ("5E+3", 5e3), ("-2.5e1", -25.0), (".5e-1", 0.05)])
def test_a_float_with_an_exponent_and_no_dot_is_that_number(text: str, value: float) -> None:
    p = load_params(PARAMS, parse_override(f"mix.relabel.absolute_floor_db={text}"), skip_sections=SECTIONS)
    assert p.mix.relabel.absolute_floor_db == value


def test_an_exponent_too_large_for_a_float_is_refused() -> None:
    with pytest.raises(ParamsError, match=r"^params: 'captions.llm.timeout_s' is inf; use a finite number$"):
        load_params(PARAMS, parse_override("captions.llm.timeout_s=1e999"), skip_sections=SECTIONS)


@pytest.mark.parametrize(
    "knob, at_bound, above, message",
    [
        (
            "placement_tries",
            MAX_PLACEMENT_TRIES,
            1_000_000_000,
            f"'placement_tries' must be a whole number >= 1 and <= {MAX_PLACEMENT_TRIES}",
        ),
        ("events_per_mixture", ["const", MAX_EVENTS], ["choose", [1, MAX_EVENTS + 1]], f"<= {MAX_EVENTS}"),
        (
            "repetition",
            {"count": ["const", MAX_OCCURRENCES]},
            {"count": ["const", 10**6]},
            f"'repetition.count' values must be whole numbers >= 1 and <= {MAX_OCCURRENCES}",
        ),
        (
            "splitting",
            {"pieces": ["choose", [2, MAX_OCCURRENCES]]},
            {"pieces": ["choose", [2, 10**6]]},
            "'splitting.pieces' values",
        ),
        (
            "duration_s",
            ["const", MAX_DURATION_S],
            ["uniform", 10.0, 1e6],
            f"'duration_s' must produce positive durations of at most {MAX_DURATION_S:g} s",
        ),
    ],
)
def test_a_costly_knob_is_refused_above_its_bound(knob: str, at_bound: object, above: object, message: str) -> None:
    resolve_spec("finelap", {knob: at_bound}, sample_rate_hz=16000)
    with pytest.raises(ParamsError, match="mix.spec") as e:
        load_params(PARAMS, {"mix": {"spec": {knob: above}}}, skip_sections=SECTIONS)
    assert message in str(e.value) and "\n" not in str(e.value)
