"""The ``sedsynth`` command: one subcommand per stage, plus benchmarks.

Every stage reads ``params.yaml`` (``--params``) with ``--set key.sub=value`` overrides, and
calls the stage's ``run`` function; DVC calls exactly these commands.

    sedsynth corpus                      # generate the embedded source corpora
    sedsynth clip                        # FSD50K-layout corpus -> event clips
    sedsynth ambience                    # ambience library -> background segments
    sedsynth mix                         # clips + backgrounds -> soundscapes, recipes, labels
    sedsynth mix --set mix.preset=flam --set mix.mixtures.train=100000
    sedsynth clip --set sources.fsd50k_dir=/data/FSD50K --set compute.workers=8
    sedsynth bench clip                  # clipping throughput vs plain decoding
    sedsynth bench mix                   # mixtures/s and memory vs Scaper on the same sources
"""

from __future__ import annotations

import argparse
import sys

from pipeline.params import ParamsError, load_params, merge, parse_override


def _params(args: argparse.Namespace):
    overrides: dict = {}
    for text in args.set or []:
        overrides = merge(overrides, parse_override(text))
    return load_params(args.params, overrides)


def _corpus(args: argparse.Namespace) -> int:
    from pipeline.corpus.stage import run

    run(_params(args))
    return 0


def _clip(args: argparse.Namespace) -> int:
    from pipeline.clip import run

    run(_params(args))
    return 0


def _ambience(args: argparse.Namespace) -> int:
    from pipeline.ambience import run

    run(_params(args))
    return 0


def _mix(args: argparse.Namespace) -> int:
    from pipeline.mix.stage import run

    run(_params(args))
    return 0


def _bench(args: argparse.Namespace) -> int:
    from pipeline.bench import main as bench_main

    return bench_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sedsynth", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def stage(name: str, fn, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a parameter, e.g. clip.max_duration_s=5")
        p.set_defaults(fn=fn)
        return p

    stage("corpus", _corpus, "generate the embedded FSD50K-layout corpus and ambience library")
    stage("clip", _clip, "cut single-event clips from an FSD50K-layout corpus")
    stage("ambience", _ambience, "cut background segments from an ambience library")
    stage("mix", _mix, "mix event clips over backgrounds into soundscapes with relabeled boundaries")
    bench = stage("bench", _bench, "measure stage throughput against a peer measured in the same run")
    bench.add_argument("what", choices=["clip", "mix"], help="which stage to measure")
    bench.add_argument("--corpus", default=None, help="FSD50K-layout folder to measure on (default: a generated one)")
    bench.add_argument("--clips", type=int, default=400, help="clips in the generated corpus (default 400)")
    bench.add_argument("--repeat", type=int, default=3, help="timed passes; the best is reported (default 3)")
    bench.add_argument("--mixtures", type=int, default=2000, help="mix: mixtures per timed run (default 2000)")
    bench.add_argument("--workers", default="1,2", help="mix: comma-separated worker counts to time (default 1,2)")
    bench.add_argument("--scaper-python", default=None, help="mix: python of an environment with scaper 1.6.5 (default .venv-scaper/bin/python if present)")
    bench.add_argument("--scaper-mixtures", type=int, default=200, help="mix: soundscapes Scaper makes (default 200)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ParamsError, FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"sedsynth {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"sedsynth {args.command}: interrupted; the previous output, if any, is unchanged", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
