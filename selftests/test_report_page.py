"""reports/conformance.html in a real browser: Debian's Chromium, headless, driven by Playwright.
The page is the one a real inner run of the suite wrote (rows run against the module's server),
opened from disk as a user opens a CI artifact. It must load without a console error, show as
many rows and verdicts as the JSON, draw a lifecycle row's requests, control calls, fates and
the pause's effect at the times the JSON recorded, and its filters must hide the rows they
should. A keep row made to fail (a proxy that turns keep into wait) must show tokens arriving
after the pause took effect, and its failure drawn at the event its checker named. Two broken pages (a row's SVG left out; a verdict count that
disagrees with the rows) must fail the same checks. Screenshots go to <report dir>/report-page/."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from vllm_rl_conformance.fixtures.checks.outcomes import VERDICTS
from vllm_rl_conformance.selftests.breaks import ABORT, KEEP, STATE
from vllm_rl_conformance.selftests.broken_server import ProxyThread
from vllm_rl_conformance.selftests.inner import run_suite

pytestmark = [pytest.mark.selftest, pytest.mark.usefixtures("rates")]

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
PX = 0.05  # how far (px) a drawn element may sit from where its recorded time puts it (rounding)
LOAD_TIMEOUT_MS = 30_000

# What the page shows of a row's timeline, read in the browser.
READ_SVG = """anchor => {
  const svg = document.querySelector(`svg.timeline[data-row="${anchor}"]`);
  if (!svg) { return null; }
  const box = svg.getBoundingClientRect();
  return {
    x0: +svg.dataset.x0, scale: +svg.dataset.scale, width: box.width, height: box.height,
    lanes: [...svg.querySelectorAll("g.lane")].map(g => ({
      name: g.dataset.name,
      strokes: [...g.querySelectorAll("path.ticks")].map(p => ({t: p.dataset.t, d: p.getAttribute("d")})),
      fate: (c => c && {cx: +c.getAttribute("cx"), t: c.dataset.t, kind: c.dataset.kind})(g.querySelector("circle.fate")),
    })),
    spans: [...svg.querySelectorAll("rect.span")].map(r => ({x: +r.getAttribute("x"), w: +r.getAttribute("width"),
                                                           call: r.dataset.call})),
    effects: [...svg.querySelectorAll("line.effect")].map(l => +l.getAttribute("x1")),
    observed: [...svg.querySelectorAll("text.observed")].map(t => ({event: +t.dataset.event, x: +t.getAttribute("x") - 3,
                                                                    kind: t.dataset.kind})),
    findings: [...svg.querySelectorAll("g.finding-at")].map(g => ({event: +g.dataset.event,
      x: +/^M([\d.]+)/.exec(g.querySelector("path.finding").getAttribute("d"))[1] + 6, title: g.textContent})),
  };
}"""


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no Chromium on this machine (Debian: apt-get install chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


class Opened:
    """A page opened from disk, with every console error and uncaught exception it raised."""

    def __init__(self, browser, path: Path):
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.goto(path.resolve().as_uri(), timeout=LOAD_TIMEOUT_MS)

    def close(self) -> None:
        self.page.close()


def check_counts(page, rep: dict) -> str:
    """The page shows every row of the report once, and each verdict as often as the JSON counts it."""
    shown = page.locator("tr.row").count()
    assert shown == len(rep["rows"]), f"the page shows {shown} rows; the report's JSON has {len(rep['rows'])}"
    for v in VERDICTS:
        rows = page.locator(f'tr.row[data-verdict="{v}"]').count()
        said = int(page.locator(f'#verdict-counts [data-verdict="{v}"]').get_attribute("data-count"))
        assert rows == said == rep["totals"][v], (
            f"verdict {v!r}: the page's header counts {said}, its table has {rows} such rows, the JSON's totals "
            f"{rep['totals'][v]}")
    return f"{shown} rows, " + ", ".join(f"{rep['totals'][v]} {v}" for v in VERDICTS if rep["totals"][v])


def check_timeline(page, row: dict) -> dict:
    """The row's SVG draws each request (its tokens, its fate), each control call and each pause
    effect at the time the JSON recorded: x = x0 + t * scale."""
    tl = row["history"]
    got = page.evaluate(READ_SVG, row["anchor"])
    assert got is not None, f"{row['id']}: the report records a timeline ({len(tl['lanes'])} requests) but the page " \
                            f"has no SVG for it"
    assert got["width"] > 0 and got["height"] > 0, f"{row['id']}: its timeline is not displayed ({got['width']} x " \
                                                   f"{got['height']} px)"

    def at(t: float) -> float:
        return got["x0"] + t * got["scale"]

    assert [lane["name"] for lane in got["lanes"]] == [lane["name"] for lane in tl["lanes"]], (
        f"{row['id']}: lanes {[lane['name'] for lane in got['lanes']]}; the JSON's requests "
        f"{[lane['name'] for lane in tl['lanes']]}")
    for drawn, lane in zip(got["lanes"], tl["lanes"]):
        times = [float(t) for s in drawn["strokes"] for t in s["t"].split()]
        xs = [float(x) for s in drawn["strokes"] for x in re.findall(r"M([\d.]+) ", s["d"])]
        assert times == lane["tokens"], f"{lane['name']}: the page's token times {times[:8]}...; the JSON's " \
                                        f"{lane['tokens'][:8]}..."
        off = [(t, x) for t, x in zip(times, xs) if abs(x - at(t)) > PX]
        assert len(xs) == len(times) and not off, f"{lane['name']}: ticks not at their times (t, x): {off[:5]}"
        fate = lane["fate"]
        assert drawn["fate"] and drawn["fate"]["kind"] == fate["kind"], f"{lane['name']}: fate mark " \
                                                                       f"{drawn['fate']}; the JSON's {fate}"
        if fate["at"] is not None:
            assert abs(drawn["fate"]["cx"] - at(fate["at"])) <= PX, (
                f"{lane['name']}: fate {fate['text']!r} drawn at x={drawn['fate']['cx']}, recorded at {fate['at']} s "
                f"(x={at(fate['at']):.2f})")
    assert [s["call"] for s in got["spans"]] == [c["call"] for c in tl["controls"]], (
        f"control spans {[s['call'] for s in got['spans']]}; the JSON's {[c['call'] for c in tl['controls']]}")
    for s, c in zip(got["spans"], tl["controls"]):
        assert abs(s["x"] - at(c["sent"])) <= PX, f"{c['call']} drawn from x={s['x']}, sent at {c['sent']} s"
        if c["answered"] is not None and c["answered"] - c["sent"] > 0.05:
            assert abs(s["x"] + s["w"] - at(c["answered"])) <= PX + 0.01, (
                f"{c['call']} drawn to x={s['x'] + s['w']}, answered at {c['answered']} s")
    effects = [m["at"] for m in tl["marks"] if m["kind"] == "pause_effect"]
    assert len(got["effects"]) == len(effects) and all(abs(x - at(t)) <= PX for x, t in zip(got["effects"], effects)), (
        f"pause-effect marks at x={got['effects']}; recorded at {effects} s")
    return got


def check_filter(page, rep: dict, facet: str, value: str) -> str:
    """Choosing `value` for `facet` hides exactly the rows without it."""
    def has(r):
        return value in r["markers"] if facet == "marker" else (r[facet] or "none") == value
    page.select_option(f'select.filter[name="{facet}"]', value)
    hidden = page.eval_on_selector_all("tr.row", "rows => rows.filter(r => r.hidden).map(r => r.id)")
    want = [r["anchor"] for r in rep["rows"] if not has(r)]
    assert sorted(hidden) == sorted(want), f"filter {facet}={value!r} hides {hidden}; it should hide {want}"
    page.select_option(f'select.filter[name="{facet}"]', "")
    return f"{facet}={value!r} hides {len(hidden)} of {len(rep['rows'])}"


def check_page(browser, path: Path, rep: dict, row: dict) -> tuple[Opened, str]:
    opened = Opened(browser, path)
    try:
        counts = check_counts(opened.page, rep)
        opened.page.click("#open-all")
        check_timeline(opened.page, row)
        assert not opened.errors, f"{path}: the page raised {opened.errors}"
    except BaseException:
        opened.close()
        raise
    return opened, counts


def inner_report(run) -> tuple[dict, Path]:
    html = run.report_dir / "conformance.html"
    assert html.exists(), f"the inner run wrote no {html}:\n{run.output[-2000:]}"
    return run.report(), html


def row_of(rep: dict, test: str) -> dict:
    return next(r for r in rep["rows"] if r["id"] == test)


@pytest.fixture(scope="module")
def real_run(server_target, tmp_path_factory):
    """A real run's report: the abort and keep rows (completions), and a row without requests."""
    out = tmp_path_factory.mktemp("report-page")
    return run_suite(server_target.url, server_target.model, [STATE, ABORT, KEEP], out, rates=server_target.rates)


def screenshots(settings) -> Path:
    d = settings.report_dir / "report-page"
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_the_report_page_shows_the_rows_verdicts_and_timelines_of_a_real_run(browser, real_run, settings,
                                                                             record_property):
    rep, html = inner_report(real_run)
    keep = row_of(rep, KEEP)
    assert keep["history"], f"the keep row recorded no timeline: {json.dumps(keep)[:500]}"
    opened, counts = check_page(browser, html, rep, keep)
    try:
        page = opened.page
        filtered = [check_filter(page, rep, "area", keep["area"]), check_filter(page, rep, "surface", "none")]
        shot = screenshots(settings) / "report.png"
        page.screenshot(path=str(shot), full_page=True)
        assert not opened.errors, f"the page raised {opened.errors}"
    finally:
        opened.close()
    record_property("observed", f"{counts}; keep row: {len(keep['history']['lanes'])} lanes, "
                                f"{len(keep['history']['controls'])} control calls at their times; "
                                f"{'; '.join(filtered)}; screenshot {shot}")


BROKEN_PAGES = {
    "svg-left-out": (lambda text, row: re.sub(rf'<svg class="timeline"[^>]*data-row="{re.escape(row["anchor"])}".*?</svg>',
                                              "", text, count=1, flags=re.S), "has no SVG for it"),
    "verdict-count-disagrees": (lambda text, row: re.sub(r'data-verdict="pass" data-count="(\d+)"',
                                                         lambda m: f'data-verdict="pass" data-count="{int(m[1]) + 1}"',
                                                         text, count=1), "the page's header counts"),
}


@pytest.mark.parametrize("breakage", BROKEN_PAGES)
def test_a_broken_report_page_fails_the_browser_checks(browser, real_run, breakage, tmp_path, record_property):
    rep, html = inner_report(real_run)
    keep = row_of(rep, KEEP)
    edit, message = BROKEN_PAGES[breakage]
    text = html.read_text()
    broken = edit(text, keep)
    assert broken != text, f"{breakage}: the edit changed nothing on the page"
    path = tmp_path / "conformance.html"
    path.write_text(broken)
    with pytest.raises(AssertionError) as caught:
        opened, _ = check_page(browser, path, rep, keep)
        opened.close()
    assert message in str(caught.value), f"{breakage}: failed for another reason: {caught.value}"
    record_property("observed", f"{breakage}: {str(caught.value).splitlines()[0][:200]}")


def test_the_timeline_of_a_failing_keep_row_shows_tokens_arriving_after_the_pause_took_effect(
        browser, server_target, settings, tmp_path, record_property):
    with ProxyThread(server_target.url, "keep-acts-like-wait") as proxy:
        run = run_suite(proxy.url, server_target.model, [KEEP], tmp_path, rates=server_target.rates)
    rep, html = inner_report(run)
    keep = row_of(rep, KEEP)
    assert keep["verdict"] == "fail", f"the keep row did not fail through keep-acts-like-wait: {keep['verdict']}, " \
                                      f"{keep['observed'][:300]}"
    tl = keep["history"]
    assert tl, f"the failing keep row recorded no timeline: {keep['reason']}"
    effect = [m["at"] for m in tl["marks"] if m["kind"] == "pause_effect"]
    assert effect, f"the failing keep row recorded no pause effect: {tl['marks']}"
    opened = Opened(browser, html)
    try:
        page = opened.page
        check_counts(page, rep)
        row = page.locator(f'[id="{keep["anchor"]}"]')
        assert row.locator("details.tl").get_attribute("open") is not None, "a failing row's timeline is not open"
        assert keep["reason"][:60] in row.inner_text(), "the failure message is not beside the picture"
        got = check_timeline(page, keep)
        x_effect = min(got["effects"])
        after = [float(x) for lane in got["lanes"] for s in lane["strokes"] for x in re.findall(r"M([\d.]+) ", s["d"])
                 if float(x) > x_effect]
        assert after, f"no token drawn after the pause took effect (x={x_effect}) in the failing keep row"
        # The failure is drawn at the event its checker named: the observation that broke the row.
        named = [f["event"] for f in keep["findings"]]
        assert named and named[0] is not None, f"the failing keep row's verdict names no event: {keep['findings']}"
        observed = {o["event"]: o for lane in tl["lanes"] for o in lane["observed"]}
        assert named[0] in observed and not observed[named[0]]["ok"], (
            f"the finding names event {named[0]}, not a check's observation it disallowed: {observed}")
        drawn = {f["event"]: f for f in got["findings"]}
        obs_x = {o["event"]: o["x"] for o in got["observed"]}
        assert named[0] in drawn and abs(drawn[named[0]]["x"] - obs_x[named[0]]) <= PX, (
            f"the failure is drawn at {drawn}; the JSON names event {named[0]}, observed at x={obs_x.get(named[0])}")
        shot = screenshots(settings) / "failing-keep-row.png"
        row.screenshot(path=str(shot))
        assert not opened.errors, f"the page raised {opened.errors}"
    finally:
        opened.close()
    record_property("observed", f"keep through keep-acts-like-wait: fail; {len(after)} tokens drawn after the pause "
                                f"took effect at {min(effect):.2f} s; failure drawn at event {named[0]} "
                                f"({observed[named[0]]['text']}); screenshot {shot}")
