"""Render an HTML report in the machine's headless Chromium (Debian's package, `make browser`)
through the python playwright package; no browser is downloaded and nothing leaves the machine.

`render` loads a file in a 1400 x 900 px window, waits for its plotly plots, and reports console
errors, page errors, the number of rendered plots and the trial table's layout (TABLE_LAYOUT_JS);
`check_report` adds the assertions every report must pass (among them: the table fits the
window or scrolls inside its box, so no column is cut off) and `check_sweep_report` runs
`vllm-sweep report` on a sweep first (for end-to-end tests).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]
PLOTS_RENDERED_JS = """() => {
  const all = document.querySelectorAll('.plotly-graph-div');
  const done = [...all].filter(d => d.classList.contains('js-plotly-plot')
                                    && d.querySelector('svg.main-svg'));
  return done.length === all.length;
}"""
COUNT_PLOTS_JS = ("() => [...document.querySelectorAll('.js-plotly-plot')]"
                  ".filter(d => d.querySelector('svg.main-svg')).length")
VIEWPORT = {"width": 1400, "height": 900}
# The trial table's box scrolled to its right end: what a reader can reach of the table.
TABLE_LAYOUT_JS = """() => {
  const table = document.getElementById('trials');
  if (!table) return null;
  const box = table.parentElement;
  box.scrollLeft = box.scrollWidth;
  const heads = [...table.querySelectorAll('thead th')];
  const last = heads[heads.length - 1].getBoundingClientRect();
  const rect = box.getBoundingClientRect();
  const style = getComputedStyle(box);
  const out = {pageWidth: document.documentElement.scrollWidth, viewport: window.innerWidth,
               boxLeft: rect.left, boxRight: rect.right, boxWidth: box.clientWidth,
               tableWidth: table.scrollWidth, overflowX: style.overflowX,
               lastHeadRight: last.right, lastHeadLeft: last.left,
               headers: heads.map(h => h.textContent)};
  box.scrollLeft = 0;
  return out;
}"""
AXIS_TITLES_JS = ("() => [...document.querySelectorAll('.js-plotly-plot .xtitle, "
                  ".js-plotly-plot .ytitle')].map(t => t.textContent)")
_EXTERNAL = re.compile(
    r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*["']?(?:https?:)?//""", re.IGNORECASE)


@dataclass(frozen=True)
class RenderResult:
    console_errors: list[str]
    page_errors: list[str]
    plot_count: int
    title: str
    table: dict | None = None  # TABLE_LAYOUT_JS's measures; None without a trial table
    axis_titles: tuple[str, ...] = ()


def external_references(text: str) -> list[str]:
    """Tags of the page that would load something over the network (script/link/img/iframe
    with an http(s) or protocol-relative src/href)."""
    return [m.group(0) for m in _EXTERNAL.finditer(text)]


def render(html: Path, screenshot: Path, timeout_s: float = 60.0) -> RenderResult:
    """Open file://html in headless Chromium with a fresh profile, wait until every plotly plot
    has drawn its SVG (or timeout_s), save a full-page PNG to `screenshot`."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    console_errors: list[str] = []
    page_errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="vst-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
            viewport=VIEWPORT, offline=True)
        try:
            page = context.new_page()
            page.on("console",
                    lambda m: console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            page.goto(html.resolve().as_uri(), wait_until="load", timeout=timeout_s * 1000)
            try:
                page.wait_for_function(PLOTS_RENDERED_JS, timeout=timeout_s * 1000)
            except PlaywrightTimeout:
                pass
            plot_count = int(page.evaluate(COUNT_PLOTS_JS))
            title = page.title()
            table = page.evaluate(TABLE_LAYOUT_JS)
            axis_titles = tuple(page.evaluate(AXIS_TITLES_JS))
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            context.close()
    return RenderResult(console_errors, page_errors, plot_count, title, table, axis_titles)


def assert_table_reachable(table: dict | None) -> None:
    """The page is no wider than the window, and the trial table fits its box or the box
    scrolls sideways far enough to show the last column whole."""
    assert table is not None, "no trial table"
    assert table["pageWidth"] <= table["viewport"], table  # nothing runs off the page
    assert table["boxRight"] <= table["viewport"], table
    if table["tableWidth"] > table["boxWidth"]:
        assert table["overflowX"] in ("auto", "scroll"), table
        assert table["boxLeft"] - 1 <= table["lastHeadLeft"], table
        assert table["lastHeadRight"] <= table["boxRight"] + 1, table


def check_report(html: Path, min_plots: int = 3) -> RenderResult:
    """Assert a report is self-contained and renders in Chromium: >= min_plots plots, no
    console or page error, a full-page screenshot (report.png beside it) over 10 kB."""
    external = external_references(html.read_text(encoding="utf-8"))
    assert not external, f"{html} loads from the network: {external[:3]}"
    shot = html.with_suffix(".png")
    result = render(html, shot)
    assert result.console_errors == [], result.console_errors
    assert result.page_errors == [], result.page_errors
    assert result.plot_count >= min_plots, result
    assert shot.is_file() and shot.stat().st_size > 10_000, shot
    if result.table is not None:
        assert_table_reachable(result.table)
    return result


def check_sweep_report(sweep: Path, cwd: Path, env: dict[str, str] | None = None,
                       min_plots: int = 3, timeout_s: float = 300.0) -> tuple[Path, RenderResult]:
    """Run `vllm-sweep report sweep` (exit 0, the report's path printed), then check_report."""
    res = subprocess.run([sys.executable, "-m", "framework.cli", "report", str(sweep)], cwd=cwd,
                         env=env, capture_output=True, text=True, timeout=timeout_s)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    path = Path(res.stdout.strip().splitlines()[-1])
    if not path.is_absolute():
        path = cwd / path
    assert path.is_file(), res.stdout
    return path, check_report(path, min_plots)
