"""The rendered book, opened in headless Chromium.

For every page listed in ``_toc.yml``, in a 1400 px wide window: the page loads, has an ``<h1>``, every
image on it decodes, every formula is typeset by MathJax (served by the site itself), nothing runs off the
window unless it scrolls in its own box, the console shows no errors, every figure that its notebook
declares is on the page, and nothing is fetched from another host. The browser is offline: every off-site request
is answered locally with an empty 200 response and recorded.

Needs the built book (``make book``) and Debian's ``chromium`` (``make browser-deps``); the browser is
driven by the ``playwright`` package (no ``playwright install``: the system Chromium is used).
``BOOTENS_BOOK_ROOT`` points the test at another checkout (a directory holding ``_toc.yml`` and
``_build/html``); by default it is this repository.
"""

from __future__ import annotations

import functools
import http.server
import json
import mimetypes
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

pytestmark = pytest.mark.browser

BOOK_ROOT = Path(os.environ.get("BOOTENS_BOOK_ROOT", Path(__file__).resolve().parents[2])).resolve()
HTML_DIR = BOOK_ROOT / "_build" / "html"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Off-site hosts a page may request (the request is still answered locally, with an empty response). None:
# the theme's fonts and scripts are local, and MathJax is served from the site (sphinx-mathjax-offline).
ALLOWED_OFFSITE: set[str] = set()

# Width of the browser window: a laptop screen. No page may need horizontal scrolling at this width.
VIEWPORT = {"width": 1400, "height": 900}

# BOOTENS_SCREENSHOTS=DIR saves a full-page PNG of every page there (DIR/<docname>.png), taken after the
# math is typeset: what a reader sees, for looking at every page before a release.
SCREENSHOT_DIR = os.environ.get("BOOTENS_SCREENSHOTS")

# Content type of the empty stand-in response, by Playwright resource type.
_STUB_TYPES = {
    "script": "application/javascript",
    "stylesheet": "text/css",
    "font": "font/woff2",
    "image": "image/png",
    "document": "text/html",
    "fetch": "application/json",
    "xhr": "application/json",
}


def _toc_docnames(toc_path: Path) -> list[str]:
    """Every document of a jb-book ``_toc.yml`` (root, parts, chapters, nested sections), in order."""
    toc = yaml.safe_load(toc_path.read_text())
    names = [toc["root"]]

    def walk(entries: list[dict]) -> None:
        for entry in entries or []:
            if "file" in entry:
                names.append(entry["file"])
            if "glob" in entry:
                found = sorted(
                    p.relative_to(BOOK_ROOT).with_suffix("").as_posix()
                    for p in BOOK_ROOT.glob(entry["glob"] + ".*")
                    if p.suffix in {".md", ".ipynb"}
                )
                names.extend(found)
            walk(entry.get("chapters", []))
            walk(entry.get("sections", []))

    walk(toc.get("parts", []))
    walk(toc.get("chapters", []))
    return [str(Path(n).with_suffix("")) if n.endswith((".md", ".ipynb")) else n for n in names]


def _declared_figures(docname: str) -> tuple[bool, list[str]]:
    """For a notebook page: whether any stored output is a PNG, and the names of its ``mystnb`` figures."""
    source = BOOK_ROOT / f"{docname}.ipynb"
    if not source.exists():
        return False, []
    nb = json.loads(source.read_text())
    has_png = False
    names = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        figure = (cell.get("metadata", {}).get("mystnb") or {}).get("figure") or {}
        if figure.get("name"):
            names.append(figure["name"])
        has_png |= any("image/png" in out.get("data", {}) for out in cell.get("outputs", []))
    return has_png, names


DOCNAMES = _toc_docnames(BOOK_ROOT / "_toc.yml")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """Serve ``_build/html`` on 127.0.0.1 (a free port) from a thread; yield the base URL."""
    if not (HTML_DIR / "index.html").exists():
        pytest.fail(f"no built book at {HTML_DIR}: run `make book` first", pytrace=False)
    handler = functools.partial(_QuietHandler, directory=str(HTML_DIR))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium driven by Playwright; skipped where it is missing, except in CI."""
    missing = None
    if not CHROMIUM.exists():
        missing = f"{CHROMIUM} not found (Debian: apt-get install chromium, or `make browser-deps`)"
    else:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError as exc:  # the `test` extra installs it
            missing = f"the playwright package is not installed ({exc})"
    if missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(missing, pytrace=False)
        pytest.skip(missing)
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


class PageVisit:
    """One page opened in a fresh, offline browser context, with everything it did recorded."""

    def __init__(self, browser, site: str, path: str) -> None:
        self.local_host = urlsplit(site).netloc
        self.offsite: list[str] = []
        self.errors: list[str] = []
        self.context = browser.new_context(viewport=VIEWPORT)
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        self.page.on("response", self._response)
        self.page.on("requestfailed", self._request_failed)
        self.response = self.page.goto(f"{site}/{path}", wait_until="load", timeout=60_000)
        self.page.wait_for_load_state("networkidle", timeout=60_000)

    def _route(self, route) -> None:
        request = route.request
        parts = urlsplit(request.url)
        if parts.scheme in {"http", "https"} and parts.netloc != self.local_host:
            self.offsite.append(request.url)
            content_type = _STUB_TYPES.get(request.resource_type)
            if content_type is None:
                content_type = mimetypes.guess_type(parts.path)[0] or "application/octet-stream"
            route.fulfill(status=200, body=b"", content_type=content_type)
        else:
            route.continue_()

    def _console(self, message) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text} ({message.location.get('url', '')})")

    def _response(self, response) -> None:
        if urlsplit(response.url).netloc == self.local_host and response.status >= 400:
            self.errors.append(f"HTTP {response.status}: {response.url}")

    def _request_failed(self, request) -> None:
        self.errors.append(f"request failed: {request.url} ({request.failure})")

    def images(self) -> list[dict]:
        """Every <img>: forced to load (no lazy loading), decoded, then its state."""
        return self.page.evaluate(
            """async () => {
                const imgs = Array.from(document.images);
                for (const img of imgs) { img.loading = "eager"; }
                await Promise.all(imgs.map((img) => img.decode().catch(() => null)));
                return imgs.map((img) => ({
                    src: img.currentSrc || img.src,
                    complete: img.complete,
                    naturalWidth: img.naturalWidth,
                    inFigure: img.closest("figure") !== null,
                }));
            }"""
        )

    def typeset_math(self) -> dict:
        """Wait for MathJax to finish (where the page loads it); count the math elements and the typeset ones.

        Sphinx writes each formula as an element of class ``math`` holding its TeX; MathJax replaces the TeX
        by an ``mjx-container``. ``raw`` lists (the start of) the formulas still shown as TeX.
        """
        return self.page.evaluate(
            """async () => {
                if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
                    await MathJax.startup.promise;
                }
                const maths = Array.from(document.querySelectorAll(".math"));
                const raw = maths.filter((el) => el.querySelector("mjx-container") === null)
                    .map((el) => el.textContent.trim().slice(0, 60));
                return {n: maths.length, raw: raw, mathjax: !!(window.MathJax && MathJax.version)};
            }"""
        )

    def overflow(self) -> list[str]:
        """What does not fit the window: the page itself, a table wider than the box it sits in (the reader
        would have to scroll sideways to see its last columns), an image or code block that runs off the
        window without a box of its own to scroll in."""
        return self.page.evaluate(
            r"""() => {
                const width = document.documentElement.clientWidth;
                const out = [];
                if (document.documentElement.scrollWidth > width + 1) {
                    out.push(`the page is ${document.documentElement.scrollWidth} px wide (window ${width} px)`);
                }
                const scrollerOf = (el) => {
                    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
                        if (["auto", "scroll"].includes(getComputedStyle(p).overflowX)) { return p; }
                    }
                    return null;
                };
                for (const table of document.querySelectorAll("main table")) {
                    const box = table.getBoundingClientRect();
                    const scroller = scrollerOf(table);
                    const room = scroller ? scroller.clientWidth : width - Math.max(box.left, 0);
                    if (box.width > room + 1) {
                        const head = table.innerText.replace(/\s+/g, " ").trim().slice(0, 60);
                        out.push(`table (${head}) is ${Math.round(box.width)} px wide in ${Math.round(room)} px`);
                    }
                }
                for (const el of document.querySelectorAll("main img, main pre")) {
                    const box = el.getBoundingClientRect();
                    if (box.width > 0 && box.right > width + 1 && scrollerOf(el) === null) {
                        out.push(`${el.tagName.toLowerCase()} ends at ${Math.round(box.right)} px`);
                    }
                }
                return out;
            }"""
        )

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def visit(browser, site):
    opened: list[PageVisit] = []

    def open_page(path: str) -> PageVisit:
        opened.append(PageVisit(browser, site, path))
        return opened[-1]

    yield open_page
    for page_visit in opened:
        page_visit.close()


def test_toc_lists_pages():
    assert len(DOCNAMES) >= 2, f"_toc.yml lists {DOCNAMES}"
    for docname in DOCNAMES:
        sources = [BOOK_ROOT / f"{docname}{ext}" for ext in (".md", ".ipynb")]
        assert any(p.exists() for p in sources), f"_toc.yml lists {docname}, which has no .md or .ipynb"


def test_the_estimators_methods_are_on_the_api_page():
    """save and load, which the estimators inherit from their base class, are documented with the rest, and
    scikit-learn's plumbing is not."""
    html = (HTML_DIR / "book" / "api.html").read_text()
    for cls in ("BootstrapEnsembleRegressor", "BootstrapEnsembleClassifier"):
        for method in ("fit", "predict", "save", "load"):
            assert f'id="bootens_core.estimators.{cls}.{method}"' in html, (cls, method)
    assert 'id="bootens_core.estimators.BootstrapEnsembleRegressor.set_params"' not in html


@pytest.mark.parametrize("docname", DOCNAMES)
def test_page_renders(visit, docname):
    path = f"{docname}.html"
    assert (HTML_DIR / path).exists(), f"{path} is not in {HTML_DIR}: is the build stale? (`make book`)"
    page = visit(path)

    status = page.response.status if page.response is not None else None
    assert page.response is not None and page.response.ok, f"{path}: HTTP {status}"
    assert page.page.locator("h1").count() >= 1, f"{path} has no <h1>"

    images = page.images()
    broken = [img["src"] for img in images if not (img["complete"] and img["naturalWidth"] > 0)]
    assert not broken, f"{path}: images that do not decode: {broken}"

    has_png, figure_names = _declared_figures(docname)
    if has_png or figure_names:
        assert any(img["naturalWidth"] > 0 for img in images), (
            f"{path}: its notebook has figure outputs, the page shows no image"
        )
    for name in figure_names:
        n_img = page.page.evaluate(
            """(ids) => {
                for (const id of ids) {
                    const el = document.getElementById(id);
                    if (el) { return el.querySelectorAll("img").length; }
                }
                return -1;
            }""",
            _figure_ids(name),
        )
        assert n_img != -1, f"{path}: figure {name!r} (mystnb metadata) is not on the page"
        assert n_img >= 1, f"{path}: figure {name!r} has no image (drawn with the Agg backend?)"

    if (BOOK_ROOT / f"{docname}.ipynb").exists():  # a chapter: its Colab button, not its install cell
        colab = f"https://colab.research.google.com/github/bootens/bootens/blob/main/{docname}.ipynb"
        assert page.page.locator(f'a[href="{colab}"]').count() >= 1, f"{path}: no launch button to {colab}"
        assert "google.colab" not in page.page.content(), f"{path} shows the Colab install cell"

    math = page.typeset_math()
    if math["n"]:
        assert math["mathjax"], f"{path}: {math['n']} formulas and MathJax did not load"
        assert not math["raw"], f"{path}: {len(math['raw'])} of {math['n']} formulas shown as raw TeX: {math['raw'][:5]}"

    wide = page.overflow()
    assert not wide, f"{path}: content runs off a {VIEWPORT['width']} px window: {wide[:5]}"

    if SCREENSHOT_DIR:
        shot = Path(SCREENSHOT_DIR) / f"{docname}.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.page.screenshot(path=str(shot), full_page=True)

    assert not page.errors, f"{path}: errors in the browser:\n" + "\n".join(page.errors)

    hosts = {urlsplit(url).netloc for url in page.offsite}
    unexpected = sorted(hosts - ALLOWED_OFFSITE)
    assert not unexpected, f"{path} requests off-site hosts {unexpected}: {page.offsite}"


def test_index_redirects_to_root(visit):
    """The site's index.html (written by sphinx-external-toc) leads to the root page of the toc."""
    page = visit("index.html")
    page.page.wait_for_url(f"**/{DOCNAMES[0]}.html", timeout=30_000)
    assert page.page.locator("h1").count() >= 1
    assert not page.errors, "\n".join(page.errors)


def _figure_ids(name: str) -> list[str]:
    """The HTML ids a figure name may get (docutils normalises explicit target names)."""
    from docutils.nodes import make_id

    return list(dict.fromkeys([name, make_id(name)]))
