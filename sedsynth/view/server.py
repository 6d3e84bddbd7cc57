"""The web server of ``sedsynth view``: an aiohttp application over a catalog, an evaluation and a checkpoint.

Input: a :class:`~sedsynth.view.catalog.Catalog` (or None), an
:class:`~sedsynth.view.evaluation.Evaluation` (or None), a checkpoint path (or None) with the
``evaluate`` params, and the upload limit. Output: :func:`make_app`'s application, which serves
the page (``/``), its own files (``/static/NAME``, only the files shipped in the package) and a
JSON API under ``/api/`` (below); :func:`running` runs it in a background thread (tests, the
screenshot script) and :func:`serve` in the foreground (the command).

Nothing is served by a path taken from a request: mixtures are named by their id (looked up in
the catalog), uploads by their random token, evaluated clips by their id in the evaluation's
ground truth, and the page's files by a fixed list; an audio path a folder's metadata names must
resolve inside that folder (else 403). Uploads stop at the size limit (413) and are written only
inside the server's temporary folder.

API (GET unless said): ``info``; ``mixtures`` (filters, ``page``, ``per_page``); ``mixture?id=``;
``audio?id=`` or ``?upload=`` (byte ranges, so the player can seek); ``spectrogram?id=`` or
``?upload=`` (PNG); ``detect`` (POST JSON ``{"id" or "upload", "queries": [...]}``); ``upload``
(POST, multipart field ``file``); ``evaluation``; ``evaluation/errors?model=``;
``evaluation/scores?model=&clip=&class=``.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from aiohttp import web

from pipeline.audio import AudioError
from sedsynth.view.catalog import Catalog, OutsideError, audio_type
from sedsynth.view.evaluation import Evaluation
from sedsynth.view.querying import Querier, Uploads, check_query_texts, palette, spectrogram_png

STATIC_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".txt": "text/plain",
    ".md": "text/plain",
}
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # the page's own script, styles and pictures only: a caption holding markup cannot run anything
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; media-src 'self' blob:; style-src 'self'; "
    "script-src 'self'; object-src 'none'; frame-ancestors 'none'",
}
MAX_PER_PAGE = 200
CACHED = 32  # spectrograms and audio cells kept in memory
TOKEN = re.compile(r"^[0-9a-f]{32}$")


def static_files() -> dict[str, tuple[bytes, str]]:
    """The page's files shipped in the package (``sedsynth/view/static/``): name -> (bytes, content type)."""
    folder = resources.files("sedsynth.view") / "static"
    out = {}
    for entry in folder.iterdir():
        suffix = Path(entry.name).suffix
        if entry.is_file() and suffix in STATIC_TYPES:
            out[entry.name] = (entry.read_bytes(), STATIC_TYPES[suffix] + ("; charset=utf-8" if suffix not in (".png",) else ""))
    return out


class _Cache:
    """A small least-recently-used map, touched only from the event loop's thread."""

    def __init__(self, size: int):
        self.size, self.items = size, OrderedDict()

    def get(self, key):
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        return None

    def put(self, key, value):
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.size:
            self.items.popitem(last=False)
        return value


def _fail(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=SECURITY_HEADERS)


def _json(payload) -> web.Response:
    return web.Response(text=json.dumps(payload, allow_nan=False), content_type="application/json", headers=SECURITY_HEADERS)


def _number(query, name: str, kind=float):
    """A query parameter as ``kind``, None when absent or empty; raises ValueError naming it when it is not one."""
    text = query.get(name, "").strip()
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number") from None
    if kind is float and value != value:
        raise ValueError(f"{name} is not a number")
    return value


def ranged(request: web.Request, data: bytes, content_type: str) -> web.Response:
    """``data`` as the response to ``request``, honouring one ``Range: bytes=a-b`` (206) so the player can seek;
    416 for a range outside the data."""
    headers = {**SECURITY_HEADERS, "Accept-Ranges": "bytes", "Cache-Control": "private, max-age=3600"}
    spec = request.headers.get("Range", "")
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", spec.strip())
    if not m or (not m.group(1) and not m.group(2)):
        return web.Response(body=data, content_type=content_type, headers=headers)
    n = len(data)
    if m.group(1):
        start = int(m.group(1))
        end = min(int(m.group(2)), n - 1) if m.group(2) else n - 1
    else:  # the last N bytes
        start, end = max(0, n - int(m.group(2))), n - 1
    if start >= n or end < start:
        return web.Response(status=416, headers={**headers, "Content-Range": f"bytes */{n}"})
    headers["Content-Range"] = f"bytes {start}-{end}/{n}"
    return web.Response(status=206, body=data[start : end + 1], content_type=content_type, headers=headers)


def _truth_for(mixture: dict, query: str) -> list[list[float]] | None:
    """The segments of the mixture's phrases that ``query`` names (its phrase or its label, case and ``_`` aside); None if none does."""
    q = " ".join(query.lower().replace("_", " ").split())
    found = None
    for p in mixture.get("phrases", []):
        names = {" ".join(p["phrase"].lower().split()), " ".join(p["label"].lower().replace("_", " ").split())}
        if q in names:
            found = (found or []) + p["segments"]
    return None if found is None else sorted(found)


def split_queries(catalog: Catalog | None, split: str) -> dict[str, str]:
    """Label -> the phrase ``split`` uses most for it (ties: alphabetical): the query the evaluate stage scored each class with."""
    if catalog is None:
        return {}
    counts: dict[str, Counter] = {}
    for k in catalog.select(split=split):
        for p in catalog.mixture(catalog.ids[k])["phrases"]:
            counts.setdefault(p["label"], Counter())[p["phrase"]] += 1
    return {label: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for label, c in counts.items()}


def make_app(
    catalog: Catalog | None,
    evaluation: Evaluation | None,
    checkpoint: str | None,
    evaluate_params,
    *,
    max_upload_bytes: int = 50 << 20,
    device: str | None = None,
) -> web.Application:
    """The application: page, files and API over what is given (any of the three may be None).

    The checkpoint is loaded in a worker thread when the server starts, so the page is up at once;
    a query waits for it. Audio, spectrograms and queries run in two worker threads.
    """
    app = web.Application(client_max_size=max_upload_bytes + (1 << 20))
    files = static_files()
    state: dict = {
        "querier": None,
        "querier_error": None,
        "loading": None,
        "uploads": None,
        "pool": None,
        "spectrograms": _Cache(CACHED),
        "audio": _Cache(CACHED),
        "errors": {},
        "queries": None,
    }

    async def resources_ctx(app: web.Application):
        state["pool"] = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sedsynth-view")
        state["uploads"] = Uploads(max_upload_bytes)
        state["pool"].submit(palette)  # imports matplotlib now, not on the first spectrogram asked for
        if checkpoint is not None:
            state["loading"] = asyncio.get_running_loop().run_in_executor(
                state["pool"], lambda: Querier(checkpoint, evaluate_params, device).warm_up()
            )
        yield
        state["pool"].shutdown(wait=False, cancel_futures=True)
        state["uploads"].close()

    app.cleanup_ctx.append(resources_ctx)

    async def work(fn: Callable, *args):
        return await asyncio.get_running_loop().run_in_executor(state["pool"], fn, *args)

    async def querier() -> Querier | None:
        if state["loading"] is not None and state["querier"] is None and state["querier_error"] is None:
            try:
                state["querier"] = await asyncio.shield(state["loading"])
            except Exception as e:  # an unusable checkpoint: the page says why, the rest of it still works
                state["querier_error"] = f"{type(e).__name__}: {e}"
        return state["querier"]

    def eval_queries() -> dict[str, str]:
        if state["queries"] is None:
            state["queries"] = split_queries(catalog, evaluation.split) if evaluation is not None else {}
        return state["queries"]

    async def page(request: web.Request) -> web.Response:
        body, kind = files["index.html"]
        return web.Response(body=body, headers={**SECURITY_HEADERS, "Content-Type": kind, "Cache-Control": "no-cache"})

    async def static(request: web.Request) -> web.Response:
        found = files.get(request.match_info["name"])
        if found is None:
            return _fail(404, "no such file")
        return web.Response(body=found[0], headers={**SECURITY_HEADERS, "Content-Type": found[1], "Cache-Control": "no-cache"})

    async def info(request: web.Request) -> web.Response:
        detect: dict = {"available": checkpoint is not None, "checkpoint": checkpoint}
        if state["loading"] is not None and state["loading"].done():
            await querier()  # loaded (or failed): say which
        if state["querier"] is not None:
            detect.update(state["querier"].describe())
        elif state["querier_error"] is not None:
            detect.update(available=False, error=state["querier_error"])
        elif state["loading"] is not None:
            detect["loading"] = not state["loading"].done()
        return _json(
            {
                "dataset": catalog.summary() if catalog is not None else None,
                "evaluation": {"folder": str(evaluation.folder), "split": evaluation.split, "models": list(evaluation.models)}
                if evaluation is not None
                else None,
                "detect": detect,
                "max_upload_bytes": max_upload_bytes,
            }
        )

    async def mixtures(request: web.Request) -> web.Response:
        if catalog is None:
            return _fail(404, "no dataset is served; pass a shard or mixtures folder (or --data)")
        q = request.query
        try:
            page_number = max(1, _number(q, "page", int) or 1)
            per_page = min(MAX_PER_PAGE, max(1, _number(q, "per_page", int) or 50))
            rows = catalog.select(
                split=q.get("split", ""),
                label=q.get("label", ""),
                cluster=_number(q, "cluster", int),
                min_events=_number(q, "min_events", int),
                max_events=_number(q, "max_events", int),
                min_snr_db=_number(q, "min_snr", float),
                max_snr_db=_number(q, "max_snr", float),
                text=q.get("text", ""),
            )
        except ValueError as e:
            return _fail(400, str(e))
        start = (page_number - 1) * per_page
        return _json(
            {
                "total": int(len(rows)),
                "page": page_number,
                "per_page": per_page,
                "rows": catalog.rows(rows[start : start + per_page]),
            }
        )

    def _mixture(mixture_id: str) -> dict | None:
        found = catalog.mixture(mixture_id) if catalog is not None else None
        if found is not None and evaluation is not None and mixture_id in evaluation.durations:
            found["evaluated"] = {"split": evaluation.split, "models": list(evaluation.models)}
        return found

    async def mixture(request: web.Request) -> web.Response:
        found = _mixture(request.query.get("id", ""))
        if found is None:
            return _fail(404, "no such mixture")
        return _json(found)

    async def upload_record(request: web.Request) -> web.Response:
        found = state["uploads"].public(request.query.get("token", ""))
        return _json(found) if found is not None else _fail(404, "no such upload (uploads last while the server runs)")

    async def audio_bytes(query) -> tuple[bytes | None, int | None, web.Response | None]:
        """The encoded audio and rate of the clip ``query`` names (``upload``: a token, else ``id``: a mixture), or the error response."""
        if "upload" in query:
            token = str(query["upload"])
            found = state["uploads"].get(token) if TOKEN.match(token) else None
            if found is None:
                return None, None, _fail(404, "no such upload")
            return await work(found["path"].read_bytes), found["sample_rate_hz"], None
        mixture_id = str(query.get("id", ""))
        if catalog is None or mixture_id not in catalog.position:
            return None, None, _fail(404, "no such mixture")
        cached = state["audio"].get(mixture_id)
        if cached is None:
            try:
                cached = state["audio"].put(mixture_id, await work(catalog.audio, mixture_id))
            except OutsideError:
                return None, None, _fail(403, "that mixture's audio lies outside the folder served")
            except (FileNotFoundError, IsADirectoryError):
                return None, None, _fail(404, "that mixture's audio file is missing")
            except OSError as e:  # a FIFO or device where its file should be, a read error
                return (
                    None,
                    None,
                    _fail(403 if isinstance(e, PermissionError) else 404, f"that mixture's audio cannot be read ({e})"),
                )
        rate = catalog.mixture(mixture_id).get("sample_rate_hz") or 16000
        return cached, int(rate), None

    async def audio(request: web.Request) -> web.Response:
        data, _, error = await audio_bytes(request.query)
        return error if error is not None else ranged(request, data, audio_type(data))

    async def spectrogram(request: web.Request) -> web.Response:
        key = ("upload", request.query.get("upload")) if "upload" in request.query else ("id", request.query.get("id"))
        png = state["spectrograms"].get(key)
        if png is None:
            data, rate, error = await audio_bytes(request.query)
            if error is not None:
                return error
            try:
                png = state["spectrograms"].put(key, await work(spectrogram_png, data, min(rate, 48000)))
            except AudioError as e:
                return _fail(422, f"the audio does not decode ({e})")
        return web.Response(
            body=png, content_type="image/png", headers={**SECURITY_HEADERS, "Cache-Control": "private, max-age=3600"}
        )

    async def detect(request: web.Request) -> web.Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
            queries = check_query_texts(body.get("queries"))
        except (ValueError, TypeError) as e:
            return _fail(400, str(e))
        if checkpoint is None:
            return _fail(409, "no checkpoint: start sedsynth view with --checkpoint PATH (a trainer checkpoint)")
        q = await querier()
        if q is None:
            return _fail(409, f"the checkpoint could not be loaded: {state['querier_error']}")
        data, _, error = await audio_bytes(body)
        if error is not None:
            return error
        try:
            result = await work(q.query, data, queries)
        except AudioError as e:
            return _fail(422, f"the audio does not decode ({e})")
        if "upload" not in body:
            found = _mixture(str(body.get("id", "")))
            result["truth"] = [_truth_for(found, text) for text in queries] if found else [None] * len(queries)
        else:
            result["truth"] = [None] * len(queries)
        return _json(result)

    async def upload(request: web.Request) -> web.Response:
        if not request.content_type.startswith("multipart/"):
            return _fail(400, "send the file as multipart/form-data, field 'file'")
        reader = await request.multipart()
        part = await reader.next()
        while part is not None and getattr(part, "name", None) != "file":
            part = await reader.next()
        if part is None:
            return _fail(400, "no field 'file' in the form")
        chunks, size = [], 0
        while chunk := await part.read_chunk(1 << 16):
            size += len(chunk)
            if size > max_upload_bytes:
                return _fail(413, f"the file is larger than {max_upload_bytes} bytes, the limit (--max-upload-mb)")
            chunks.append(chunk)
        try:
            record = await work(state["uploads"].add, b"".join(chunks), part.filename or "upload")
        except AudioError as e:
            return _fail(422, f"the file does not decode as audio ({e})")
        return _json(record)

    def _no_evaluation() -> web.Response:
        return _fail(404, "no evaluation is served; pass an evaluation folder (or --evaluation)")

    async def evaluation_summary(request: web.Request) -> web.Response:
        if evaluation is None:
            return _no_evaluation()
        return _json(await work(evaluation.summary, eval_queries()))

    async def evaluation_errors(request: web.Request) -> web.Response:
        if evaluation is None:
            return _no_evaluation()
        model = request.query.get("model", evaluation.models[0] if evaluation.models else "")
        if model not in evaluation.models:
            return _fail(404, f"no model {model!r}; the evaluation has {', '.join(evaluation.models)}")
        if model not in state["errors"]:
            state["errors"][model] = await work(evaluation.errors, model)
        queries = eval_queries()
        found = state["errors"][model]
        for e in found["false_alarms"] + found["misses"]:
            e["query"] = queries.get(e["class"], e["class"])
            e["in_dataset"] = catalog is not None and e["clip"] in catalog.position
        return _json(found)

    async def evaluation_scores(request: web.Request) -> web.Response:
        if evaluation is None:
            return _no_evaluation()
        q = request.query
        found = await work(evaluation.scores, q.get("model", ""), q.get("clip", ""), q.get("class", ""))
        if found is None:
            return _fail(404, "no stored scores for that model, clip and class")
        found.update(
            model=q["model"],
            clip=q["clip"],
            label=q["class"],
            threshold=evaluation.threshold,
            query=eval_queries().get(q["class"], q["class"]),
        )
        return _json(found)

    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static)
    for path, handler in (
        ("info", info),
        ("mixtures", mixtures),
        ("mixture", mixture),
        ("upload", upload_record),
        ("audio", audio),
        ("spectrogram", spectrogram),
        ("evaluation", evaluation_summary),
        ("evaluation/errors", evaluation_errors),
        ("evaluation/scores", evaluation_scores),
    ):
        app.router.add_get(f"/api/{path}", handler)
    app.router.add_post("/api/detect", detect)
    app.router.add_post("/api/upload", upload)
    return app


def _bound_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port the system picks)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


async def _start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    sock = _bound_socket(host, port)  # first: a port in use fails before the app sets anything up (its upload folder)
    runner = web.AppRunner(app, access_log=None)
    try:
        await runner.setup()
        await web.SockSite(runner, sock).start()
    except BaseException:
        await runner.cleanup()
        sock.close()
        raise
    return runner, url_of(sock)


async def serve(app: web.Application, host: str, port: int, ready: Callable[[str], None]) -> None:
    """Run ``app`` on ``host``:``port`` until cancelled (Ctrl-C); ``ready`` gets the URL once it listens."""
    runner, url = await _start(app, host, port)
    try:
        ready(url)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


@contextmanager
def running(app: web.Application, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 60.0) -> Iterator[str]:
    """Run ``app`` in a background thread with its own event loop; yields its URL, and stops it (and waits) on exit."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            box["runner"], box["url"] = loop.run_until_complete(_start(app, host, port))
        except BaseException as e:  # reported to the caller, which is waiting on ``started``
            box["error"] = e
            started.set()
            loop.close()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(box["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=run, name="sedsynth-view-server", daemon=True)
    thread.start()
    if not started.wait(timeout_s):
        raise TimeoutError(f"the view server did not start within {timeout_s} s")
    if "error" in box:
        raise box["error"]
    try:
        yield box["url"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
