"""python -m bench.reporting.browser REPORT.html [--screenshot PNG [--height PX]] [--width PX] [--self-test]

report.html in a real browser: headless Chromium loads the page as a reader's would, and the check fails when
an image did not load, the console says anything (the page has no script of its own, so any message is an
error: a refused resource, a broken data URI), or a table runs past the page width. With --screenshot it saves
the whole page as a PNG. `nox -s report-browser` runs it on a real sweep's report (not in CI: it installs
Debian's chromium); before the page, it holds the check to three broken pages and a sound one, so that a check
which cannot fail never passes.

The page is probed from a copy beside it with one script added first in <head>: it listens for load errors
and, once the page has loaded, writes what it measured into the DOM, which Chromium's --dump-dom prints.
Chromium writes the page's console to stderr (--enable-logging=stderr).
"""
from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WIDTH = 1280           # a laptop's browser window, in CSS pixels
TIMEOUT_S = 120
PROBE_ID = "parbench-probe"
PROBE = """<script>
(() => {
  const errors = [];
  addEventListener("error", e => errors.push(e.target && e.target.tagName
    ? `${e.target.tagName.toLowerCase()} did not load: ${(e.target.alt || e.target.src || "").slice(0, 80)}`
    : `script error: ${e.message}`), true);
  addEventListener("load", () => {
    const page = document.documentElement.clientWidth;
    const tables = [...document.querySelectorAll("table")].map(t => ({
      head: (t.querySelector("th") || t).textContent.slice(0, 60), right: t.getBoundingClientRect().right}));
    const images = [...document.images].map(i => ({alt: i.alt, loaded: i.complete && i.naturalWidth > 0}));
    const out = document.createElement("pre");
    out.id = "PROBE_ID";
    out.textContent = JSON.stringify({page, scroll: document.documentElement.scrollWidth,
                                      height: document.documentElement.scrollHeight, tables, images, errors});
    document.body.appendChild(out);
  });
})();
</script>""".replace("PROBE_ID", PROBE_ID)
CONSOLE = re.compile(r':CONSOLE[:(]\d+\)?\] "(.*)", source: (\S*)')


def find_chromium() -> str | None:
    return next((path for name in ("chromium", "chromium-browser", "google-chrome")
                 if (path := shutil.which(name))), None)


def _chromium(browser: str, url: str, *flags: str) -> subprocess.CompletedProcess:
    # --no-sandbox: Chromium refuses to start as root with its sandbox (containers, CI machines).
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", *flags, url],
                          capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)


def measure(page: Path, browser: str, width: int = WIDTH) -> tuple[dict, list[str]]:
    """What the probe measured on `page` at `width`, and the console messages of its load."""
    text = page.read_text()
    head = text.find("<head>")
    if head < 0:
        raise ValueError(f"{page}: no <head>")
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=page.parent, prefix=".probe-") as probed:
        probed.write(text[:head + 6] + PROBE + text[head + 6:])
        probed.flush()
        proc = _chromium(browser, Path(probed.name).resolve().as_uri(), f"--window-size={width},900", "--dump-dom")
    found = re.search(rf'<pre id="{PROBE_ID}">(.*?)</pre>', proc.stdout, re.S)
    if not found:
        raise RuntimeError(f"{browser} printed no measurement (exit {proc.returncode}): {proc.stderr[-800:]}")
    console = [f"{m.group(1)} ({Path(m.group(2)).name})" for m in CONSOLE.finditer(proc.stderr)]
    return json.loads(html.unescape(found.group(1))), console


def problems(measured: dict, console: list[str]) -> list[str]:
    """Why a reader would not see the page as written; empty when they would."""
    found = [f"image {i['alt']!r} did not load" for i in measured["images"] if not i["loaded"]]
    found += [f"console: {line}" for line in console]
    found += [e for e in measured["errors"] if not e.startswith("img ")]  # an image is already named above
    page = measured["page"]
    found += [f"table {t['head']!r}... ends at {t['right']:.0f} px, past the page width {page} px"
              for t in measured["tables"] if t["right"] > page + 0.5]
    if measured["scroll"] > page and not any("table" in p for p in found):
        found.append(f"the page scrolls sideways: {measured['scroll']} px wide in a {page} px window")
    return found


def screenshot(page: Path, png: Path, browser: str, width: int, height: int) -> None:
    proc = _chromium(browser, page.resolve().as_uri(), f"--window-size={width},{height}",
                     f"--screenshot={png.resolve()}")
    if not png.is_file():
        raise RuntimeError(f"{browser} wrote no screenshot (exit {proc.returncode}): {proc.stderr[-800:]}")


BROKEN_PAGES = {
    "an image that does not load": '<img alt="missing" src="data:image/png;base64,AAAA">',
    "a console error": "<script>console.error('broken')</script>",
    "a table wider than the page": f'<table><tr><th>wide</th><td><div style="width:{2 * WIDTH}px">x</div></td></tr>'
                                   "</table>",
}


def self_test(browser: str, folder: Path) -> list[str]:
    """The check against pages with one fault each, and a sound one: what it failed to see or saw wrongly."""
    failures = []
    pages = {**BROKEN_PAGES, "nothing": "<table><tr><th>fine</th></tr></table>"}
    for index, (fault, body) in enumerate(pages.items()):
        page = folder / f"self-test-{index}.html"
        page.write_text(f"<!DOCTYPE html><html><head><title>t</title></head><body>{body}</body></html>")
        found = problems(*measure(page, browser))
        if (fault == "nothing") == bool(found):
            failures.append(f"a page with {fault}: the check found {found or 'nothing'}")
    return failures


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench.reporting.browser", description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path, help="the report.html to check")
    parser.add_argument("--screenshot", type=Path, metavar="PNG", help="save the whole page here")
    parser.add_argument("--height", type=int, metavar="PX", help="with --screenshot: its top PX pixels only "
                        "(default: the whole page)")
    parser.add_argument("--width", type=int, default=WIDTH, help=f"window width in pixels (default {WIDTH})")
    parser.add_argument("--self-test", action="store_true", help="first hold the check to broken pages")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    browser = find_chromium()
    if browser is None:
        parser.error("no chromium on PATH (nox -s report-browser installs Debian's)")
    if not args.page.is_file():
        parser.error(f"no page {args.page}")
    if args.height is not None and not args.screenshot:
        parser.error("--height needs --screenshot")
    if args.self_test:
        with tempfile.TemporaryDirectory() as folder:
            failures = self_test(browser, Path(folder))
        if failures:
            print("bench.reporting.browser: the check itself is broken:\n  " + "\n  ".join(failures), file=sys.stderr)
            return 1
        print(f"self-test: {len(BROKEN_PAGES)} broken pages caught, a sound one passed")
    measured, console = measure(args.page, browser, args.width)
    found = problems(measured, console)
    if args.screenshot:
        height = min(args.height or measured["height"], measured["height"])
        screenshot(args.page, args.screenshot, browser, args.width, height)
        print(f"screenshot: {args.screenshot} ({args.width} x {height} px of {measured['height']})")
    version = subprocess.run([browser, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"{args.page}: {len(measured['images'])} images, {len(measured['tables'])} tables at {args.width} px "
          f"in {version}: " + ("no problem" if not found else f"{len(found)} problem(s)"))
    for problem in found:
        print(f"  {problem}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
