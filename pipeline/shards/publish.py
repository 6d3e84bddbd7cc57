"""Publish a shard folder to the Hugging Face hub.

Input: a dataset folder (validated first), a dataset repo id, and a token in an environment
variable (``HF_TOKEN`` by default; never printed). Output: the files on the hub, shards first
and the card, index and cluster files last, so a half-finished upload never shows a card
for data that is not there.

Resumable: shards go up in batches of ``batch_files``, one commit each; before uploading,
the hub's file list is compared with ``index.json`` by LFS sha256, so a run after an
interruption (or after adding shards) uploads only what is missing or changed. ``dry_run``
lists what would be uploaded and touches nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.shards.layout import INDEX
from pipeline.shards.validate import validate


class PublishError(ValueError):
    """Publishing cannot go on; the message says what to do."""


def _index(folder: Path) -> dict:
    return json.loads((folder / INDEX).read_text(encoding="utf-8"))


def local_files(folder: Path, index: dict | None = None) -> list[str]:
    """Every file to publish, relative to ``folder``: shards (index order), then the rest sorted."""
    shards = [f["path"] for f in (index or _index(folder))["files"]]
    rest = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    return shards + [p for p in rest if p not in shards]


def pending(folder: Path, remote_sha256: dict[str, str | None], index: dict | None = None) -> list[str]:
    """Files whose hub copy is missing or differs (shards by their indexed sha256; other files always)."""
    index = index or _index(folder)
    sha = {f["path"]: f["sha256"] for f in index["files"]}
    return [p for p in local_files(folder, index) if p not in sha or remote_sha256.get(p) != sha[p]]


def remote_files(api, repo_id: str) -> dict[str, str | None]:
    """Path -> LFS sha256 (None for non-LFS files) of the hub repo's files; empty for a new repo."""
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        items = api.list_repo_tree(repo_id, repo_type="dataset", recursive=True)
        return {i.path: (i.lfs.sha256 if getattr(i, "lfs", None) else None) for i in items if hasattr(i, "size")}
    except RepositoryNotFoundError:
        return {}


def publish(folder: Path | str, repo_id: str, token_env: str = "HF_TOKEN", private: bool = False, dry_run: bool = False,
            batch_files: int = 50, api=None) -> list[str]:
    """Upload what the hub lacks; returns the files uploaded (or, with ``dry_run``, that would be)."""
    folder = Path(folder)
    validate(folder)
    token = os.environ.get(token_env) or None
    if api is None and (token or not dry_run):
        if not token:
            raise PublishError(f"${token_env} is not set: create a write token at https://huggingface.co/settings/tokens "
                               f"and export {token_env}=..., or pass --dry-run to list what would be uploaded")
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    index = _index(folder)
    remote = remote_files(api, repo_id) if api is not None else {}
    todo = pending(folder, remote, index)
    if dry_run:
        for p in todo:
            print(f"would upload {p} ({(folder / p).stat().st_size / 1e6:.1f} MB)")
        print(f"{len(todo)} files, {sum((folder / p).stat().st_size for p in todo) / 1e6:.1f} MB to {repo_id}"
              + ("" if api is not None else " (no token: the hub was not asked what it already has)"))
        return todo
    api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    shard_paths = {f["path"] for f in index["files"]}
    shards = [p for p in todo if p in shard_paths]
    rest = [p for p in todo if p not in shard_paths]
    batches = [shards[i:i + batch_files] for i in range(0, len(shards), batch_files)] + ([rest] if rest else [])
    for n, batch in enumerate(batches, 1):
        api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="dataset", allow_patterns=batch,
                          commit_message=f"sedsynth publish: batch {n} of {len(batches)} ({len(batch)} files)")
        print(f"uploaded batch {n} of {len(batches)} ({len(batch)} files)")
    return todo
