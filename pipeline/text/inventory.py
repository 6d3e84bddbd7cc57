"""The phrase-cluster inventory and the default label phrases, built from the shipped reference data.

Input: ``pipeline/data/audioset_strong_classes.csv`` (the 456 AudioSet-Strong classes),
``pipeline/data/audioset_ontology.json`` (hierarchy, names, descriptions; its
musical-instrument subtree adds the instruments AudioSet-Strong folds into "Music") and the
FSD50K vocabulary (the 200 labels below, or a ``vocabulary.csv`` given on the command line).
Output, both written into ``pipeline/data`` and shipped with the project:

- ``clusters.json``: one cluster per class (about 540): id, MID, name, alternative phrases,
  where it comes from, and its nearest inventory parents in the AudioSet hierarchy;
- ``label_phrases.json``: MID -> natural phrases (:mod:`pipeline.text.phrases`) for every
  ontology class and every AudioSet-Strong class.

Regenerate with ``python -m pipeline.text.inventory``; a test checks the shipped files are
exactly what this module builds. FineLAP's inventory (494 clusters) was built the same way
from the same sources and then edited by an LLM; this one keeps the sources' own names.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from pipeline.ontology import DATA_DIR, Ontology, default_ontology
from pipeline.outputs import write_atomic
from pipeline.text.phrases import label_phrases, name_phrases

STRONG_CLASSES_PATH = DATA_DIR / "audioset_strong_classes.csv"
CLUSTERS_PATH = DATA_DIR / "clusters.json"
LABEL_PHRASES_PATH = DATA_DIR / "label_phrases.json"
MUSICAL_INSTRUMENT_MID = "/m/04szw"
FORMAT_VERSION = 1
ATTRIBUTION = (
    "Derived from the AudioSet ontology (Gemmeke et al., ICASSP 2017; CC BY-SA 4.0), the AudioSet-Strong "
    "class list (Hershey et al., ICASSP 2021; CC BY 4.0) and the FSD50K vocabulary (Fonseca et al., "
    "IEEE/ACM TASLP 2022; CC BY 4.0). Licensed CC BY-SA 4.0."
)

# The FSD50K vocabulary (FSD50K.ground_truth/vocabulary.csv), as label names.
FSD50K_LABELS = """
Accelerating_and_revving_and_vroom Accordion Acoustic_guitar Aircraft Alarm Animal Applause Bark Bass_drum
Bass_guitar Bathtub_(filling_or_washing) Bell Bicycle Bicycle_bell Bird Bird_vocalization_and_bird_call_and_bird_song
Boat_and_Water_vehicle Boiling Boom Bowed_string_instrument Brass_instrument Breathing Burping_and_eructation Bus
Buzz Camera Car Car_passing_by Cat Chatter Cheering Chewing_and_mastication Chicken_and_rooster
Child_speech_and_kid_speaking Chime Chink_and_clink Chirp_and_tweet Chuckle_and_chortle Church_bell Clapping Clock
Coin_(dropping) Computer_keyboard Conversation Cough Cowbell Crack Crackle Crash_cymbal Cricket Crow Crowd
Crumpling_and_crinkling Crushing Crying_and_sobbing Cupboard_open_or_close Cutlery_and_silverware Cymbal
Dishes_and_pots_and_pans Dog Domestic_animals_and_pets Domestic_sounds_and_home_sounds Door Doorbell
Drawer_open_or_close Drill Drip Drum Drum_kit Electric_guitar Engine Engine_starting Explosion Fart Female_singing
Female_speech_and_woman_speaking Fill_(with_liquid) Finger_snapping Fire Fireworks
Fixed-wing_aircraft_and_airplane Fowl Frog Frying_(food) Gasp Giggle Glass Glockenspiel Gong Growling Guitar
Gull_and_seagull Gunshot_and_gunfire Gurgling Hammer Hands Harmonica Harp Hi-hat Hiss Human_group_actions
Human_voice Idling Insect Keyboard_(musical) Keys_jangling Knock Laughter Liquid
Livestock_and_farm_animals_and_working_animals Male_singing Male_speech_and_man_speaking Mallet_percussion
Marimba_and_xylophone Mechanical_fan Mechanisms Meow Microwave_oven Motor_vehicle_(road) Motorcycle Music
Musical_instrument Ocean Organ Packing_tape_and_duct_tape Percussion Piano Plucked_string_instrument Pour
Power_tool Printer Purr Race_car_and_auto_racing Rail_transport Rain Raindrop Ratchet_and_pawl Rattle
Rattle_(instrument) Respiratory_sounds Ringtone Run Sawing Scissors Scratching_(performance_technique) Screaming
Screech Shatter Shout Sigh Singing Sink_(filling_or_washing) Siren Skateboard Slam Sliding_door Snare_drum Sneeze
Speech Speech_synthesizer Splash_and_splatter Squeak Stream Strum Subway_and_metro_and_underground Tabla
Tambourine Tap Tearing Telephone Thump_and_thud Thunder Thunderstorm Tick Tick-tock Toilet_flush Tools
Traffic_noise_and_roadway_noise Train Trickle_and_dribble Truck Trumpet Typewriter Typing Vehicle
Vehicle_horn_and_car_horn_and_honking Walk_and_footsteps Water Water_tap_and_faucet Waves_and_surf Whispering
Whoosh_and_swoosh_and_swish Wild_animals Wind Wind_chime Wind_instrument_and_woodwind_instrument Wood Writing
Yell Zipper_(clothing)
""".split()


def read_strong_classes(path: Path = STRONG_CLASSES_PATH) -> list[tuple[str, str]]:
    """(MID, display name) of the AudioSet-Strong classes, in file order."""
    with open(path, newline="", encoding="utf-8") as f:
        return [(row[0], row[1]) for row in csv.reader(f) if row]


def read_vocabulary_csv(path: Path) -> list[tuple[str, str]]:
    """(label, MID) rows of an FSD50K ``vocabulary.csv`` (``index,label,mid``, no header)."""
    with open(path, newline="", encoding="utf-8") as f:
        return [(row[1], row[2]) for row in csv.reader(f) if len(row) >= 3]


def fsd50k_vocabulary(onto: Ontology) -> list[tuple[str, str]]:
    """(label, MID) of :data:`FSD50K_LABELS`, resolved through the ontology."""
    missing = [label for label in FSD50K_LABELS if label not in onto.by_fsd50k_name]
    if missing:
        raise ValueError(f"FSD50K labels missing from the ontology: {missing}")
    return [(label, onto.by_fsd50k_name[label].mid) for label in FSD50K_LABELS]


def _subtree(onto: Ontology, root: str) -> list[str]:
    out, stack = [], [root]
    while stack:
        mid = stack.pop()
        if mid not in out:
            out.append(mid)
            stack.extend(reversed(onto.by_mid[mid].child_mids))
    return out


def build_clusters(onto: Ontology, strong: list[tuple[str, str]], vocabulary: list[tuple[str, str]]) -> list[dict]:
    """The inventory: AudioSet-Strong classes, then instruments, then the remaining FSD50K labels.

    Each cluster: ``id``, ``mid``, ``name``, ``alternatives`` (phrases), ``sources`` and
    ``parent_ids`` (nearest inventory ancestors, skipping classes outside the inventory).
    """
    names: dict[str, str] = {}
    sources: dict[str, list[str]] = {}
    for source, items in (
        ("audioset-strong", strong),
        ("musical-instrument", [(m, onto.by_mid[m].name) for m in sorted(_subtree(onto, MUSICAL_INSTRUMENT_MID))]),
        ("fsd50k", [(mid, onto.by_mid[mid].name) for _, mid in sorted(vocabulary, key=lambda v: v[1])]),
    ):
        for mid, name in items:
            names.setdefault(mid, name)
            sources.setdefault(mid, []).append(source)
    ids = {mid: i for i, mid in enumerate(names)}

    def inventory_parents(mid: str) -> list[int]:
        found, frontier, seen = set(), list(onto.parent_mids.get(mid, ())), set()
        while frontier:
            nxt = []
            for p in frontier:
                if p in seen:
                    continue
                seen.add(p)
                if p in ids:
                    found.add(ids[p])
                else:
                    nxt.extend(onto.parent_mids.get(p, ()))
            frontier = nxt
        return sorted(found)

    return [
        {
            "id": ids[mid],
            "mid": mid,
            "name": name,
            "alternatives": label_phrases(onto, mid) if mid in onto.by_mid else name_phrases(name),
            "sources": sources[mid],
            "parent_ids": inventory_parents(mid),
        }
        for mid, name in names.items()
    ]


def build_label_phrases(onto: Ontology, strong: list[tuple[str, str]]) -> dict[str, list[str]]:
    """MID -> derived phrases for every ontology class and every AudioSet-Strong class."""
    out = {mid: label_phrases(onto, mid) for mid in onto.by_mid}
    for mid, name in strong:
        out.setdefault(mid, name_phrases(name))
    return dict(sorted(out.items()))


def build(vocabulary_csv: Path | None = None) -> tuple[dict, dict]:
    """The two data files' contents (see the module docstring)."""
    onto = default_ontology()
    strong = read_strong_classes()
    vocabulary = read_vocabulary_csv(vocabulary_csv) if vocabulary_csv else fsd50k_vocabulary(onto)
    clusters = {"version": FORMAT_VERSION, "attribution": ATTRIBUTION, "clusters": build_clusters(onto, strong, vocabulary)}
    phrases = {"version": FORMAT_VERSION, "attribution": ATTRIBUTION, "phrases": build_label_phrases(onto, strong)}
    return clusters, phrases


def dump(data: dict) -> bytes:
    return (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fsd50k-vocabulary", type=Path, help="an FSD50K vocabulary.csv to use instead of the built-in list")
    parser.add_argument("--out-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    clusters, phrases = build(args.fsd50k_vocabulary)
    write_atomic(args.out_dir / CLUSTERS_PATH.name, dump(clusters))
    write_atomic(args.out_dir / LABEL_PHRASES_PATH.name, dump(phrases))
    n_alt = sum(len(c["alternatives"]) for c in clusters["clusters"])
    print(f"{len(clusters['clusters'])} clusters, {n_alt} alternative phrases; {len(phrases['phrases'])} labels with phrases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
