"""``sedsynth bench real-library``: the default recipe on real recordings, beside the default's figures.

Nothing in the project can download sounds, so the recordings come from three Debian packages a
user fetches and unpacks (outside the repository)::

    apt-get download wesnoth-1.16-data sound-theme-freedesktop
    for f in *.deb; do dpkg -x "$f" /data/debian-sounds; done
    sedsynth bench real-library --sounds /data/debian-sounds --out /data/real-library-run

Input: ``--sounds``, the folder the packages were unpacked into (it holds ``usr/share/...``).
:func:`build_library` sorts their sound files into a Scaper-layout library,
``<out>/library/foreground/<label>/`` and ``<out>/library/background/<label>/``, by
:data:`FOREGROUND` and :data:`BACKGROUND`: each class is named for what makes the sound, and
every file whose name matches the class's pattern goes in whole. The classes were fixed from the
files' names before any model was trained on them, and a class with fewer than
:data:`MIN_FILES` files is not made (a label needs 5 files for 3 train, 1 valid and 1 test).
Files no class takes (interface beeps, one-off sounds) are listed in ``<out>/library/unused.csv``.

Then the default recipe runs on that library, every stage as its command runs it and with the
params' own settings except the paths: ``mix`` (``mix.events`` and ``mix.backgrounds`` set to
the library; the packages' GPL-2+ / CC-BY-SA is no licence the pipeline names, so the files are
``unknown``, which is allowed), ``captions``, ``clusters``,
``shards``, ``train`` and ``evaluate`` (zero-shot on the library's held-out test files), each
writing under ``<out>``. Output: the held-out table beside the default run's
(``benchmarks/results/default.json``) and the per-class PSDS, printed and returned as figures.
"""

from __future__ import annotations

import csv
import re
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

from pipeline.outputs import check_out_dir, staged_dir

# Where each package keeps its sounds, under the folder the .deb files were unpacked into.
WESNOTH = "usr/share/games/wesnoth/1.16/data/core/sounds"
WESNOTH_UI = "usr/share/games/wesnoth/1.16/sounds"
FREEDESKTOP = "usr/share/sounds/freedesktop/stereo"

# label -> (folder, file-name pattern): every file in the folder whose name (extension dropped)
# matches is one event clip of that label. Named for what makes the sound.
FOREGROUND: dict[str, tuple[str, str]] = {
    "arrow": (WESNOTH, r"(cross)?bow(-puny)?(-fire)?(-miss)?"),
    "whoosh": (WESNOTH, r"throw-\d|miss-\d|dagger-swish|(club|flail|hatchet|mace|spear|staff|throwing-knife)-miss"),
    "thump": (WESNOTH, r"club|mace|flail|staff|fist"),
    "blade": (WESNOTH, r"sword-\d|knife|hatchet|axe|throwing-knife|spear"),
    "gunshot": (WESNOTH, r"gunshot|(thunder|dragon)stick(-miss)?"),
    "fire": (WESNOTH, r"fire|flame-big(-miss)?|melee-fire|torch(-miss)?"),
    "horn": (WESNOTH + "/horn-signals", r"horn-\d"),
    "holy_magic": (WESNOTH, r"magic-holy(-miss)?-\d"),
    "magic_missile": (WESNOTH, r"magic-?missile(-\d)?(-miss)?"),
    "dark_magic": (WESNOTH, r"magic-dark(-big)?(-miss)?"),
    "squish": (WESNOTH, r"mud-(fist|glob)(-miss)?|squishy-(hit|miss|strike)"),
    "wolf": (WESNOTH, r"wolf-(die|growl|hit)-\d"),
    "gryphon": (WESNOTH, r"gryphon-(die|hit|shriek)-\d"),
    "horse": (WESNOTH, r"horse(-elf)?-canter|horse-(die|hit)(-\d)?"),
    "bat": (WESNOTH, r"bat-hit-\d|bat-flapping"),
    "hiss": (WESNOTH, r"hiss(-big|-die|-hit)?"),
    "zombie": (WESNOTH, r"zombie-(hit-\d|attack)"),
    "skeleton": (WESNOTH, r"skeleton(-big)?-(die|hit)(-\d)?"),
    "man_cry": (WESNOTH, r"human(-old)?-(die|hit)-\d"),
    "woman_cry": (WESNOTH, r"human-female-(die|hit)-\d"),
    "orc": (WESNOTH, r"orc(-small)?-(die|hit)-\d"),
    "troll": (WESNOTH, r"troll-(die|hit)-\d"),
    "ogre": (WESNOTH, r"ogre-(die|hit)-\d"),
    "dwarf": (WESNOTH, r"dwarf-(die|hit)-\d|dwarf-laugh"),
    "goblin": (WESNOTH, r"goblin-(die|hit)-\d"),
    "speech": (FREEDESKTOP, r"audio-channel-.+"),
    "click": (WESNOTH_UI, r"button|checkbox|select|select-unit|slider|expand|contract"),
    "chat_chime": (WESNOTH_UI, r"chat-.+"),
}
# background label -> (folder, pattern): Wesnoth's ambient loops (3.5 to 15 s; looped under a mixture)
BACKGROUND: dict[str, tuple[str, str]] = {
    "birds": (WESNOTH + "/ambient", r"birds\d"),
    "campfire": (WESNOTH + "/ambient", r"campfire"),
    "morning": (WESNOTH + "/ambient", r"morning"),
    "night": (WESNOTH + "/ambient", r"night"),
    "ship": (WESNOTH + "/ambient", r"ship"),
    "wardrums": (WESNOTH + "/ambient", r"wardrums"),
}
EXTENSIONS = (".ogg", ".oga", ".wav")
MIN_FILES = 5


class NoSoundsError(FileNotFoundError):
    """``--sounds`` holds none of the packages' sound folders; the message says how to unpack them."""


def _sound_files(folder: Path) -> list[Path]:
    """The regular sound files directly in ``folder`` (links are not followed), sorted by name."""
    if not folder.is_dir() or folder.is_symlink():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in EXTENSIONS and p.is_file() and not p.is_symlink())


def _assign(sounds: Path, table: dict[str, tuple[str, str]]) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for label, (folder, pattern) in table.items():
        rule = re.compile(pattern)
        out[label] = [p for p in _sound_files(sounds / folder) if rule.fullmatch(p.stem)]
    return out


def check_sounds(sounds: Path) -> set[str]:
    """The package folders the class tables read; :class:`NoSoundsError` when ``sounds`` holds none of them."""
    folders = {folder for folder, _ in (*FOREGROUND.values(), *BACKGROUND.values())}
    if not any(_sound_files(sounds / f) for f in folders):
        raise NoSoundsError(
            f"bench real-library: {sounds} holds none of {WESNOTH}, {FREEDESKTOP}; unpack the packages there first: "
            f"apt-get download wesnoth-1.16-data sound-theme-freedesktop && "
            f'for f in *.deb; do dpkg -x "$f" {sounds}; done'
        )
    return folders


def build_library(sounds: Path, library: Path) -> dict:
    """Sort the unpacked packages' sound files under ``sounds`` into a Scaper-layout ``library``
    (written whole or not at all). Returns ``{"foreground": {label: files}, "background": {...},
    "left_out": {label: files}}``, the classes under :data:`MIN_FILES` files being left out."""
    sounds = Path(sounds)
    folders = check_sounds(sounds)
    foreground = _assign(sounds, FOREGROUND)
    background = {k: v for k, v in _assign(sounds, BACKGROUND).items() if v}
    left_out = {k: v for k, v in foreground.items() if 0 < len(v) < MIN_FILES}
    foreground = {k: v for k, v in foreground.items() if len(v) >= MIN_FILES}
    taken = {p for files in (*foreground.values(), *background.values(), *left_out.values()) for p in files}
    unused = sorted({p for f in folders for p in _sound_files(sounds / f)} - taken)
    with staged_dir(Path(library)) as tmp:
        for side, classes in (("foreground", foreground), ("background", background)):
            for label, files in classes.items():
                (tmp / side / label).mkdir(parents=True)
                for p in files:
                    shutil.copyfile(p, tmp / side / label / p.name)
        with (tmp / "unused.csv").open("w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["path", "reason"])
            for label, files in left_out.items():
                w.writerows(
                    [p.relative_to(sounds).as_posix(), f"class {label}: {len(files)} files, fewer than {MIN_FILES}"]
                    for p in files
                )
            w.writerows([p.relative_to(sounds).as_posix(), "no class"] for p in unused)
    return {"foreground": foreground, "background": background, "left_out": left_out, "unused": unused}


def library_params(params, library: Path, out: Path):
    """``params`` with the library as the mix stage's sources and every stage's folder under ``out``
    (the recipe itself unchanged); the library's files count as licence ``unknown``, which is allowed."""
    m, t, e = params.mix, params.train, params.evaluate
    dataset = str(out / "dataset")
    allowed = tuple(dict.fromkeys((*m.allowed_licenses, "unknown")))
    return replace(
        params,
        mix=replace(
            m,
            events=str(library / "foreground"),
            backgrounds=str(library / "background"),
            allowed_licenses=allowed,
            out_dir=str(out / "mixtures"),
        ),
        captions=replace(params.captions, out_dir=str(out / "captions")),
        clusters=replace(params.clusters, out_dir=str(out / "clusters")),
        shards=replace(params.shards, out_dir=dataset),
        train=replace(
            t,
            data=replace(
                t.data,
                sources=tuple(_moved(s, dataset, out) for s in t.data.sources[:1]),
                valid=replace(t.data.valid, path=dataset),
            ),
            out_dir=str(out / "finelap"),
        ),
        evaluate=replace(
            e,
            checkpoint=str(out / "finelap" / "checkpoints" / "best.pt"),
            shards=dataset,
            event_clips=str(out / "mixtures" / "sources" / "events"),
            benchmarks={},
            out_dir=str(out / "finelap" / "evaluation"),
        ),
    )


def _moved(source, dataset: str, out: Path):
    """A training source read from the run's shards; a mixing source draws from the library as the mix stage analysed it."""
    if source.kind == "mixing":
        sources = out / "mixtures" / "sources"
        return replace(source, events=str(sources / "events"), backgrounds=str(sources / "backgrounds"))
    return replace(source, path=dataset)


def run(params, sounds: Path, out: Path) -> dict:
    """Build the library from ``sounds`` into ``out/library``, then mix, caption, cluster, shard, train
    and evaluate on it under ``out``. Returns ``{"library": {...}, "trained": {...}, "untrained": {...},
    "per_class": {label: {...}}, "minutes": {stage: minutes}}``."""
    from pipeline.stages import captions, clusters, mix, shards
    from trainer.stages import evaluate, train

    check_out_dir(out, "--out", {"--sounds": sounds})
    check_sounds(Path(sounds))
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    built = build_library(Path(sounds), out / "library")
    p = library_params(params, out / "library", out)
    minutes: dict[str, float] = {}
    for name, stage in (
        ("mix", mix),
        ("captions", captions),
        ("clusters", clusters),
        ("shards", shards),
        ("train", train),
        ("evaluate", evaluate),
    ):
        print(f"bench real-library: {name} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        summary = stage.run(p)
        minutes[name] = (time.perf_counter() - started) / 60
    figures = {
        "library": {
            "classes": len(built["foreground"]),
            "event_files": sum(len(v) for v in built["foreground"].values()),
            "background_files": sum(len(v) for v in built["background"].values()),
        },
        "minutes": minutes,
    }
    for model in ("trained", "untrained"):
        scores = dict(summary["test"].get(model, {}))
        frame = ((summary.get("probes") or {}).get(model) or {}).get("frame", {})
        scores["probe_frame_auroc"] = frame.get("frame_auroc_macro", float("nan"))
        scores["probe_segment_f1"] = frame.get("segment_f1", float("nan"))
        figures[model] = scores
    with (Path(p.evaluate.out_dir) / "details" / p.evaluate.split / "per_class_trained.csv").open() as f:
        figures["per_class"] = {
            r["class"]: {
                "events": int(r["events"]),
                "psds1": float(r["psds1"]),
                "psds2": float(r["psds2"]),
                "auroc": float(r["auroc"]),
            }
            for r in csv.DictReader(f)
        }
    return figures


def print_figures(figures: dict, default: dict | None) -> None:
    """The held-out table beside the default run's (``default``: ``benchmarks/results/default.json``), then per-class PSDS."""
    lib = figures["library"]
    print(
        f"bench real-library: {lib['classes']} classes, {lib['event_files']} event files, {lib['background_files']} background "
        f"files; minutes: " + ", ".join(f"{k} {v:.1f}" for k, v in figures["minutes"].items())
    )
    rows = default["rows"] if default else [[k, k] for k in ("psds1", "psds1_astat0", "psds2", "auroc", "f1", "segment_f1")]
    print(f"  {'held-out figure':58s} {'real, untrained':>15s} {'real, trained':>13s} {'default run':>11s}")
    for label, key in rows:
        theirs = default["figures"]["trained"].get(key, float("nan")) if default else float("nan")
        print(
            f"  {label:58s} {figures['untrained'].get(key, float('nan')):15.3f} {figures['trained'].get(key, float('nan')):13.3f} {theirs:11.3f}"
        )
    print(f"  {'class':16s} {'events':>6s} {'PSDS1':>6s} {'PSDS2':>6s} {'AUROC':>6s}")
    for label, c in sorted(figures["per_class"].items(), key=lambda kv: -kv[1]["psds2"]):
        print(f"  {label:16s} {c['events']:6d} {c['psds1']:6.3f} {c['psds2']:6.3f} {c['auroc']:6.3f}")
