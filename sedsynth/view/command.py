"""``sedsynth view [PATH]``: which folders and checkpoint to serve, then the server in the foreground.

Input: the parsed arguments (``path``, ``--data``, ``--evaluation``, ``--checkpoint``, ``--host``,
``--port``, ``--max-upload-mb``, ``--device``) and the params (None where no params file exists).
PATH is a shard folder, a mixtures folder or an evaluation folder; without it, the run the
params describe: ``shards.out_dir``, ``evaluate.out_dir`` and ``evaluate.checkpoint``. An
evaluation folder is shown with the shard folder it scored (``--data``, else ``evaluate.shards``).
Output: the URL on stdout once the server listens; it runs until Ctrl-C (exit 0). A PATH that
is none of the three kinds, or nothing to show at all, is one line on stderr (exit 2).
"""

from __future__ import annotations

import asyncio
import errno
import socket
import sys
from pathlib import Path

from sedsynth.view.catalog import FolderError, folder_kind, open_catalog
from sedsynth.view.evaluation import is_evaluation, open_evaluation

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def _say(line: str) -> None:
    print(f"sedsynth view: {line}", file=sys.stderr, flush=True)


def resolve(args, params) -> tuple[str | None, str | None, str | None, str | None]:
    """``(dataset folder, evaluation folder, checkpoint, note)`` to serve, each None where there is none; the note
    says why queries are off when the default checkpoint does not exist.

    Raises :class:`~sedsynth.view.catalog.FolderError` (one line) for a PATH of no known kind, a
    ``--data``/``--evaluation``/``--checkpoint`` that does not exist, or nothing to show."""
    from trainer.config import Params

    p = params or Params()
    data, evaluation = args.data, args.evaluation
    if args.path:
        kind = folder_kind(args.path)
        if kind == "evaluation":
            evaluation = args.path
            if data is None and Path(p.evaluate.shards).is_dir():
                data = p.evaluate.shards
        else:
            data = args.path
    else:
        data = data or (p.shards.out_dir if Path(p.shards.out_dir).is_dir() else None)
        evaluation = evaluation or (p.evaluate.out_dir if is_evaluation(p.evaluate.out_dir) else None)
        if data is None and evaluation is None:
            raise FolderError(
                f"nothing to show: neither {p.shards.out_dir} (shards.out_dir) nor {p.evaluate.out_dir} (evaluate.out_dir) "
                "exists; run the pipeline first, or pass PATH (a shard, mixtures or evaluation folder)"
            )
    if args.data is not None and folder_kind(args.data) == "evaluation":
        raise FolderError(
            f"--data {args.data} is an evaluation folder; pass it as PATH or --evaluation, and the shard folder as --data"
        )
    if args.evaluation is not None and not is_evaluation(args.evaluation):
        raise FolderError(f"--evaluation {args.evaluation} is not an evaluation folder (metrics.json, details/)")
    checkpoint, note = args.checkpoint or p.evaluate.checkpoint, None
    if not Path(checkpoint).is_file():
        if args.checkpoint:
            raise FolderError(
                f"--checkpoint {args.checkpoint} does not exist or is not a file; pass a trainer checkpoint (best.pt)"
            )
        note = f"no checkpoint at {checkpoint} (evaluate.checkpoint): queries are off; pass --checkpoint PATH to turn them on"
        checkpoint = None
    return data, evaluation, checkpoint, note


def main(args, params) -> int:
    """Serve the folders ``args`` name until interrupted; see the module's docstring."""
    from sedsynth.view.server import make_app, serve
    from trainer.config import Params

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a port; pass 0 to 65535 (0: a free one)")
    if args.max_upload_mb <= 0:
        raise ValueError(f"--max-upload-mb {args.max_upload_mb} must be above 0")
    data, evaluation_folder, checkpoint, note = resolve(args, params)
    catalog = open_catalog(data) if data is not None else None
    evaluation = open_evaluation(evaluation_folder) if evaluation_folder is not None else None
    if note:
        _say(note)
    if catalog is not None:
        _say(f"{catalog.kind} {data}: {len(catalog)} mixtures")
    if evaluation is not None:
        _say(
            f"evaluation {evaluation_folder}: {len(evaluation.durations)} {evaluation.split} clips"
            + ("" if catalog is not None else " (no shard folder found: pass --data to hear its mixtures)")
        )
    if args.host not in LOCAL_HOSTS:
        _say(
            f"listening on {args.host}, not only this machine: anyone who reaches this address can read the data served and upload files"
        )
    app = make_app(
        catalog,
        evaluation,
        checkpoint,
        (params or Params()).evaluate,
        max_upload_bytes=int(args.max_upload_mb * (1 << 20)),
        device=args.device,
    )

    def ready(url: str) -> None:
        print(url, flush=True)

    try:
        asyncio.run(serve(app, args.host, args.port, ready))
    except KeyboardInterrupt:
        _say("stopped")
        return 0
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ValueError(
                f"port {args.port} on {args.host} is in use; pass --port 0 for a free one, or another port"
            ) from None
        if e.errno == errno.EADDRNOTAVAIL or isinstance(e, socket.gaierror):
            raise ValueError(
                f"cannot listen on {args.host}: {e.strerror or e}; pass an address of this machine with --host"
            ) from None
        raise
    return 0
