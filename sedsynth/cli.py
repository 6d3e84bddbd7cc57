"""The ``sedsynth`` command: one subcommand per stage, plus benchmarks.

Every stage reads ``params.yaml`` (``--params``) with ``--set key.sub=value`` overrides, and
calls the stage's ``run`` function; DVC calls exactly these commands.

    sedsynth corpus                      # generate the embedded source corpora
    sedsynth clip                        # FSD50K-layout corpus -> event clips
    sedsynth ambience                    # ambience library -> background segments
    sedsynth mix                         # clips + backgrounds -> soundscapes, recipes, labels
    sedsynth mix --set mix.preset=flam --set mix.mixtures.train=100000
    sedsynth captions                    # mixtures -> label phrases and captions (offline by default)
    sedsynth clusters                    # phrases -> clusters of the AudioSet-derived inventory
    sedsynth shards                      # -> Hugging Face Parquet shards, index and dataset card
    sedsynth import audioset-strong /data/audioset_strong --option audio_dir=audio/eval   # a real corpus -> shards
    sedsynth validate data/dataset       # check a shard folder against the schema and index
    sedsynth publish data/dataset --repo-id you/name --dry-run
    sedsynth clip --set sources.fsd50k_dir=/data/FSD50K --set compute.workers=8
    sedsynth bench clip                  # clipping throughput vs plain decoding
    sedsynth bench mix                   # mixtures/s and memory vs Scaper on the same sources
    sedsynth pretrain                    # the audio encoder as a masked autoencoder on audio alone (Cacophony stage 1)
    sedsynth train                       # FineLAP on the shards (torchrun --nproc_per_node=8 -m sedsynth train)
    sedsynth bench train                 # loader clips/s per worker and training steps/s
    sedsynth bench mixing --rows 200     # items/s of mixing while training against reading stored shards and Scaper
    sedsynth evaluate                    # PSDS1/2, AUROC, F1, retrieval, zero-shot on the test split
    sedsynth detect a.wav --query "dog barking" --query "car horn"
    sedsynth describe a.wav b.flac       # a caption per file (a checkpoint trained with train.loss.caption_weight > 0)
    sedsynth bench evaluate              # metric time split on a 10,000-clip score set
    sedsynth bench detection             # PSDS1 against training minutes on the params' shards
    sedsynth bench import                # importing 10,000 AudioSet-Strong-style clips vs datasets.to_parquet
    sedsynth bench llm-cache             # storing one LLM completion at 5,000 and 100,000 entries vs rewriting the file
    sedsynth bench scale --sizes 1000,10000   # every data stage at growing sizes: time, CPU, peak RSS, bytes, growth
    sedsynth view debug/dataset          # browse a dataset, query the detector, walk the evaluation's errors (a local web page)
    sedsynth ablate no_frame_loss        # one FineLAP Table 5 variant, trained and evaluated in models/ablations/
    sedsynth ablate --queue              # all five as DVC experiments (then dvc queue start; sedsynth ablate --table)
    sedsynth pipeline --overrides configs/debug.yaml   # the ten DVC stages in their order, on tiny data under debug/
"""

from __future__ import annotations

import argparse
import errno
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.config.params import ParamsError, load_params, merge, parse_override, read_yaml_mapping
from sedsynth import OUTPUT_SETTINGS, PIPELINE

TRAINER_SECTIONS = ("pretrain", "train", "evaluate", "ablations")  # trainer.config.SECTIONS, which the data stages leave alone


class CommandError(Exception):
    """A failure the command reports in one line (an LLM endpoint that keeps failing)."""


DISK_FULL = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
NOT_ALLOWED = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted"}


def _overrides(args: argparse.Namespace) -> dict:
    overrides: dict = {}
    for path in args.overrides or []:
        overrides = merge(overrides, read_yaml_mapping(path, "overrides file"))
    for text in args.set or []:
        overrides = merge(overrides, parse_override(text))
    return overrides


def _params(args: argparse.Namespace):
    """The data stages' params (the trainer's sections are read by the trainer's commands)."""
    return load_params(args.params, _overrides(args), skip_sections=TRAINER_SECTIONS)


def _trainer_params(args: argparse.Namespace):
    """Every section of the params file, the trainer's included."""
    from trainer.config import load_params as load_trainer_params

    return load_trainer_params(args.params, _overrides(args))


def _attribute(path: str):
    """``"pipeline.stages.clip:run"`` -> that function, its module imported now (a command's heavy imports wait
    until it runs)."""
    import importlib

    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


# How a command calls its target: call(target, args, params), where ``target()`` imports and returns the
# command's function and ``params()`` loads its params; either is only done when the call needs it.


def _run_stage(target, args: argparse.Namespace, params) -> int | None:
    """A DVC stage: ``run(params)``."""
    target()(params())
    return 0


def _run_main(target, args: argparse.Namespace, params) -> int:
    """A command with flags of its own: ``main(args, params)``, which returns the exit status."""
    return target()(args, params())


def _run_train(target, args: argparse.Namespace, params) -> int:
    summary = target()(params())
    if summary:
        final, untrained = summary.get("final", {}), summary.get("untrained", {})
        print(
            f"train: {summary['steps']} steps, {summary['train_clips_per_s']:.1f} clips/s; held-out frame AUROC "
            f"{untrained.get('frame_auroc', float('nan')):.3f} untrained -> {final.get('frame_auroc', float('nan')):.3f}, "
            f"audio->caption R@1 {untrained.get('a2t_r1', float('nan')):.3f} -> {final.get('a2t_r1', float('nan')):.3f}"
        )
    return 0


def _import_options(pairs: list[str] | None) -> dict:
    """``["k=v", ...]`` -> ``{k: v}`` with each value read as YAML (numbers, lists, null)."""
    import yaml

    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ParamsError(f"import: --option {pair!r} is not KEY=VALUE, e.g. --option audio_dir=audio/eval")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def _run_import(target, args: argparse.Namespace, params) -> int:
    target()(params(), args.kind, args.root, args.out, _import_options(args.option))
    return 0


def _run_validate(target, args: argparse.Namespace, params) -> int:
    folder = args.folder or params().shards.out_dir
    summary = target()(folder, decode=args.decode)
    print(f"{folder}: valid, {summary['rows']} rows in {summary['files']} shards ({', '.join(summary['splits'])})")
    return 0


def _run_publish(target, args: argparse.Namespace, params) -> int:
    folder = args.folder or params().shards.out_dir
    target()(
        folder,
        args.repo_id,
        token_env=args.token_env,
        private=args.private,
        dry_run=args.dry_run,
        batch_files=args.batch_files,
        request_timeout_s=args.request_timeout_s,
        deadline_s=args.deadline_s,
    )
    return 0


def _run_view(target, args: argparse.Namespace, params) -> int:
    from pathlib import Path

    # with PATH, no params file is needed: every default stands in for it
    return target()(args, params() if Path(args.params).exists() or not args.path else None)


def _run_bench(target, args: argparse.Namespace, params) -> int:
    """``sedsynth bench BENCHMARK``: benchmarks.run's, or the view's own (benchmarks never import sedsynth)."""
    if args.what == "view":
        from sedsynth.view.bench import main as view_bench

        return view_bench(args, params())
    return target()(args, params())


def _pipeline(args: argparse.Namespace, params) -> int:
    """Every stage of :data:`PIPELINE` as its own command runs it, with these params, each followed by its wall
    time; the first stage to fail stops the run with that stage's one-line error (``sedsynth clip: error: ...``).
    Every stage's params (the data stages' and the trainer's) are checked before the first stage runs: a bad
    one stops the run at once (``sedsynth pipeline: error: params: ...``), not after the stages before the
    one that reads it, and so are the training stages' output folders. Without DVC: nothing is cached, locked or skipped because it is up to date."""
    import time
    from importlib import import_module
    from pathlib import Path

    from pipeline.outputs import check_out_dir

    # the data stages check their folders when params load; the training stages' folders are checked here, up front
    # (first each folder alone, so `/` is named as itself rather than as holding another stage's folder)
    stages = {name: import_module(f"trainer.stages.{name}") for name in ("pretrain", "train", "evaluate")}
    for kept in (lambda stage: None, lambda stage: stage.kept_folders(params)):
        for name, stage in stages.items():
            check_out_dir(Path(getattr(params, name).out_dir), f"{name}.out_dir", kept(stage))
    started = time.perf_counter()  # ``params``: every section loaded, the data stages' included, so every check ran
    for name in PIPELINE:
        args.command = name  # main() reports a failure as this stage's command would, with its output setting
        stage_started = time.perf_counter()
        status = COMMANDS[name](args)
        if status:
            return status
        print(f"pipeline: {name} done in {time.perf_counter() - stage_started:.1f} s", flush=True)
    args.command = "pipeline"
    print(f"pipeline: {len(PIPELINE)} stages in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


def _checkpoint_params(args: argparse.Namespace):
    """The trainer's params for ``detect`` and ``describe``: from ``--params`` where that file exists, else
    (with ``--checkpoint``, which carries the model's config) every default, ``--set`` still on top."""
    import tempfile
    from pathlib import Path

    if Path(args.params).exists():
        return _trainer_params(args)
    if not args.checkpoint:
        raise ParamsError(
            f"params: {args.params} not found, so there is no evaluate.checkpoint to use; "
            "pass --checkpoint PATH (a trainer checkpoint carries its model's config) or --params PATH"
        )
    with tempfile.TemporaryDirectory() as tmp:  # a params file with no settings: evaluate.* keep their defaults
        empty = Path(tmp) / "params.yaml"
        empty.write_text("{}\n", encoding="utf-8")
        return _trainer_params(argparse.Namespace(**{**vars(args), "params": str(empty)}))


# --------------------------------------------------------------------------- each command's own options


def _common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    p.add_argument(
        "--overrides",
        action="append",
        metavar="FILE",
        help="a YAML of params merged over --params, e.g. configs/train/finelap.yaml",
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a parameter, e.g. clip.max_duration_s=5")


def _import_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", help="corpus kind: audioset-strong, tacos, desed, dcase-tsv or urban-sed")
    p.add_argument("root", help="the corpus folder, in its published layout")
    p.add_argument("--out", default=None, help="output folder (default: imports.out_dir, data/imports/<kind>)")
    p.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="a reader option over imports.options.<kind>, e.g. --option audio_dir=audio/eval (repeatable)",
    )


def _validate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", nargs="?", help="the dataset folder (default: shards.out_dir)")
    p.add_argument("--decode", action="store_true", help="also decode every audio cell")


def _publish_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", nargs="?", help="the dataset folder (default: shards.out_dir)")
    p.add_argument("--repo-id", required=True, help="the hub dataset repo, e.g. you/sed-mixtures")
    p.add_argument("--token-env", default="HF_TOKEN", help="environment variable holding a write token (default HF_TOKEN)")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--dry-run", action="store_true", help="list what would be uploaded; upload nothing")
    p.add_argument("--batch-files", type=_at_least_one, default=50, help="shards per commit (default 50)")
    p.add_argument(
        "--request-timeout-s",
        type=float,
        default=300.0,
        help="the longest one hub request may take, sending to the last byte of the answer, plus 1 s per 256 kB "
        "it uploads; not retried past it (default 300)",
    )
    p.add_argument(
        "--deadline-s",
        type=float,
        default=21600.0,
        help="the longest the run may spend on the hub; a Retry-After past it stops the run at once (default 21600, 6 h)",
    )


def _detect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "audio",
        nargs="*",
        help="audio files (any length, sample rate and channel count), folders (their audio "
        "files, sorted) or glob patterns such as 'clips/*.wav' (quoted: detect expands them)",
    )
    p.add_argument("--files-from", default=None, metavar="LIST", help="also the paths in LIST, one per line (- for stdin)")
    p.add_argument("--recursive", action="store_true", help="look for audio in the folders' subfolders too")
    p.add_argument("--query", action="append", required=True, help='a text query, e.g. --query "dog barking" (repeatable)')
    p.add_argument(
        "--checkpoint", default=None, help="trainer checkpoint (default: evaluate.checkpoint; with it no params.yaml is needed)"
    )
    p.add_argument(
        "--threshold",
        type=_probability,
        default=None,
        help="frame probability that starts an event (default: the threshold stored in the checkpoint, else 0.5)",
    )
    p.add_argument(
        "--median-filter",
        type=int,
        default=None,
        metavar="N",
        help="median filter of N frames (odd, 1: none) before the threshold (default: the one stored with the "
        "checkpoint's threshold, with --threshold too)",
    )
    p.add_argument(
        "--format",
        choices=["table", "tsv"],
        default="table",
        help="table (default) or tsv: DCASE detections, filename onset offset event_label (sed_scores_eval reads it)",
    )
    p.add_argument(
        "--scores",
        default=None,
        metavar="DIR",
        help="also write sed_scores_eval score files DIR/<name>.tsv (onset, offset, one column per query) for PSDS / F1",
    )
    p.add_argument("--pictures", default=None, metavar="DIR", help="also draw each file's scores into DIR/<name>.png")
    p.add_argument("--device", type=_device, default=None, help="cpu, cuda, cuda:1 (default: evaluate.device)")


def _describe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("audio", nargs="+", help="audio files (any length, sample rate and channel count)")
    p.add_argument(
        "--checkpoint", default=None, help="trainer checkpoint (default: evaluate.checkpoint; with it no params.yaml is needed)"
    )
    p.add_argument(
        "--decoding",
        choices=["greedy", "parallel"],
        default=None,
        help="greedy (autoregressive) or parallel (one all-[MASK] pass); default: parallel for a decoder trained "
        "with decoding: parallel, else greedy",
    )
    p.add_argument("--device", type=_device, default=None, help="cpu, cuda, cuda:1 (default: evaluate.device)")


def _view_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        nargs="?",
        default=None,
        help="a shard folder, a mixtures folder (the mix stage's output) or an evaluation folder "
        "(default: shards.out_dir and evaluate.out_dir of the params)",
    )
    p.add_argument(
        "--data", default=None, help="the shard or mixtures folder to show with an evaluation folder (default: evaluate.shards)"
    )
    p.add_argument("--evaluation", default=None, help="an evaluation folder to show with PATH's dataset")
    p.add_argument(
        "--checkpoint", default=None, help="trainer checkpoint for queries (default: evaluate.checkpoint; none: queries off)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: a free one)")
    p.add_argument("--max-upload-mb", type=float, default=50.0, help="largest audio file the page accepts, in MiB (default 50)")
    p.add_argument("--device", type=_device, default=None, help="cpu, cuda, cuda:1 for queries (default: evaluate.device)")


def _ablate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "variant",
        nargs="*",
        help="full, no_frame_loss, no_clip_loss, shared_projector or infonce (FineLAP Table 5); "
        "extra rows: caption_loss (Cacophony's captioning loss), sam (SAM, rho 0.075), "
        "mae_init (the pretrain stage's encoder), captioning_only (CaptionStew's "
        "captioning-only encoder)",
    )
    p.add_argument(
        "--queue",
        action="store_true",
        help="queue the variants (default: Table 5's five) as DVC experiments of the pipeline, for `dvc queue start`",
    )
    p.add_argument(
        "--table",
        action="store_true",
        help="write <ablations.out_dir>/table.md (mean and range over ablations.seeds) from the variants' "
        "DVC experiments (else their folders): every variant, or full and the ones named",
    )
    p.add_argument(
        "--seed",
        type=int,
        action="append",
        metavar="S",
        help="run or queue only this seed (repeatable; default: every seed of ablations.seeds, in turn)",
    )
    p.add_argument(
        "--score-only",
        action="store_true",
        help="evaluate the named variants' existing checkpoints again without training (after an evaluation change)",
    )


def _repeat(p: argparse.ArgumentParser, what: str = "timed passes; the best is reported") -> None:
    p.add_argument("--repeat", type=int, default=3, help=f"{what} (default 3)")


def _scaper_python(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scaper-python",
        default=None,
        help="python of an environment with scaper 1.6.5 (default .venv-scaper/bin/python if present; else no Scaper peer)",
    )


def _bench_clip_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", default=None, help="FSD50K-layout folder to measure on (default: a generated one)")
    p.add_argument("--clips", type=int, default=400, help="clips in the generated corpus (default 400)")
    _repeat(p)


def _bench_mix_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mixtures", type=int, default=2000, help="mixtures per timed run (default 2000)")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts to time (default 1,2)")
    _scaper_python(p)
    p.add_argument("--scaper-mixtures", type=int, default=200, help="soundscapes Scaper makes (default 200)")
    p.add_argument(
        "--profile", action="store_true", help="one more 1-worker pass, printing where its time goes by part of the stage"
    )
    _repeat(p)


def _bench_import_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clips", type=int, default=10000, help="clips in the generated corpus (default 10000)")


def _bench_mixing_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=200, help="rows the loader makes, and soundscapes Scaper makes (default 200)")
    _scaper_python(p)
    _repeat(p, "rounds of a warm mixing pass then a Scaper pass, interleaved; the best of each is reported")


def _bench_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rows",
        type=int,
        default=None,
        help="rows the loader makes (default: batches x batch, so every clip of the timed batches is its own row)",
    )
    p.add_argument(
        "--batches",
        type=int,
        default=2,
        help="batches of different rows the step takes in turn, as the loop's differ (default 2)",
    )
    p.add_argument("--steps", type=int, default=5, help="timed training steps (default 5)")
    p.add_argument(
        "--preset",
        choices=["default", "gpu"],
        default="default",
        help="default (params.yaml) or gpu (eat-base, RoBERTa-size text, d 1024, batch 128, bf16, text_pad_rows 64)",
    )
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak for MFU (default: by GPU name)")
    p.add_argument("--batch", type=int, default=None, help="clips per step (default: the params', or 128 with --preset gpu)")
    p.add_argument(
        "--profile", action="store_true", help="on CUDA, where the step's GPU time goes (torch.profiler, by kind of kernel)"
    )


def _bench_evaluate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clips", type=int, default=10000, help="test clips (default 10000)")


def _bench_detection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epochs", type=int, default=15, help="training epochs, one checkpoint scored per epoch (default 15)")
    p.add_argument("--out", default="models/bench_detection", help="folder for the run, its scores and psds_curve.{csv,png}")
    p.add_argument(
        "--score-only",
        action="store_true",
        help="score the epoch checkpoints of an earlier run in --out again, without training (after an evaluation change)",
    )


def _bench_real_library_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sounds",
        help="the folder wesnoth-1.16-data and sound-theme-freedesktop were unpacked into (dpkg -x), holding usr/share/... (required)",
    )
    p.add_argument("--out", default="models/bench_real_library", help="folder for the library, its dataset, model and evaluation")


def _bench_llm_cache_args(p: argparse.ArgumentParser) -> None:
    _repeat(p, "timed rewrites of the whole file, the peer; their mean is reported")


def _bench_scale_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sizes",
        default="1000,10000",
        help="comma-separated FSD50K-layout clip counts, full = 51197 (mixtures scale to 100,000 at full; default 1000,10000)",
    )
    p.add_argument(
        "--out", default="bench-out/scale", help="folder for each size's run, scale.csv and scale.png (default bench-out/scale)"
    )
    p.add_argument("--train", action="store_true", help="also train one epoch streaming the shards, then evaluate")
    p.add_argument(
        "--stages",
        default=None,
        help="comma-separated stages to run, in the pipeline's order (default: "
        "corpus to shards, with --train also train and evaluate)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep each size's data but the corpus and the mixtures, which go once no later stage reads them "
        "(default: all removed once measured; the logs stay)",
    )
    p.add_argument(
        "--reuse",
        action="store_true",
        help="run --stages on the data a --keep run left in --out, e.g. "
        "--stages train,evaluate --reuse --keep (default: each size starts from an empty folder)",
    )


def _bench_view_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=100000, help="rows of the dataset the view serves (default 100000)")
    _repeat(p)


# --------------------------------------------------------------------------- the commands


@dataclass(frozen=True)
class Command:
    """One ``sedsynth`` subcommand: its parser is built from this row and parsing sets it as ``args.fn``."""

    name: str
    target: str  # "module:function" the command calls, imported only when the command runs
    help: str
    params: Callable[[argparse.Namespace], Any] = _params  # the data stages' params, or _trainer_params: every section
    call: Callable[..., int | None] = _run_stage  # how the target is called: call(target, args, params)
    options: Callable[[argparse.ArgumentParser], None] | None = None  # adds the command's own options
    errors: tuple[str, ...] = ()  # "module:Exception"s the command reports in one line

    def __call__(self, args: argparse.Namespace) -> int:
        errors = tuple(_attribute(e) for e in self.errors)
        try:
            return self.call(lambda: _attribute(self.target), args, lambda: self.params(args)) or 0
        except errors as e:
            raise CommandError(str(e)) from None


_VIEW_HELP = "browse a dataset, hear its mixtures with their labels, query the detector and walk the evaluation's errors in a local web page"
_ABLATE_HELP = "train and evaluate one of FineLAP's Table 5 variants (or an extra row), or write the table"
_IMPORT_HELP = "import a real strong-label corpus (AudioSet-Strong, TACOS, DESED, DCASE TSV, URBAN-SED) as shards"

COMMANDS = {
    c.name: c
    for c in (
        Command("corpus", "pipeline.stages.corpus:run", "generate the embedded FSD50K-layout corpus and ambience library"),
        Command("clip", "pipeline.stages.clip:run", "cut single-event clips from an FSD50K-layout corpus"),
        Command("ambience", "pipeline.stages.ambience:run", "cut background segments from an ambience library"),
        Command("mix", "pipeline.stages.mix:run", "mix event clips over backgrounds into soundscapes with relabeled boundaries"),
        Command(
            "captions",
            "pipeline.stages.captions:run",
            "write label phrases and captions for the mixtures",
            errors=("pipeline.text.llm:LLMError",),
        ),
        Command("clusters", "pipeline.stages.clusters:run", "assign every phrase to a cluster of the AudioSet-derived inventory"),
        Command("shards", "pipeline.stages.shards:run", "write Hugging Face Parquet shards, their index and the dataset card"),
        Command("import", "pipeline.stages.imports:run", _IMPORT_HELP, call=_run_import, options=_import_args),
        Command(
            "validate",
            "pipeline.shards.validate:validate",
            "check a shard folder against the shard schema and its index",
            call=_run_validate,
            options=_validate_args,
        ),
        Command(
            "publish",
            "pipeline.shards.publish:publish",
            "upload a shard folder to the Hugging Face hub (resumable)",
            call=_run_publish,
            options=_publish_args,
        ),
        Command(
            "pretrain",
            "trainer.stages.pretrain:run",
            "pretrain the audio encoder as a masked autoencoder on audio alone (Cacophony stage 1)",
            _trainer_params,
        ),
        Command(
            "train",
            "trainer.stages.train:run",
            "train FineLAP on the shards (torchrun -m sedsynth train for several GPUs)",
            _trainer_params,
            _run_train,
        ),
        Command(
            "evaluate",
            "trainer.stages.evaluate:run",
            "PSDS, AUROC, F1, alignment, retrieval and zero-shot accuracy of a checkpoint (and untrained)",
            _trainer_params,
        ),
        Command(
            "pipeline",
            "sedsynth.cli:_pipeline",
            "run every stage of dvc.yaml in its order without DVC, e.g. on tiny data: --overrides configs/debug.yaml",
            _trainer_params,
            _run_main,
        ),
        Command(
            "detect",
            "trainer.evaluation.detect_files:main",
            "print when each text query sounds in audio files (onset, offset, score)",
            _checkpoint_params,
            _run_main,
            _detect_args,
        ),
        Command(
            "describe",
            "trainer.stages.describe:main",
            "print a caption per audio file from a checkpoint trained with the captioning loss",
            _checkpoint_params,
            _run_main,
            _describe_args,
        ),
        Command("view", "sedsynth.view.command:main", _VIEW_HELP, _trainer_params, _run_view, _view_args),
        Command("ablate", "sedsynth.ablate:main", _ABLATE_HELP, _trainer_params, _run_main, _ablate_args),
    )
}

# ``sedsynth bench BENCHMARK``: each benchmark's help and its own options
BENCH = Command(
    "bench",
    "benchmarks.run:main",
    "measure stage throughput against a peer measured in the same run",
    _trainer_params,
    _run_bench,
)
BENCHMARKS = {
    "clip": ("clipping throughput against plain decoding, one core", _bench_clip_args),
    "mix": ("mixtures/s and memory against Scaper on the same sources", _bench_mix_args),
    "shards": ("the text and shard stages on the configured mixtures, against their peers", _repeat),
    "import": ("importing AudioSet-Strong-style clips against datasets.to_parquet", _bench_import_args),
    "mixing": ("items/s of mixing while training against reading stored shards, and against Scaper", _bench_mixing_args),
    "train": ("loader clips/s per worker and training steps/s", _bench_train_args),
    "evaluate": ("where the metric time goes on a large score set", _bench_evaluate_args),
    "detection": ("PSDS1 against training minutes on the params' shards", _bench_detection_args),
    "real-library": ("the default recipe on a library of real recordings, beside the default run", _bench_real_library_args),
    "llm-cache": ("storing one LLM completion at 5,000 and 100,000 entries against rewriting the file", _bench_llm_cache_args),
    "scale": ("every data stage at growing corpus sizes: wall, CPU, peak RSS and output bytes, growth ratios", _bench_scale_args),
    "view": ("the view's catalog: load, page and filter a large dataset's rows", _bench_view_args),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sedsynth", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        p = sub.add_parser(command.name, help=command.help)
        _common_options(p)
        p.set_defaults(fn=command)
        if command.options:
            command.options(p)
    bench = sub.add_parser(
        "bench",
        help=BENCH.help,
        description="Measure a stage's throughput against a peer measured in the same run; each benchmark "
        "takes its own flags (sedsynth bench BENCHMARK --help).",
    )
    benchmarks = bench.add_subparsers(dest="what", required=True, metavar="BENCHMARK")
    for name, (help_text, options) in BENCHMARKS.items():
        p = benchmarks.add_parser(name, help=help_text)
        _common_options(p)
        p.set_defaults(fn=BENCH)
        p.add_argument(
            "--save",
            metavar="PATH",
            default=argparse.SUPPRESS,
            help="also write the figures, the printed lines, the command, machine and commit to PATH as JSON "
            "(the format of benchmarks/results/)",
        )
        options(p)
    return parser


def _probability(text: str) -> float:
    """An argparse type: a finite number in [0, 1] (``nan``, ``inf``, ``2`` and ``-1`` are refused)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability: pass a number from 0 to 1, e.g. 0.5")
    return value


def _device(text: str) -> str:
    """An argparse type: a device the trainer runs on (trainer.config.DEVICES), as ``evaluate.device`` takes."""
    from trainer.config import DEVICES, device_problem

    if device_problem(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: use {DEVICES}")
    return text


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more, e.g. 50")
    return value


def _output(args: argparse.Namespace) -> tuple[str, str | None]:
    """The settings naming the folders this command writes (``"mix.out_dir"``, "" where none), and the first
    of those folders as configured (None where not known)."""
    if getattr(args, "out", None):
        return "--out", str(args.out)
    keys = OUTPUT_SETTINGS.get(args.command, ())
    if not keys:
        return "", None
    try:
        value = _trainer_params(args)
        for part in keys[0].split("."):
            value = getattr(value, part)
    except (ParamsError, OSError, ValueError, AttributeError):  # the folder only fills in the message
        return " or ".join(keys), None
    return " or ".join(keys), str(value).replace("{kind}", getattr(args, "kind", "{kind}"))


def _os_fault(error: OSError, args: argparse.Namespace) -> str | None:
    """The one line for an OS fault the user can fix (a full, read-only or forbidden disk, a server that does not
    answer), or None for any other ``error`` (a bug, which keeps its traceback)."""
    if isinstance(error, (ConnectionError, TimeoutError)) and not isinstance(error, BrokenPipeError):
        return f"{error} ({type(error).__name__}): check the address and that its server is up and reachable, then run again"
    if error.errno not in (*DISK_FULL, *NOT_ALLOWED, errno.EROFS):
        return None
    key, folder = _output(args)
    where = error.filename or folder or "the output"
    if error.errno in DISK_FULL:
        return f"{DISK_FULL[error.errno]} writing {where}: free space" + (f" or set {key}" if key else " on that disk")
    if error.errno == errno.EROFS:
        return f"read-only file system at {where}: " + (
            f"set {key} to a folder on a writable disk" if key else "write to a writable disk"
        )
    return f"{NOT_ALLOWED[error.errno]} on {where}: give this user access to it" + (
        f" or set {key} to a folder it can write" if key else ""
    )


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a batch scheduler's time limit), raised like Ctrl-C."""


def _terminate(signum: int, frame) -> None:
    # unwinding like Ctrl-C lets the stage remove its temporaries and staging folder
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    from pipeline.files import NotRegularFileError  # a FIFO or device where a file was named: one line, not a traceback

    args = build_parser().parse_args(argv)
    on_main_thread = threading.current_thread() is threading.main_thread()  # only there can a handler be set
    previous = signal.signal(signal.SIGTERM, _terminate) if on_main_thread else None
    try:
        return args.fn(args)
    except (ParamsError, FileNotFoundError, FileExistsError, ValueError, CommandError, NotRegularFileError) as e:
        print(f"sedsynth {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        kept = {  # train and pretrain write into their folder as they go
            "train": "every file it wrote is whole (no temporary left); run it again to go on from checkpoints/latest.pt",
            "pretrain": "every file it wrote is whole (no temporary left); a rerun starts over",
        }.get(args.command, "the previous output, if any, is unchanged")
        print(f"sedsynth {args.command}: interrupted; {kept}", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
    except OSError as e:
        line = _os_fault(e, args)
        if line is None:
            raise
        print(f"sedsynth {args.command}: error: {line}", file=sys.stderr)
        return 2
    finally:
        if on_main_thread:  # None: a handler set outside Python, which cannot be put back
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


if __name__ == "__main__":
    raise SystemExit(main())
