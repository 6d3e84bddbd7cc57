"""Pictures of ``sedsynth view``'s pages for the documentation, taken in headless Chromium.

    python -m sedsynth.view.screenshots --overrides configs/debug.yaml --out docs/images

Input: the params (with overrides) of a run that has its shards, evaluation and checkpoint (the
debug run: ``sedsynth pipeline --overrides configs/debug.yaml``), Chromium and chromedriver,
and selenium (the ``test`` extra). Output: ``view-dataset.png``, ``view-mixture.png``,
``view-evaluation.png`` and ``view-error.png`` (an evaluation error opened) in ``--out``. The server runs on a free local port
for as long as the pictures take.
"""

from __future__ import annotations

import argparse
import io
import shutil
import time
from pathlib import Path

WIDTH = 1400


def _wait(driver, script: str, timeout_s: float = 30.0) -> None:
    """Poll ``script`` (JavaScript returning a truthy value when ready) for at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if driver.execute_script(script):
            return
        time.sleep(0.1)
    raise TimeoutError(f"the page did not get ready: {script}")


def _shoot(driver, path: Path) -> None:
    """The whole page, as tall as its content, into ``path``."""
    height = driver.execute_script("return Math.ceil(document.documentElement.scrollHeight)")
    driver.set_window_size(WIDTH, min(max(height, 400), 2400))
    time.sleep(0.3)  # the canvases redraw at the new size
    from PIL import Image

    shot = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB")
    shot.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(
        path, optimize=True
    )  # a third of the bytes, no visible change
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument(
        "--overrides", action="append", default=None, help="a YAML merged over --params (e.g. configs/debug.yaml)"
    )
    parser.add_argument("--out", default="docs/images", help="folder for the pictures (default docs/images)")
    parser.add_argument("--mixture", default=None, help="the mixture to show (default: the first of the evaluated split)")
    args = parser.parse_args(argv)

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from pipeline.config.params import merge, read_yaml_mapping
    from sedsynth.view.catalog import open_catalog
    from sedsynth.view.evaluation import open_evaluation
    from sedsynth.view.server import make_app, running
    from trainer.config import load_params

    overrides: dict = {}
    for path in args.overrides or []:
        overrides = merge(overrides, read_yaml_mapping(path, "overrides file"))
    params = load_params(args.params, overrides)
    catalog = open_catalog(params.shards.out_dir)
    evaluation = open_evaluation(params.evaluate.out_dir)
    mixture = args.mixture or sorted(evaluation.durations)[0]
    phrases = [p["phrase"] for p in catalog.mixture(mixture)["phrases"]][:3]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("google-chrome")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size={WIDTH},900",
        "--force-device-scale-factor=1",
        "--mute-audio",
    ):
        options.add_argument(flag)
    app = make_app(catalog, evaluation, params.evaluate.checkpoint, params.evaluate, device="cpu")
    with running(app) as url:
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        try:
            driver.get(url + "#/?split=test")
            _wait(driver, "return document.querySelectorAll('#mixtures tbody tr').length > 0")
            _shoot(driver, out / "view-dataset.png")

            driver.get(url + f"#/mix/{mixture}?t=2.5&q=" + "%3B".join(p.replace(" ", "%20") for p in phrases))
            _wait(
                driver,
                "const i = document.getElementById('spectrogram'); return i && i.complete && i.naturalWidth > 0 "
                "&& document.querySelectorAll('.prob-row.live').length > 0",
            )
            _shoot(driver, out / "view-mixture.png")

            driver.get(url + "#/evaluation")
            _wait(driver, "return document.querySelector('#misses tbody tr, #false-alarms tbody tr') !== null")
            _shoot(driver, out / "view-evaluation.png")

            driver.execute_script("document.querySelector('#misses tbody tr a, #false-alarms tbody tr a').click()")
            _wait(driver, "const c = document.querySelector('.prob-row.stored canvas'); return c && c.width > 1")
            _shoot(driver, out / "view-error.png")
        finally:
            driver.quit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
