"""``sedsynth ablate``: the command around :mod:`trainer.ablations` (FineLAP's Table 5 variants).

Input: the parsed ``args`` (variants, ``--queue``, ``--table``, ``--seed``, ``--score-only``) and the trainer's
params. Output: each named variant trained and evaluated per seed (the train and evaluate
stages, into ``<ablations.out_dir>/<variant>/seed<seed>/``), or the variants queued as DVC
experiments, or the table written and printed; the exit status.

The command runs in one process. Under torchrun (``WORLD_SIZE`` above 1) every rank would run it
whole: evaluate into the same folder, queue each experiment once per rank. So it refuses, in one
line, before doing anything.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from trainer import ablations


def main(args: argparse.Namespace, params) -> int:
    """Run ``sedsynth ablate`` with its parsed ``args`` and ``params``; returns the exit status
    (2 for a usage error, 1 when a queued experiment was refused); ValueError under torchrun."""
    ranks = os.environ.get("WORLD_SIZE", "1")
    if ranks.strip() not in ("", "1"):
        raise ValueError(
            f"ablate trains and evaluates its variants one after another in one process, so it does not run under "
            f"torchrun (WORLD_SIZE={ranks}: every rank would evaluate into the same folders); run `sedsynth ablate` "
            "without torchrun, on one device (train.device)"
        )
    if args.table:
        if args.seed:
            print(
                "sedsynth ablate: error: --seed picks runs to train or queue; the table reads ablations.seeds "
                "(--set 'ablations.seeds=[...]')",
                file=sys.stderr,
            )
            return 2
        print(
            ablations.write_table(
                Path(params.ablations.out_dir), ablations.experiment_metrics(params), params.ablations.seeds, args.variant or None
            )
        )
        return 0
    seeds = tuple(args.seed) if args.seed else params.ablations.seeds
    ablations.check_seeds(seeds)
    left_out = [s for s in seeds if s not in params.ablations.seeds]
    if left_out:
        print(
            f"ablate: seed(s) {', '.join(map(str, left_out))} not in ablations.seeds "
            f"({', '.join(map(str, params.ablations.seeds))}): the table leaves them out",
            file=sys.stderr,
        )
    if args.queue:
        variants = args.variant or list(ablations.TABLE5)  # the extra rows when named
        outcome = ablations.queue_experiments(params, variants, seeds=seeds)
        queued = [name for name, what in outcome.items() if what == "queued"]
        print(
            f"ablate: queued {len(queued)} DVC experiment(s): {', '.join(queued) or 'none'}; run them with `dvc queue start`, "
            "follow them with `dvc queue status`, then `dvc exp show` and `sedsynth ablate --table`"
        )
        return 1 if any(what.startswith("refused") for what in outcome.values()) else 0
    if not args.variant:
        print(
            f"sedsynth ablate: error: name a variant ({', '.join(ablations.VARIANTS)}), or pass --queue or --table",
            file=sys.stderr,
        )
        return 2
    for variant in args.variant:
        ablations.variant_params(params, variant, seeds[0])  # every name checked before the first training starts
    from trainer.stages.evaluate import run as evaluate
    from trainer.stages.train import run as train

    for variant in args.variant:
        for seed in seeds:
            ablations.run_variant(params, variant, seed, train=None if args.score_only else train, evaluate=evaluate)
    return 0
