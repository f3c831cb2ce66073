"""The web page of ``xinda serve`` in a real browser (headless Chromium driven by Selenium).

A ``xinda serve`` subprocess on a free loopback port serves the tiny model of the session fixture
``served_model_dir``; the page picks the model, translates a sentence (translation, n-best list
with scores, attention heat-map), shows API errors and asks for the key of a server started
with --api-key. Chromium and chromedriver come from the system (Debian: ``apt-get install
chromium chromium-driver``), with explicit paths, so Selenium Manager never runs and nothing
downloads a browser or a driver; without them the browser tests skip. The static checks at the
top run everywhere.

``XINDA_SERVE_SCREENSHOT=PATH`` saves a screenshot of the page with its translation and
heat-map (docs/serve-page.png shows the same page with a better-trained number model).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import pytest
from subprocesses import free_port, subprocess_env, xinda_command

STATIC = Path(__file__).resolve().parents[2] / "xinda" / "serve" / "static"
SENTENCE = "three thousand seven hundred ninety"
STARTUP_S = 120  # server start (imports torch, loads the model) on a busy CPU machine
WAIT_S = 60  # any one thing the page does

IDS = ("model", "source", "translate", "beam", "n-best", "output", "nbest", "heatmap", "error",
       "tab-translate", "tab-couplet", "tab-poem", "couplet-source", "couplet-go", "poem-keywords",
       "poem-acrostic", "poem-go")


# ---------------------------------------------------------------------- static checks (no browser)

class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.urls: list[str] = []
        self.charset = None
        self.lang = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "meta" and "charset" in attrs:
            self.charset = attrs["charset"]
        if tag == "html":
            self.lang = attrs.get("lang")
        for name in ("src", "href"):
            if attrs.get(name):
                self.urls.append(attrs[name])


def test_page_is_self_contained_utf8_with_stable_ids():
    page = _Page()
    page.feed((STATIC / "index.html").read_text(encoding="utf-8"))
    assert page.charset and page.charset.lower() == "utf-8"
    assert page.lang
    assert set(IDS) <= page.ids, f"missing ids: {set(IDS) - page.ids}"
    # relative URLs only: no CDN, no external fonts or scripts, works under a path prefix
    for url in page.urls:
        assert not re.match(r"^(https?:)?//", url) and not url.startswith("/"), url
    for name in ("app.js", "style.css"):
        text = (STATIC / name).read_text(encoding="utf-8")
        assert not re.search(r"https?://|@import|url\(\s*['\"]?(https?:)?//", text), name
    # CJK fallbacks in the font stack (Debian: fonts-noto-cjk, fonts-wqy-microhei)
    css = (STATIC / "style.css").read_text(encoding="utf-8")
    assert "Noto Sans CJK SC" in css and "WenQuanYi Micro Hei" in css


# ---------------------------------------------------------------------- browser, server

def _system_browser() -> tuple[str | None, str | None]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    return chromium, shutil.which("chromedriver")


@pytest.fixture(scope="module")
def driver():
    """Headless system Chromium through the system chromedriver (explicit paths: Selenium Manager
    never runs); skips when either, or Selenium, is missing."""
    chromium, chromedriver = _system_browser()
    if not chromium or not chromedriver:
        pytest.skip("browser test needs the system chromium and chromedriver "
                    "(Debian: apt-get install chromium chromium-driver); "
                    f"found chromium={chromium}, chromedriver={chromedriver}")
    webdriver = pytest.importorskip("selenium.webdriver",
                                    reason="browser test needs selenium (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # belt and braces: never fetch anything
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1100,1200", "--lang=en-US", "--disable-extensions",
                "--no-first-run", "--disable-background-networking"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    browser.set_page_load_timeout(WAIT_S)
    browser.set_script_timeout(WAIT_S)
    try:
        yield browser
    finally:
        browser.quit()


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


@contextmanager
def _serving(model_dir: Path, log_dir: Path, *options: str) -> Iterator[str]:
    """``xinda serve model_dir OPTIONS`` on a free loopback port, healthy -> its base URL (ends
    in "/"); stopped on exit."""
    port = free_port()
    log_path = log_dir / f"server-{port}.log"
    env = subprocess_env()
    base = f"http://127.0.0.1:{port}/"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*xinda_command(), "serve", str(model_dir), "--port", str(port),
                                 *options], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"xinda serve exited with {proc.returncode}:\n"
                            f"{log_path.read_text(errors='replace')}")
            try:
                if _get(base + "health").get("status") == "ok":
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"xinda serve not healthy after {STARTUP_S} s:\n"
                            f"{log_path.read_text(errors='replace')}")
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture(scope="module")
def server(served_model_dir, tmp_path_factory) -> Iterator[str]:
    """``xinda serve served_model_dir`` on a free loopback port -> its base URL."""
    with _serving(served_model_dir, tmp_path_factory.mktemp("serve-browser")) as base:
        yield base


def _open(driver, base: str):
    """Load the page and wait until it has listed the models."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(base)
    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.execute_script("return document.body.dataset.ready === 'true'"
                                   " || !document.getElementById('error').hidden"))
    error = driver.find_element("id", "error")
    assert not error.is_displayed(), f"the page shows an error on load: {error.text}"


def _js_errors(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser")
            if entry["level"] == "SEVERE" and entry.get("source") == "javascript"]


# ---------------------------------------------------------------------- tests

def test_page_translates_and_draws_the_attention_heat_map(driver, server):
    from selenium.webdriver.support.ui import Select, WebDriverWait

    models = _get(server + "v1/models")["models"]
    translate_models = [m["name"] for m in models if m["task"] == "translate"]
    assert translate_models, models
    _open(driver, server)

    # the model picker lists the translation models; task tabs only for loaded tasks
    picker = Select(driver.find_element("id", "model"))
    assert [o.get_attribute("value") for o in picker.options] == translate_models
    tasks = {m["task"] for m in models}
    assert driver.find_element("id", "tab-translate").is_displayed()
    assert driver.find_element("id", "tab-couplet").is_displayed() == ("couplet" in tasks)
    assert driver.find_element("id", "tab-poem").is_displayed() == ("poetry" in tasks)

    beam, n_best = 4, 2
    for field, value in (("beam", beam), ("n-best", n_best)):
        box = driver.find_element("id", field)
        box.clear()
        box.send_keys(str(value))
    source = driver.find_element("id", "source")
    source.clear()
    source.send_keys(SENTENCE)
    driver.find_element("id", "translate").click()

    wait = WebDriverWait(driver, WAIT_S)
    wait.until(lambda d: d.find_elements("css selector", "#nbest li")
               or d.find_element("id", "error").is_displayed())
    error = driver.find_element("id", "error")
    assert not error.is_displayed(), f"the page shows an error: {error.text}"

    # what the API answers for the same request (beam search is deterministic)
    status, expected = _post(server + "v1/translate",
                             {"model": translate_models[0], "text": SENTENCE, "beam": beam,
                              "n_best": n_best, "attention": True})
    assert status == 200, expected
    nbest = expected["translations"][0]["nbest"]
    best = nbest[0]
    assert best["text"].strip(), "the tiny model translated to nothing"

    assert driver.find_element("css selector", "#output .tgt").text == best["text"].strip()
    items = driver.find_elements("css selector", "#nbest li")
    assert len(items) == len(nbest)
    for item, hyp in zip(items, nbest):
        assert item.find_element("css selector", ".text").text == hyp["text"].strip()
        assert float(item.find_element("css selector", ".score").text) == pytest.approx(
            hyp["score"], abs=5e-4)

    # the heat-map: one row per target piece + EOS, one column per source piece + EOS, drawn
    canvas = driver.find_element("id", "heatmap")
    wait.until(lambda d: int(canvas.get_attribute("data-rows") or 0) > 0)
    assert int(canvas.get_attribute("data-rows")) == len(best["attention"]) \
        == len(best["target_pieces"]) + 1
    assert int(canvas.get_attribute("data-cols")) == len(best["attention"][0]) \
        == len(best["source_pieces"]) + 1
    assert canvas.size["width"] > 0 and canvas.size["height"] > 0
    width, height, inked, colours = driver.execute_script("""
        const c = document.getElementById('heatmap');
        const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let inked = 0; const colours = new Set();
        for (let i = 0; i < data.length; i += 4) {
            if (data[i] < 235 || data[i + 1] < 235 || data[i + 2] < 235) inked++;
            colours.add((data[i] << 16) | (data[i + 1] << 8) | data[i + 2]);
        }
        return [c.width, c.height, inked, colours.size];""")
    assert width > 0 and height > 0
    assert inked > 100, "the heat-map canvas is blank"
    assert colours > 5, "the heat-map has no shades"
    assert not _js_errors(driver)

    screenshot = os.environ.get("XINDA_SERVE_SCREENSHOT")
    if screenshot:
        driver.execute_script("window.scrollTo(0, 0)")
        Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(screenshot))


def test_page_shows_api_errors(driver, server):
    from selenium.webdriver.support.ui import WebDriverWait

    _open(driver, server)
    wait = WebDriverWait(driver, WAIT_S)
    error = driver.find_element("id", "error")

    # an empty source: the page says so instead of showing an empty translation
    driver.find_element("id", "source").clear()
    driver.find_element("id", "translate").click()
    wait.until(lambda d: error.is_displayed() and error.text.strip())
    assert "type a sentence" in error.text

    # an invalid request (beam 0; the form leaves validation to the API): the API's message
    # and code, word for word
    model = driver.find_element("id", "model").get_attribute("value")
    status, answer = _post(server + "v1/translate", {"model": model, "text": SENTENCE, "beam": 0})
    assert status == 422 and answer["error"]["code"] == "invalid_request", answer
    beam = driver.find_element("id", "beam")
    beam.clear()
    beam.send_keys("0")
    driver.find_element("id", "source").send_keys(SENTENCE)
    driver.find_element("id", "translate").click()
    wait.until(lambda d: answer["error"]["message"] in error.text)
    assert "invalid_request" in error.text and "422" in error.text, error.text
    assert not driver.find_element("id", "results").is_displayed()

    # a good request clears the error
    beam.clear()
    beam.send_keys("2")
    driver.find_element("id", "translate").click()
    wait.until(lambda d: not error.is_displayed())
    wait.until(lambda d: d.find_elements("css selector", "#nbest li"))
    assert not _js_errors(driver)


@pytest.mark.parametrize("secret", ["s3cret-key", "密钥-clé"])
def test_page_asks_for_the_api_key(driver, served_model_dir, tmp_path, secret):
    """A server with --api-key: the page says the key is missing, takes it, then works.
    Before, a non-ASCII key was a 401 (Latin-1) or "cannot reach the server" (a TypeError)."""
    from selenium.webdriver.support.ui import WebDriverWait

    with _serving(served_model_dir, tmp_path, "--api-key", secret) as base:
        driver.get(base)
        wait = WebDriverWait(driver, WAIT_S)
        error = driver.find_element("id", "error")
        wait.until(lambda d: error.is_displayed() and "unauthorized" in error.text)
        key = driver.find_element("id", "api-key")
        assert key.is_displayed()
        key.send_keys(secret)
        driver.find_element("id", "api-key-go").click()
        wait.until(lambda d: d.find_elements("css selector", "#model option"))
        assert not error.is_displayed(), error.text
        driver.find_element("id", "source").send_keys(SENTENCE)
        driver.find_element("id", "translate").click()
        wait.until(lambda d: d.find_elements("css selector", "#nbest li") or error.is_displayed())
        assert not error.is_displayed(), error.text
        driver.execute_script("sessionStorage.clear()")
        assert not _js_errors(driver)


def test_page_asks_a_sampling_model_for_samples(driver, served_model_dir, tmp_path):
    """A model whose config samples (decode.sampling): the page sends n-best as ``samples``
    and no beam. Before: it sent beam and n_best, which sampling ignored (one output); the API
    now refuses them."""
    import yaml
    from selenium.webdriver.support.ui import WebDriverWait

    model_dir = tmp_path / "sampler"
    shutil.copytree(served_model_dir, model_dir)
    config = yaml.safe_load((model_dir / "config.yaml").read_text(encoding="utf-8"))
    config["decode"]["sampling"] = True
    (model_dir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with _serving(model_dir, tmp_path) as base:
        assert _get(base + "v1/models")["models"][0]["sampling"] is True
        _open(driver, base)
        assert "samples" in driver.find_element("id", "model-info").text
        n_best = driver.find_element("id", "n-best")
        n_best.clear()
        n_best.send_keys("3")
        driver.find_element("id", "source").clear()
        driver.find_element("id", "source").send_keys(SENTENCE)
        driver.find_element("id", "translate").click()
        wait = WebDriverWait(driver, WAIT_S)
        wait.until(lambda d: d.find_elements("css selector", "#nbest li")
                   or d.find_element("id", "error").is_displayed())
        assert not driver.find_element("id", "error").is_displayed(), \
            driver.find_element("id", "error").text
        assert len(driver.find_elements("css selector", "#nbest li")) == 3
        assert not _js_errors(driver)
