"""Every HTML report, opened in headless Chromium at 1,280 and 1,400 px wide, holds up on the page.

The reports are built from tiny real runs (simulation, trace diagnosis, failure-prediction evaluation,
contention fit, inference load) and checked on the rendered DOM: no horizontal overflow, no table wider
than the page or cut by a scroll box, no two figures' drawings overlapping or wider than their box, a
legend on every multi-series plot that covers neither its title nor its plot, every line plot's x axis
spanning its whole data, and no JavaScript error. CI installs Debian's ``chromium`` and
``chromium-driver`` (see ``.ci/run``); without them these tests fail, they do not skip.

Set ``GPUFLEET_REPORT_SHOTS=/some/folder`` to also save a full-page PNG of each report at 1,400 px.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

WIDTHS = (1280, 1400)
HEIGHT = 900
TESTS = Path(__file__).resolve().parents[1]
KINETO = TESTS / "data" / "kineto"
CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)

# The DOM checks, run in the page; returns lists of problems (empty lists: the page holds up).
CHECKS_JS = r"""
const problems = {overflow: [], tables: [], overlaps: [], outside: [], legends: [], ranges: [], empty: []};
const root = document.documentElement, page = root.clientWidth;
if (root.scrollWidth > window.innerWidth)
  problems.overflow.push(`page is ${root.scrollWidth} px wide in ${window.innerWidth}`);
const name = el => el.id || el.className || el.tagName;
for (const t of document.querySelectorAll('table')) {
  const r = t.getBoundingClientRect();
  if (r.left < -0.5 || r.right > page + 0.5)
    problems.tables.push(`table at ${r.left}-${r.right} px in a ${page} px page`);
}
for (const el of document.querySelectorAll('body *')) {
  if (el.closest('.js-plotly-plot')) continue;
  const s = getComputedStyle(el);
  if (['auto', 'scroll', 'hidden'].includes(s.overflowX) && el.scrollWidth > el.clientWidth + 1)
    problems.tables.push(`${name(el)} hides ${el.scrollWidth - el.clientWidth} px of its ${el.scrollWidth} px content`);
}
const intersect = (a, b) => Math.max(0, Math.min(a.right, b.right) - Math.max(a.left, b.left))
  * Math.max(0, Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top));
const plots = [...document.querySelectorAll('.js-plotly-plot')];
const drawn = plots.map(p => p.querySelector('.main-svg').getBoundingClientRect());
plots.forEach((p, i) => {
  const d = drawn[i], box = p.getBoundingClientRect();
  if (d.width < 100 || d.height < 100) problems.empty.push(`${p.id} is drawn ${d.width} x ${d.height} px`);
  if (d.left < box.left - 1 || d.right > box.right + 1 || d.right > page + 1)
    problems.outside.push(`${p.id} draws ${d.left}-${d.right} px in its box ${box.left}-${box.right} px`);
  for (let j = i + 1; j < plots.length; j++)
    if (intersect(d, drawn[j]) > 1) problems.overlaps.push(`${p.id} and ${plots[j].id} overlap`);
  // the traces plotly draws (it hides those without data), less heat maps, which carry a colour bar instead
  const shown = (p._fullData || []).filter(t => t.visible === true && t.showlegend !== false && t.type !== 'heatmap');
  const legend = p.querySelector('.legend');
  const entries = legend ? legend.querySelectorAll('.traces').length : 0;
  if (shown.length >= 2 && entries < shown.length)
    problems.legends.push(`${p.id}: ${shown.length} series, ${entries} legend entries`);
  if (legend && entries) {
    const l = legend.getBoundingClientRect();
    const title = p.querySelector('.gtitle'), area = p.querySelector('.nsewdrag');
    if (title && intersect(l, title.getBoundingClientRect()) > 0) problems.legends.push(`${p.id}: legend on the title`);
    if (area && intersect(l, area.getBoundingClientRect()) > 0) problems.legends.push(`${p.id}: legend on the plot`);
    for (const t of p.querySelectorAll('.g-xtitle, .g-ytitle, .xtick, .ytick'))
      if (intersect(l, t.getBoundingClientRect()) > 0) {
        problems.legends.push(`${p.id}: legend on an axis label`);
        break;
      }
  }
  const layout = p._fullLayout;
  for (const t of p.data || []) {
    if (t.type !== 'scatter' && t.type !== 'scattergl') continue;
    const axis = layout[(t.xaxis || 'x').replace('x', 'xaxis')];
    if (!axis || !['linear', 'log'].includes(axis.type)) continue;
    const xs = Array.from(t.x || []).map(Number).filter(v => Number.isFinite(v) && (axis.type !== 'log' || v > 0));
    if (!xs.length) continue;
    let [lo, hi] = axis.range.map(Number);
    if (axis.type === 'log') [lo, hi] = [10 ** lo, 10 ** hi];
    const min = Math.min(...xs), max = Math.max(...xs), slack = 1e-6 * Math.max(Math.abs(max), Math.abs(min), 1e-12);
    if (min < Math.min(lo, hi) - slack || max > Math.max(lo, hi) + slack)
      problems.ranges.push(`${p.id} '${t.name}': x data ${min}..${max} outside the axis ${lo}..${hi}`);
  }
});
if (!plots.length) problems.empty.push('no figure on the page');
return problems;
"""

# Resolves once every figure has finished drawing (plotly draws asynchronously after newPlot).
SETTLE_JS = """
const done = arguments[arguments.length - 1];
const plots = [...document.querySelectorAll('.js-plotly-plot')];
Promise.all(plots.map(p => p._transitioning ? new Promise(r => p.once('plotly_transitioned', r)) : null))
  .then(() => requestAnimationFrame(() => requestAnimationFrame(() => done(true))));
"""


# ---------------------------------------------------------------------------------------------- browser
def _chromium() -> tuple[str, str]:
    """Paths of Debian's chromium and chromedriver; a clear failure (not a skip) when either is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.fail(
            "headless Chromium is needed to check the HTML reports: install it with "
            "`apt-get install -y chromium chromium-driver` (as .ci/run does)",
            pytrace=False,
        )
    return browser, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    profile = tempfile.mkdtemp(prefix="gpufleet-chromium-")
    for flag in (*CHROME_FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTHS[0]},{HEIGHT}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_report(driver: Any, path: Path, width: int) -> list[str]:
    """Load ``path`` in a ``width`` px window, wait for the figures; return the JavaScript errors logged."""
    driver.set_window_size(width, HEIGHT)
    driver.get_log("browser")  # drop what an earlier page logged
    driver.get(path.as_uri())
    driver.execute_async_script(SETTLE_JS)
    assert driver.execute_script("return window.innerWidth") == width
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def save_screenshot(driver: Any, out: Path) -> None:
    """A full-page PNG of the open page (beyond the window's height)."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(base64.b64decode(shot["data"]))


# ---------------------------------------------------------------------------------------------- reports
def _simulation_report(folder: Path) -> Path:
    """fifo, tiresias and aryl on a 32-GPU training pool that borrows from a 32-GPU inference pool."""
    from gpufleet.report.sim_report import write_sim_report
    from gpufleet.sim.config import SimConfig
    from gpufleet.sim.run import run_policies
    from gpufleet.traces.inference import diurnal_load

    rng = np.random.default_rng(7)
    n = 400
    jobs = pl.DataFrame(
        {
            "job_id": [f"j{i}" for i in range(n)],
            "vc": rng.choice(["alpha", "beta", "gamma", "delta"], n).tolist(),
            "submit_s": np.sort(rng.uniform(0.0, 3 * 86400.0, n)),
            # seconds to days, like Philly: a third of the jobs run past 30 minutes
            "duration_s": np.clip(rng.lognormal(6.5, 2.0, n), 5.0, 5 * 86400.0),
            "num_gpus": rng.choice([1, 1, 1, 2, 4, 8, 16], n).astype(np.int64),
        }
    )
    cluster = _tiny_cluster()
    load = diurnal_load(4, until_s=6 * 86400.0, peak=0.9, trough=0.1)
    results = run_policies(jobs, cluster, ["fifo", "tiresias", "aryl"], SimConfig(), inference=load)
    # a --failures run adds a dozen summary keys: they must not widen the page either
    for r in results:
        r.summary.update(
            {
                key: 12.0
                for key in (
                    "failures",
                    "job_interruptions",
                    "lost_gpu_hours_failures",
                    "drains",
                    "drain_true",
                    "drain_false",
                    "false_alarm_gpu_hours",
                    "drain_gpu_hours",
                    "avoided_failures",
                    "predictor",
                )
            }
        )
    context = {"trace": "synthetic, 400 jobs", "cluster": "tiny: 32 V100 training, 32 T4 inference"}
    return write_sim_report(results, folder / "simulate.html", context=context)


def _trace_builder() -> Any:
    """The diagnose tests' synthetic-trace builder (tests/diagnose/trace_builder.py)."""
    path = TESTS / "diagnose" / "trace_builder.py"
    spec = importlib.util.spec_from_file_location("gpufleet_test_trace_builder", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building the class
    spec.loader.exec_module(module)
    return module


def _diagnose_report(folder: Path, traces: Path) -> Path:
    from gpufleet.diagnose.analyzer import TraceAnalyzer
    from gpufleet.report.diagnose_report import write_diagnose_report

    analyzer = TraceAnalyzer(traces)
    return write_diagnose_report(analyzer, analyzer.diagnose(), folder / f"diagnose-{traces.name}.html")


def _diagnose_synthetic_report(folder: Path) -> Path:
    """Twelve ranks (more than the step plot names), one computing slowly."""
    tb = _trace_builder()
    shape = tb.JobShape(ranks=12, steps=12, faults=[tb.Fault("compute", rank=5, seconds=0.02)])
    return _diagnose_report(folder, tb.write_job(folder / "synthetic", shape))


def _diagnose_kineto_report(folder: Path) -> Path:
    """The two bundled ranks of HolisticTraceAnalysis's sampled trace."""
    traces = folder / "kineto"
    traces.mkdir()
    for rank in (0, 1):
        name = f"trace_filter__sampled_rank-{rank}.json.gz"
        shutil.copy(KINETO / name, traces / name)
    return _diagnose_report(folder, traces)


def _diagnose_diff_report(folder: Path) -> Path:
    """``diagnose diff`` of two synthetic runs, one of them with a slower rank and a needless sync."""
    from gpufleet.diagnose.diff import diff_runs
    from gpufleet.report.diagnose_diff_report import write_diff_report

    tb = _trace_builder()
    control = tb.write_job(folder / "control", tb.JobShape())
    test = tb.write_job(folder / "test", tb.JobShape(faults=[tb.Fault("compute", 1, 0.02), tb.Fault("sync", 2, 0.004)]))
    return write_diff_report(diff_runs(control, test), folder / "diagnose-diff.html")


def _health_report(folder: Path) -> Path:
    from gpufleet.health.evaluate import EvalConfig, evaluate
    from gpufleet.health.features import FeatureConfig
    from gpufleet.health.fleet_arrays import build_arrays
    from gpufleet.health.generator import FleetConfig, generate_fleet
    from gpufleet.report.health_report import write_health_report

    fleet = folder / "fleet.parquet"
    generate_fleet(FleetConfig(gpus=128, days=45, seed=4, failure_scale=80), fleet)
    features = FeatureConfig(window_h=72, recent_h=24, horizon_h=48)
    result = evaluate(
        build_arrays(fleet), ["gbdt", "mlp"], EvalConfig(features=features, train_days=14, period_days=7, budget=0.02)
    )
    return write_health_report(result, folder / "health.html", context={"fleet": "synthetic, 128 GPUs, 45 days"})


def _contention_report(folder: Path) -> Path:
    from gpufleet.perf.contention_study import fit_deepshare, report_data
    from gpufleet.report.contention_report import write_contention_report

    result = fit_deepshare(None, holdout=0.3, seed=0, by="cells")
    return write_contention_report(
        folder / "contention.html", **report_data(result), context={"data": "bundled DeepShare tables"}
    )


def _tiny_cluster() -> Any:
    from gpufleet.spec.cluster import ClusterSpec, Pool

    return ClusterSpec(
        name="tiny",
        pools=(
            Pool(name="train", kind="training", gpu="v100", gpus_per_node=8, nodes=4),
            Pool(name="infer", kind="inference", gpu="t4", gpus_per_node=8, nodes=4),
        ),
    )


def _inference_report(folder: Path) -> Path:
    """``traces inference diurnal --plot``: the tiny cluster's inference pool over three days."""
    from gpufleet.report.inference_plot import write_inference_plot
    from gpufleet.traces.pool_load import pool_load

    summary, frame = pool_load("diurnal", _tiny_cluster(), 3.0)
    return write_inference_plot(folder / "inference.html", frame, summary, 3 * 86400.0)


REPORTS: dict[str, Callable[[Path], Path]] = {
    "simulate": _simulation_report,
    "diagnose-synthetic": _diagnose_synthetic_report,
    "diagnose-kineto": _diagnose_kineto_report,
    "diagnose-diff": _diagnose_diff_report,
    "health": _health_report,
    "contention": _contention_report,
    "inference": _inference_report,
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Returns the path of a report kind's page, writing it on first use (once for both widths)."""
    paths: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in paths:
            paths[kind] = REPORTS[kind](tmp_path_factory.mktemp(kind))
        return paths[kind]

    return get


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("kind", list(REPORTS))
def test_report_holds_up_in_chromium(kind: str, width: int, browser: Any, built: Callable[[str], Path]) -> None:
    path = built(kind)
    errors = open_report(browser, path, width)
    problems = browser.execute_script(CHECKS_JS)
    problems["javascript"] = errors
    shots = os.environ.get("GPUFLEET_REPORT_SHOTS")
    if shots and width == max(WIDTHS):
        save_screenshot(browser, Path(shots) / f"{kind}.png")
    found = {k: v for k, v in problems.items() if v}
    assert not found, f"{kind} report at {width} px:\n{json.dumps(found, indent=1)}"


def test_checks_catch_a_broken_page(browser: Any, tmp_path: Path) -> None:
    """The checks see each problem they look for: a wide table, overlapping and unlabelled figures, an error."""
    import plotly.graph_objects as go

    from gpufleet.report import html

    lines = go.Figure(
        [go.Scatter(x=[0, 1e4], y=[0, 1], name="a"), go.Scatter(x=[0, 2], y=[1, 0], name="b")],
        layout={"showlegend": False, "xaxis": {"range": [0, 10]}},
    )
    wide = html.table([f"column {i}" for i in range(60)], [[f"{i:,}" for i in range(60)]])
    # the old grid: with auto-fit the first figure is drawn across the whole row before its neighbour arrives
    figs = html.figure_div(lines, div_id="left", include_plotlyjs=True) + html.figure_div(
        lines, div_id="right", include_plotlyjs=False
    )
    old_grid = f'<div style="display:grid;grid-template-columns:repeat(auto-fit,minmax(400px,1fr))">{figs}</div>'
    path = tmp_path / "broken.html"
    path.write_text(html.page("broken", [wide, old_grid, "<script>undefinedFunction()</script>"]), encoding="utf-8")

    errors = open_report(browser, path, WIDTHS[0])
    problems = browser.execute_script(CHECKS_JS)

    assert any("undefinedFunction" in e for e in errors)
    assert problems["tables"] and problems["overlaps"] and problems["outside"]
    assert any("2 series, 0 legend entries" in p for p in problems["legends"])
    assert any("outside the axis" in p for p in problems["ranges"])
