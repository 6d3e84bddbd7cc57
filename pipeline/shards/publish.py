"""Publish a shard folder to the Hugging Face hub.

Input: a dataset folder (validated first), a dataset repo id, and a token in an environment
variable (``HF_TOKEN`` by default; never printed). Output: the files on the hub, shards first
and the card, index and cluster files last, so a half-finished upload never shows a card
for data that is not there.

Resumable: shards go up in batches of ``batch_files``, one commit each; before uploading,
the hub's file list is compared with ``index.json`` by LFS sha256, so a run after an
interruption (or after adding shards) uploads only what is missing or changed. ``dry_run``
lists what would be uploaded and touches nothing.

A hub call that fails (a refused token, a repo the token may not write, a rate limit, a hub
error, a network that does not answer) raises :class:`PublishError` naming the repo, what was
being done and what to do; the files already committed stay, so running the command again
uploads only the rest.
"""

from __future__ import annotations

import importlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pipeline.shards.layout import INDEX
from pipeline.shards.validate import validate


class PublishError(ValueError):
    """Publishing cannot go on; the message says what to do."""


TOKENS_URL = "https://huggingface.co/settings/tokens"


def _network_errors() -> tuple[type[BaseException], ...]:
    """What a hub call raises when the network fails, whichever HTTP library this huggingface_hub uses
    (requests before 1.0, httpx, httpx2)."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"), ("requests", "RequestException")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def _first_line(text: str, limit: int = 200) -> str:
    line = next((x.strip() for x in str(text).splitlines() if x.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _refusal(status: int | None, repo_id: str, token_env: str) -> str:
    """What to do about a hub answer with HTTP ``status``."""
    if status == 401:
        return f"the token in ${token_env} is not valid: create a write token at {TOKENS_URL} and export {token_env}=..."
    if status == 403:
        return (f"the token in ${token_env} may not write to {repo_id}: use a token with write access to it "
                f"({TOKENS_URL}), or a repo id under your own account or organisation")
    if status == 404:
        return f"check the repo id {repo_id!r} (owner/name) and that the token in ${token_env} can see it"
    if status == 429:
        return "the hub limits the request rate: wait a few minutes, then run the same command again (it uploads only what is missing)"
    if status is not None and status >= 500:
        return "the hub failed: run the same command again later (it uploads only what is missing)"
    return "fix what the hub names, then run the same command again (it uploads only what is missing)"


@contextmanager
def hub_call(repo_id: str, doing: str, token_env: str) -> Iterator[None]:
    """Turn a failing hub call into :class:`PublishError`: one line naming ``repo_id``, what was being done
    (``doing``) and what to do. Other errors (a local file that cannot be read) pass unchanged."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        yield
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        raise PublishError(f"publish to {repo_id}: {doing} failed ({_first_line(e)}); {_refusal(status, repo_id, token_env)}") from None
    except _network_errors() as e:
        raise PublishError(f"publish to {repo_id}: {doing} failed, the hub did not answer ({type(e).__name__}: {_first_line(e)}); "
                           "check the network (and HF_ENDPOINT if set), then run the same command again "
                           "(it uploads only what is missing)") from None


# every hub request's limits: huggingface_hub sends its requests without any (a hub that takes
# the connection and never answers would hold publish for ever); a shard upload's writes and the
# hub's answer after it stay well inside these
HUB_TIMEOUTS_S = {"connect": 30.0, "read": 120.0, "write": 120.0, "pool": 30.0}


def bound_hub_requests(timeouts_s: dict[str, float] | None = None) -> None:
    """Make huggingface_hub's HTTP client give each request ``timeouts_s`` (default
    :data:`HUB_TIMEOUTS_S`) wherever it sets none, keeping the hub's own request hooks (offline
    mode, request ids). A request past a limit then fails as a network error (:func:`hub_call`)."""
    import httpx2
    from huggingface_hub import get_session, set_client_factory

    limits = dict(timeouts_s or HUB_TIMEOUTS_S)

    class BoundedTransport(httpx2.HTTPTransport):
        def handle_request(self, request):
            given = request.extensions.get("timeout") or {}
            request.extensions["timeout"] = {k: given.get(k) if given.get(k) is not None else v for k, v in limits.items()}
            return super().handle_request(request)

    hooks = get_session().event_hooks
    set_client_factory(lambda: httpx2.Client(transport=BoundedTransport(), event_hooks=hooks, follow_redirects=True))


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
    except RepositoryNotFoundError:  # also what a token that may not see the repo gets: create_repo then says so
        return {}


def publish(folder: Path | str, repo_id: str, token_env: str = "HF_TOKEN", private: bool = False, dry_run: bool = False,
            batch_files: int = 50, api=None) -> list[str]:
    """Upload what the hub lacks; returns the files uploaded (or, with ``dry_run``, that would be).

    ``batch_files`` (>= 1): shards per commit. ``api``: an ``HfApi``-like object (default: one
    made with the token). A failing hub call raises :class:`PublishError`.
    """
    if isinstance(batch_files, bool) or not isinstance(batch_files, int) or batch_files < 1:
        raise PublishError(f"batch_files is {batch_files!r}: pass a whole number of shards per commit, 1 or more (--batch-files 50)")
    folder = Path(folder)
    validate(folder)
    bound_hub_requests()
    token = os.environ.get(token_env) or None
    if api is None and (token or not dry_run):
        if not token:
            raise PublishError(f"${token_env} is not set: create a write token at https://huggingface.co/settings/tokens "
                               f"and export {token_env}=..., or pass --dry-run to list what would be uploaded")
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    index = _index(folder)
    with hub_call(repo_id, "listing the repo's files", token_env):
        remote = remote_files(api, repo_id) if api is not None else {}
    todo = pending(folder, remote, index)
    if dry_run:
        for p in todo:
            print(f"would upload {p} ({(folder / p).stat().st_size / 1e6:.1f} MB)")
        print(f"{len(todo)} files, {sum((folder / p).stat().st_size for p in todo) / 1e6:.1f} MB to {repo_id}"
              + ("" if api is not None else " (no token: the hub was not asked what it already has)"))
        return todo
    with hub_call(repo_id, "creating the dataset repo", token_env):
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    shard_paths = {f["path"] for f in index["files"]}
    shards = [p for p in todo if p in shard_paths]
    rest = [p for p in todo if p not in shard_paths]
    batches = [shards[i:i + batch_files] for i in range(0, len(shards), batch_files)] + ([rest] if rest else [])
    for n, batch in enumerate(batches, 1):
        with hub_call(repo_id, f"uploading batch {n} of {len(batches)}", token_env):
            api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="dataset", allow_patterns=batch,
                              commit_message=f"sedsynth publish: batch {n} of {len(batches)} ({len(batch)} files)")
        print(f"uploaded batch {n} of {len(batches)} ({len(batch)} files)")
    return todo
