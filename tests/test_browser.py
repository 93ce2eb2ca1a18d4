"""bench.reporting.browser without a browser: the command lines it gives Chromium, the page it probes, what it
reads back from Chromium's output, the problems it names and the refusals of its command line. Chromium itself
is `nox -s report-browser`'s (not in CI); here subprocess.run stands in for it and answers as Chromium does."""
from __future__ import annotations

import html
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.reporting import browser
from bench.reporting.browser import PROBE, problems

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]
SOUND = {"page": 1265, "scroll": 1265, "height": 4000, "tables": [{"head": "layout", "right": 900.0}],
         "images": [{"alt": "cnn: throughput", "loaded": True}], "errors": []}
# Chromium's console lines on stderr, in the two forms its versions write.
CONSOLE_ERR = ('[12:12:1128/101010.1:INFO:CONSOLE(3)] "Uncaught ReferenceError: x is not defined", '
               'source: file:///tmp/r/.probe-abc.html (3)\n'
               '[12:12:1128/101010.2:INFO:CONSOLE:7] "broken", source: file:///tmp/r/report.html (7)\n')


class FakeChromium:
    """subprocess.run as Chromium answers it: each call's arguments kept, the probe's measurement printed by
    --dump-dom, the PNG written by --screenshot."""

    def __init__(self, measured: dict | None = None, stderr: str = "", returncode: int = 0, writes_png: bool = True,
                 version: str = "Chromium 131.0.6778.85 built on Debian"):
        self.measured, self.stderr, self.returncode = measured, stderr, returncode
        self.writes_png, self.version = writes_png, version
        self.calls: list[tuple[list, dict]] = []
        self.probed: list[tuple[Path, str]] = []  # the page Chromium was given to probe, and its text then

    def __call__(self, argv, **kwargs):
        self.calls.append((list(argv), kwargs))
        if argv[1:] == ["--version"]:
            return SimpleNamespace(stdout=f"{self.version}\n", stderr="", returncode=0)
        if "--dump-dom" in argv:
            path = Path(argv[-1].removeprefix("file://"))
            self.probed.append((path, path.read_text()))
            pre = "" if self.measured is None else \
                f'<pre id="parbench-probe">{html.escape(json.dumps(self.measured, indent=1))}</pre>'
            return SimpleNamespace(stdout=f"<html><head></head><body><p>x</p>{pre}</body></html>",
                                   stderr=self.stderr, returncode=self.returncode)
        [shot] = [a for a in argv if a.startswith("--screenshot=")]
        if self.writes_png:
            Path(shot.removeprefix("--screenshot=")).write_bytes(b"\x89PNG\r\n\x1a\n")
        return SimpleNamespace(stdout="", stderr=self.stderr, returncode=self.returncode)


@pytest.fixture
def page(tmp_path) -> Path:
    page = tmp_path / "report.html"
    page.write_text('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>r</title></head>'
                    "<body><p>body</p></body></html>\n")
    return page


def test_find_chromium_takes_the_first_of_its_names_on_the_path(monkeypatch):
    on_path = {"chromium-browser": "/snap/bin/chromium-browser", "google-chrome": "/opt/google/chrome"}
    monkeypatch.setattr(browser.shutil, "which", on_path.get)
    assert browser.find_chromium() == "/snap/bin/chromium-browser"
    monkeypatch.setattr(browser.shutil, "which", {"google-chrome": "/opt/google/chrome"}.get)
    assert browser.find_chromium() == "/opt/google/chrome"
    monkeypatch.setattr(browser.shutil, "which", {**on_path, "chromium": "/usr/bin/chromium"}.get)
    assert browser.find_chromium() == "/usr/bin/chromium"
    monkeypatch.setattr(browser.shutil, "which", {}.get)
    assert browser.find_chromium() is None


def test_measure_probes_a_copy_beside_the_page_and_reads_back_its_measurement(monkeypatch, page):
    chromium = FakeChromium(SOUND, stderr=CONSOLE_ERR)
    monkeypatch.setattr(browser.subprocess, "run", chromium)
    measured, console = browser.measure(page, CHROMIUM, 1000)
    assert measured == SOUND
    # Each message once, with the file it came from (not the whole URL).
    assert console == ["Uncaught ReferenceError: x is not defined (.probe-abc.html)", "broken (report.html)"]
    [(argv, kwargs)] = chromium.calls
    [(probed, text)] = chromium.probed
    assert argv == [CHROMIUM, *FLAGS, "--window-size=1000,900", "--dump-dom", probed.as_uri()]
    assert kwargs == {"capture_output": True, "text": True, "timeout": 120, "stdin": subprocess.DEVNULL}
    # The copy: beside the page (its relative links still resolve), hidden, the probe first in <head>.
    assert probed.parent == page.parent and probed.name.startswith(".probe-") and probed.suffix == ".html"
    original = page.read_text()
    head = original.index("<head>") + len("<head>")
    assert text == original[:head] + PROBE + original[head:]
    assert not probed.exists()  # and gone afterwards
    assert [p.name for p in page.parent.iterdir()] == ["report.html"]


def test_measure_at_the_default_width_and_a_head_at_the_first_character(monkeypatch, tmp_path):
    page = tmp_path / "bare.html"
    page.write_text("<head><title>t</title></head><body><p>a <code>&lt;head&gt;</code></p><head></head></body>")
    chromium = FakeChromium(SOUND)
    monkeypatch.setattr(browser.subprocess, "run", chromium)
    assert browser.measure(page, CHROMIUM) == (SOUND, [])
    assert "--window-size=1280,900" in chromium.calls[0][0]
    [(_, text)] = chromium.probed
    assert text == "<head>" + PROBE + page.read_text()[6:]  # the first <head>, not the last


def test_measure_refuses_a_page_without_head_and_says_what_chromium_said(monkeypatch, page, tmp_path):
    headless = tmp_path / "bare.html"
    headless.write_text("<html><body>no head</body></html>")
    monkeypatch.setattr(browser.subprocess, "run", FakeChromium(SOUND))
    with pytest.raises(ValueError, match=r"^" + str(headless) + ": no <head>$"):
        browser.measure(headless, CHROMIUM)
    stderr = "x" * 100 + "y" * 800
    monkeypatch.setattr(browser.subprocess, "run", FakeChromium(None, stderr=stderr, returncode=21))
    with pytest.raises(RuntimeError) as error:
        browser.measure(page, CHROMIUM)
    assert str(error.value) == f"{CHROMIUM} printed no measurement (exit 21): {'y' * 800}"


def test_problems_names_each_fault_once_and_a_sound_page_none():
    assert problems(SOUND, []) == []
    measured = {"page": 1265, "scroll": 2600, "height": 900,
                "tables": [{"head": "fine", "right": 1265.5}, {"head": "wide", "right": 2580.4},
                           {"head": "just", "right": 1265.6}],
                "images": [{"alt": "ok", "loaded": True}, {"alt": "missing", "loaded": False}],
                "errors": ["img did not load: missing", "script error: boom", "link did not load: x.css"]}
    assert problems(measured, ["broken (report.html)"]) == [
        "image 'missing' did not load", "console: broken (report.html)", "script error: boom",
        "link did not load: x.css",
        "table 'wide'... ends at 2580 px, past the page width 1265 px",
        "table 'just'... ends at 1266 px, past the page width 1265 px"]
    # No table to blame: the page itself is too wide.
    wide = {**SOUND, "scroll": 1266}
    assert problems(wide, []) == ["the page scrolls sideways: 1266 px wide in a 1265 px window"]
    assert problems({**SOUND, "scroll": 1265}, []) == []
    # A wide table explains the scroll: said once.
    assert problems({**wide, "tables": [{"head": "t", "right": 1300}]}, []) == [
        "table 't'... ends at 1300 px, past the page width 1265 px"]
    # Other problems do not: the scroll is still said.
    assert problems({**wide, "errors": ["script error: y"]}, []) == [
        "script error: y", "the page scrolls sideways: 1266 px wide in a 1265 px window"]


def test_screenshot_gives_chromium_the_page_size_and_fails_without_a_png(monkeypatch, page, tmp_path):
    chromium = FakeChromium()
    monkeypatch.setattr(browser.subprocess, "run", chromium)
    png = tmp_path / "shot.png"
    browser.screenshot(page, png, CHROMIUM, 1000, 2400)
    [(argv, kwargs)] = chromium.calls
    assert argv == [CHROMIUM, *FLAGS, "--window-size=1000,2400", f"--screenshot={png}", page.as_uri()]
    assert kwargs["timeout"] == 120 and png.read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setattr(browser.subprocess, "run", FakeChromium(writes_png=False, stderr="a" + "b" * 800,
                                                                returncode=1))
    with pytest.raises(RuntimeError) as error:
        browser.screenshot(page, tmp_path / "none.png", CHROMIUM, 1000, 2400)
    assert str(error.value) == f"{CHROMIUM} wrote no screenshot (exit 1): {'b' * 800}"


def _measure_as(seen: dict):
    """measure() of a check that finds, on each self-test page, what `seen` maps its body's first tag to."""
    calls = []

    def measure(page, chromium, width=browser.WIDTH):
        text = page.read_text()
        calls.append((page, chromium, width, text))
        body = text.split("<body>")[1]
        return {**SOUND, "images": [], "tables": [], "errors": seen.get(body.split(">")[0] + ">", [])}, []
    return measure, calls


def test_self_test_writes_one_page_per_fault_and_a_sound_one(monkeypatch, tmp_path):
    sees_all = {'<img alt="missing" src="data:image/png;base64,AAAA">': ["img"], "<script>": ["console"],
                "<table>": []}
    measure, calls = _measure_as(sees_all)
    monkeypatch.setattr(browser, "measure", measure)
    # A check that misses the wide table, and then one that sees a fault in the sound page.
    assert browser.self_test(CHROMIUM, tmp_path) == [
        "a page with a table wider than the page: the check found nothing"]
    assert [(p, c, w) for p, c, w, _ in calls] == [(tmp_path / f"self-test-{i}.html", CHROMIUM, 1280)
                                                   for i in range(4)]
    bodies = [*browser.BROKEN_PAGES.values(), "<table><tr><th>fine</th></tr></table>"]
    assert [text for *_, text in calls] == [
        f"<!DOCTYPE html><html><head><title>t</title></head><body>{body}</body></html>" for body in bodies]
    measure, _ = _measure_as({**sees_all, "<table>": ["table"]})
    monkeypatch.setattr(browser, "measure", measure)
    assert browser.self_test(CHROMIUM, tmp_path) == ["a page with nothing: the check found ['table']"]


def test_the_broken_pages_each_hold_one_fault():
    assert browser.BROKEN_PAGES == {
        "an image that does not load": '<img alt="missing" src="data:image/png;base64,AAAA">',
        "a console error": "<script>console.error('broken')</script>",
        "a table wider than the page": '<table><tr><th>wide</th><td><div style="width:2560px">x</div></td></tr>'
                                       "</table>"}


def test_help_says_what_each_option_does(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as stop:
        browser.main(["--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == (
        "usage: bench.reporting.browser [-h] [--screenshot PNG] [--height PX] [--width WIDTH] [--self-test] page\n"
        "\n"
        "python -m bench.reporting.browser REPORT.html [--screenshot PNG [--height PX]] [--width PX] [--self-test]\n"
        "\n"
        "positional arguments:\n"
        "  page              the report.html to check\n"
        "\n"
        "options:\n"
        "  -h, --help        show this help message and exit\n"
        "  --screenshot PNG  save the whole page here\n"
        "  --height PX       with --screenshot: its top PX pixels only (default: the whole page)\n"
        "  --width WIDTH     window width in pixels (default 1280)\n"
        "  --self-test       first hold the check to broken pages\n")


def test_the_command_line_parses_to_paths_and_pixels():
    args = browser.build_parser().parse_args(["r/report.html", "--screenshot", "r/shot.png", "--height", "900",
                                              "--width", "1000", "--self-test"])
    assert vars(args) == {"page": Path("r/report.html"), "screenshot": Path("r/shot.png"), "height": 900,
                          "width": 1000, "self_test": True}
    assert vars(browser.build_parser().parse_args(["report.html"])) == {
        "page": Path("report.html"), "screenshot": None, "height": None, "width": 1280, "self_test": False}


@pytest.mark.parametrize("argv,chromium,error", [
    (["{page}"], None, "no chromium on PATH (nox -s report-browser installs Debian's)"),
    (["{page}.missing"], CHROMIUM, "no page {page}.missing"),
    (["{page}", "--height", "500"], CHROMIUM, "--height needs --screenshot"),
])
def test_main_refuses_with_one_line_and_runs_no_browser(monkeypatch, capsys, page, argv, chromium, error):
    fake = FakeChromium(SOUND)
    monkeypatch.setattr(browser.subprocess, "run", fake)
    monkeypatch.setattr(browser, "find_chromium", lambda: chromium)
    with pytest.raises(SystemExit) as stop:
        browser.main([a.format(page=page) for a in argv])
    assert stop.value.code == 2 and fake.calls == []
    assert capsys.readouterr().err.splitlines()[-1] == f"bench.reporting.browser: error: {error.format(page=page)}"


def test_main_measures_the_page_and_says_its_problems(monkeypatch, capsys, page):
    monkeypatch.setattr(browser, "find_chromium", lambda: CHROMIUM)
    chromium = FakeChromium(SOUND)
    monkeypatch.setattr(browser.subprocess, "run", chromium)
    assert browser.main([str(page), "--width", "1000"]) == 0
    assert chromium.calls[0][0][:-1] == [CHROMIUM, *FLAGS, "--window-size=1000,900", "--dump-dom"]
    assert capsys.readouterr().out == (f"{page}: 1 images, 1 tables at 1000 px in Chromium 131.0.6778.85 built "
                                       "on Debian: no problem\n")
    broken = {**SOUND, "images": [{"alt": "a", "loaded": False}, {"alt": "b", "loaded": True}], "tables": []}
    chromium = FakeChromium(broken, stderr=CONSOLE_ERR)
    monkeypatch.setattr(browser.subprocess, "run", chromium)
    assert browser.main([str(page)]) == 1
    assert capsys.readouterr().out == (
        f"{page}: 2 images, 0 tables at 1280 px in Chromium 131.0.6778.85 built on Debian: 3 problem(s)\n"
        "  image 'a' did not load\n  console: Uncaught ReferenceError: x is not defined (.probe-abc.html)\n"
        "  console: broken (report.html)\n")
    assert chromium.calls[-1] == ([CHROMIUM, "--version"], {"capture_output": True, "text": True})


@pytest.mark.parametrize("height,shot", [(None, 4000), (900, 900), (5000, 4000)])
def test_main_screenshots_at_most_the_whole_page(monkeypatch, capsys, page, tmp_path, height, shot):
    monkeypatch.setattr(browser, "find_chromium", lambda: CHROMIUM)
    chromium = FakeChromium(SOUND)
    monkeypatch.setattr(browser.subprocess, "run", chromium)
    png = tmp_path / "shot.png"
    argv = [str(page), "--screenshot", str(png), "--width", "1100"] + (["--height", str(height)] if height else [])
    assert browser.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"screenshot: {png} (1100 x {shot} px of 4000)"
    assert chromium.calls[1][0] == [CHROMIUM, *FLAGS, f"--window-size=1100,{shot}", f"--screenshot={png}",
                                    page.as_uri()]
    assert png.is_file()


def test_main_self_test_holds_the_check_first(monkeypatch, capsys, page):
    monkeypatch.setattr(browser, "find_chromium", lambda: CHROMIUM)
    folders = []

    def self_test(chromium, folder):
        assert chromium == CHROMIUM and folder.is_dir()
        folders.append(folder)
        return failures

    monkeypatch.setattr(browser, "self_test", self_test)
    monkeypatch.setattr(browser.subprocess, "run", FakeChromium(SOUND))
    failures = []
    assert browser.main([str(page), "--self-test"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "self-test: 3 broken pages caught, a sound one passed"
    assert not folders[0].exists()  # a temporary folder, gone afterwards
    failures = ["a page with a console error: the check found nothing", "a page with nothing: the check found x"]
    chromium = FakeChromium(SOUND)
    monkeypatch.setattr(browser.subprocess, "run", chromium)
    assert browser.main([str(page), "--self-test"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and chromium.calls == []  # the page is not measured by a broken check
    assert captured.err == ("bench.reporting.browser: the check itself is broken:\n"
                            "  a page with a console error: the check found nothing\n"
                            "  a page with nothing: the check found x\n")
