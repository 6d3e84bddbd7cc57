"""``sedsynth view`` in a real browser: headless Chromium driven by Selenium against a real server on a free local port.

The list's filters, the player (its time advances), the labelled segments drawn where the shards
put them (to the pixel), a query's probabilities drawn, an upload queried, and an evaluation row
opening its mixture at its second. Skipped only where Chromium or its driver is not installed
(Debian: ``apt-get install chromium chromium-driver``). Every wait is bounded.
"""

from __future__ import annotations

import shutil
import time
from urllib.parse import parse_qs

import pytest

from sedsynth.view.catalog import open_shards
from sedsynth.view.evaluation import open_evaluation
from sedsynth.view.server import make_app, running, split_queries
from tests.conftest import tone_burst

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="Chromium or chromedriver is not installed (Debian: apt-get install chromium chromium-driver)",
)
WAIT_S = 20
FRAME_S = 0.08  # the model's frame hop; a drawn segment is held to 1.5 px, finer than one frame


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1100",
        "--autoplay-policy=no-user-gesture-required",
        "--mute-audio",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    driver.set_script_timeout(WAIT_S)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def site(view_data):
    catalog = open_shards(view_data.shards)
    app = make_app(
        catalog, open_evaluation(view_data.evaluation), str(view_data.checkpoint), view_data.params.evaluate, device="cpu"
    )
    with running(app) as url:
        yield url, catalog


def wait_for(driver, condition, what: str, timeout_s: float = WAIT_S):
    """``condition(driver)``'s first truthy value within ``timeout_s`` (polled), else a failure naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            value = condition(driver)
        except Exception as e:  # the element is not there yet, or was just replaced
            last, value = e, None
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}" + (f" (last error: {last})" if last else ""))


def open_page(driver, url: str) -> None:
    driver.get(url)
    wait_for(driver, lambda d: d.execute_script("return document.body.dataset.ready === '1'"), "the page to start")


def listed(driver, filters: dict) -> list[str] | None:
    """The ids the list shows, once it shows the answer to ``filters`` (``{}``: none), else None."""
    shown = driver.find_element("id", "list-total")
    asked = parse_qs(shown.get_attribute("data-request").lstrip("?"))
    if {k: v[0] for k, v in asked.items() if k not in ("page", "per_page")} != {k: str(v) for k, v in filters.items()}:
        return None
    return [r.get_attribute("data-id") for r in driver.find_elements("css selector", "#mixtures tbody tr")]


def wait_listed(driver, filters: dict, what: str, page: int = 1) -> tuple[int, list[str]]:
    """(total, ids shown) once the list answers ``filters`` on ``page``."""

    def ready(d):
        ids = listed(d, filters)
        total = d.find_element("id", "list-total")
        return ids is not None and int(total.get_attribute("data-page")) == page and (int(total.get_attribute("data-total")), ids)

    return wait_for(driver, ready, what)


def test_the_list_filters_and_pages(browser, site):
    from selenium.webdriver.support.ui import Select

    url, catalog = site
    open_page(browser, url)
    assert wait_listed(browser, {}, "all mixtures") == (30, catalog.ids[:25])  # the first page of 25
    browser.find_element("id", "next-page").click()
    assert wait_listed(browser, {}, "the second page", page=2) == (30, catalog.ids[25:])
    assert browser.find_element("id", "next-page").get_attribute("disabled") is not None
    Select(browser.find_element("id", "filter-split")).select_by_value("test")
    assert wait_listed(browser, {"split": "test"}, "the test split") == (5, [f"test_{i:07d}" for i in range(5)])
    label = catalog.labels[catalog.position["test_0000002"]][0]
    Select(browser.find_element("id", "filter-label")).select_by_value(label)
    expected = [catalog.ids[k] for k in catalog.select(split="test", label=label)]
    assert wait_listed(browser, {"split": "test", "label": label}, f"test mixtures with {label}") == (len(expected), expected)
    cluster = catalog.summary()["clusters"][0]
    Select(browser.find_element("id", "filter-cluster")).select_by_value(str(cluster["id"]))
    expected = [catalog.ids[k] for k in catalog.select(split="test", label=label, cluster=cluster["id"])]
    assert wait_listed(browser, {"split": "test", "label": label, "cluster": cluster["id"]}, "and a cluster") == (
        len(expected),
        expected,
    )
    browser.find_element("id", "filter-reset").click()
    wait_listed(browser, {}, "the filters cleared")
    browser.find_element("id", "filter-min_events").send_keys("6")
    browser.find_element("id", "filter-max_snr").send_keys("19.5")
    browser.find_element("id", "filter-text").click()  # leaving a box applies it
    expected = [catalog.ids[k] for k in catalog.select(min_events=6, max_snr_db=19.5)]
    assert wait_listed(browser, {"min_events": 6, "max_snr": 19.5}, "6 events or more, SNRs up to 19.5 dB") == (
        len(expected),
        expected,
    )
    assert 0 < len(expected) < 30
    browser.find_element("id", "filter-reset").click()
    wait_listed(browser, {}, "the filters cleared")
    word = catalog.mixture("valid_0000003")["phrases"][0]["phrase"]
    browser.find_element("id", "filter-text").send_keys(word)
    expected = [catalog.ids[k] for k in catalog.select(text=word)]
    assert wait_listed(browser, {"text": word}, f"captions with {word!r}") == (len(expected), expected)
    assert "valid_0000003" in expected
    browser.find_element("css selector", "#mixtures tbody tr a").click()
    wait_for(browser, lambda d: d.find_element("id", "clip-title").text == expected[0], "the first row's mixture")


def test_the_player_plays_and_the_playhead_follows(browser, site):
    url, _ = site
    open_page(browser, url + "#/mix/test_0000000")
    wait_for(browser, lambda d: d.execute_script("return document.getElementById('player').readyState >= 2"), "the audio to load")
    browser.execute_script("const p = document.getElementById('player'); p.muted = true; p.play();")
    t = wait_for(
        browser,
        lambda d: (x := d.execute_script("return document.getElementById('player').currentTime")) > 0.4 and x,
        "currentTime to advance",
    )
    head = wait_for(
        browser,
        lambda d: float(d.find_element("id", "playhead").get_attribute("data-time")) > 0.3 and d.find_element("id", "playhead"),
        "the playhead to move",
    )
    track = browser.find_element("css selector", ".spec-row .track").rect
    now = browser.execute_script("return document.getElementById('player').currentTime")
    assert t > 0.4 and head.rect["x"] > track["x"] and head.rect["x"] - track["x"] <= (now + 0.5) / 10.0 * track["width"]
    browser.execute_script("document.getElementById('player').pause()")


def test_segments_are_drawn_where_the_shards_say(browser, site):
    url, catalog = site
    mixture = catalog.mixture("test_0000000")
    open_page(browser, url + "#/mix/test_0000000")
    wait_for(
        browser,
        lambda d: d.execute_script("const i = document.getElementById('spectrogram'); return i.complete && i.naturalWidth > 0"),
        "the spectrogram",
    )
    duration = mixture["duration_s"]
    spectrogram = browser.find_element("id", "spectrogram").rect
    lanes = browser.find_elements("css selector", ".lane")
    assert [lane.get_attribute("data-phrase") for lane in lanes] == [p["phrase"] for p in mixture["phrases"]]
    for lane, phrase in zip(lanes, mixture["phrases"]):
        track = lane.find_element("css selector", ".track").rect
        assert track["x"] == pytest.approx(spectrogram["x"], abs=0.5) and track["width"] == pytest.approx(
            spectrogram["width"], abs=0.5
        )
        boxes = lane.find_elements("css selector", ".segment")
        assert len(boxes) == len(phrase["segments"])
        px_per_s = track["width"] / duration
        assert FRAME_S * px_per_s > 1.5  # the check below is finer than one frame
        for box, (onset, offset) in zip(boxes, phrase["segments"]):
            assert float(box.get_attribute("data-onset")) == onset and float(box.get_attribute("data-offset")) == offset
            r = box.rect
            assert r["x"] - track["x"] == pytest.approx(onset * px_per_s, abs=1.5), (phrase["phrase"], onset)
            assert r["x"] + r["width"] - track["x"] == pytest.approx(offset * px_per_s, abs=1.5), (phrase["phrase"], offset)
    onset = mixture["phrases"][-1]["segments"][0][0]
    lanes[-1].find_element("css selector", ".segment").click()  # plays from the segment's onset
    wait_for(
        browser,
        lambda d: d.execute_script("return document.getElementById('player').currentTime") >= onset - 0.01,
        "the player to jump to the onset",
    )
    now = browser.execute_script("const p = document.getElementById('player'); p.pause(); return p.currentTime")
    assert onset - 0.01 <= now < onset + 2.0


def canvas_ink(driver, canvas) -> int:
    """Pixels of a canvas that are not transparent."""
    return driver.execute_script(
        "const c = arguments[0]; const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n;",
        canvas,
    )


def test_a_query_draws_its_probabilities_beside_the_truth(browser, site):
    url, catalog = site
    mixture = catalog.mixture("test_0000000")
    open_page(browser, url + "#/mix/test_0000000")
    field = wait_for(browser, lambda d: d.find_element("id", "query-input"), "the query box")
    field.send_keys("bark; a siren wailing")
    browser.find_element("id", "query-button").click()
    rows = wait_for(
        browser, lambda d: (r := d.find_elements("css selector", ".prob-row.live")) and len(r) == 2 and r, "two probability rows"
    )
    assert [r.get_attribute("data-query") for r in rows] == ["bark", "a siren wailing"]
    frames = round(mixture["duration_s"] / FRAME_S)
    for row in rows:
        canvas = row.find_element("css selector", "canvas")
        assert int(canvas.get_attribute("data-frames")) == frames
        assert 0.0 < float(canvas.get_attribute("data-max")) <= 1.0
        assert wait_for(browser, lambda d: canvas_ink(d, canvas) > 100, "the probabilities drawn")
        assert int(row.get_attribute("data-events")) == len(row.find_elements("css selector", ".event"))
    truth = sorted(s for p in mixture["phrases"] if p["label"] == "Bark" for s in p["segments"])
    drawn = [
        (float(b.get_attribute("data-onset")), float(b.get_attribute("data-offset")))
        for b in rows[0].find_elements("css selector", ".truth")
    ]
    assert drawn == [tuple(s) for s in truth] and rows[1].get_attribute("data-truth") == "unknown"


def test_an_uploaded_file_is_queried(browser, site, tmp_path):
    import soundfile as sf

    url, _ = site
    path = tmp_path / "beep.wav"
    sf.write(path, tone_burst(16000, 4.0, 1.0, 2.5), 16000, subtype="PCM_16")
    open_page(browser, url + "#/detect")
    browser.find_element("id", "upload-file").send_keys(str(path))
    browser.find_element("id", "upload-button").click()
    wait_for(browser, lambda d: d.find_element("id", "clip-title").text == "beep.wav", "the uploaded file's page")
    wait_for(
        browser,
        lambda d: d.execute_script("const i = document.getElementById('spectrogram'); return i.complete && i.naturalWidth > 0"),
        "its spectrogram",
    )
    browser.find_element("id", "query-input").send_keys("a beep")
    browser.find_element("id", "query-button").click()
    row = wait_for(browser, lambda d: d.find_element("css selector", ".prob-row.live"), "its probabilities")
    assert int(row.find_element("css selector", "canvas").get_attribute("data-frames")) == round(4.0 / FRAME_S)


@pytest.mark.parametrize("table", ["false-alarms", "misses"])
def test_an_evaluation_row_opens_its_mixture_at_its_second(browser, site, view_data, table):
    url, catalog = site
    evaluation = open_evaluation(view_data.evaluation)
    open_page(browser, url + "#/evaluation")
    rows = wait_for(browser, lambda d: d.find_elements("css selector", f"#{table} tbody tr"), f"the {table} table")
    per_class = browser.find_elements("css selector", "#per-class tbody tr")
    assert [r.get_attribute("data-label") for r in per_class] == evaluation.classes
    errors = evaluation.errors("trained")["false_alarms" if table == "false-alarms" else "misses"]
    row = rows[min(2, len(rows) - 1)]
    error = errors[rows.index(row)]
    assert (row.get_attribute("data-clip"), row.get_attribute("data-label")) == (error["clip"], error["class"])
    row.find_element("css selector", "a").click()
    wait_for(browser, lambda d: d.find_element("id", "clip-title").text == error["clip"], "the error's mixture")
    wait_for(
        browser,
        lambda d: abs(d.execute_script("return document.getElementById('player').currentTime") - error["onset_s"]) < 0.01,
        "the player at the error's second",
    )
    stored = wait_for(browser, lambda d: d.find_element("css selector", ".prob-row.stored"), "the stored probabilities")
    assert stored.get_attribute("data-query") == f"{split_queries(catalog, 'test')[error['class']]} (trained, evaluated)"
    truth = [(a, b) for a, b, label in evaluation.truth[error["clip"]] if label == error["class"]]
    assert [
        (float(b.get_attribute("data-onset")), float(b.get_attribute("data-offset")))
        for b in stored.find_elements("css selector", ".truth")
    ] == truth
    assert stored.get_attribute("data-truth") == str(len(truth))  # known, even when empty: the evaluation's ground truth
    canvas = stored.find_element("css selector", "canvas")
    assert int(canvas.get_attribute("data-frames")) == len(evaluation.scores("trained", error["clip"], error["class"])["probs"])
    assert wait_for(browser, lambda d: canvas_ink(d, canvas) > 100, "the stored probabilities drawn")
    playhead = browser.find_element("id", "playhead").rect
    track = browser.find_element("css selector", ".spec-row .track").rect
    duration = catalog.mixture(error["clip"])["duration_s"]
    assert playhead["x"] - track["x"] == pytest.approx(error["onset_s"] / duration * track["width"], abs=2.0)
