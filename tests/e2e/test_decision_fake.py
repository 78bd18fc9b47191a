"""The decision at the end of `run`, through the CLI on a private Ray with FakeEngine servers:
- a capacity-mode sweep with `target:` and `pricing:` exits 0 and writes --summary-json: the
  verdict, the configuration to ship (its serve command), its gain interval and the fleet,
  equal to fleet_for over the lowest capacity_rps of that configuration's measurements;
  `best --format json` prints the same decision; the report opens with the Decision section
  (headless Chromium);
- a sweep whose SLA no configuration meets exits 4 (EXIT_NO_FEASIBLE) with feasible: false;
- bad input exits 2 with one line and writes no summary.
(130, interrupted: test_failures_fake.py's SIGTERM test.)"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from framework.config.search_space import load_search_space
from framework.config.specs import load_sweep
from framework.fleet.sizing import fleet_for
from framework.results.decision import EXIT_NO_FEASIBLE
from framework.results.decision import sweep_decision
from tests.browser import CHROMIUM
from tests.browser import CHROMIUM_FLAGS
from tests.browser import check_report
from tests.cli import cli_in_process
from tests.cli import run_joined
from tests.clusters import SharedRay
from tests.clusters import join_shared
from tests.procs import new_marker
from tests.sweeps import NO_REMEASURE
from tests.sweeps import read_trials

pytestmark = pytest.mark.server


def capacity_sweep(ray: SharedRay, tmp: Path, model: Path, name: str, sla: dict,
                   **extra) -> Path:
    """A FakeEngine capacity sweep with a target and prices, on the session's shared Ray."""
    space = tmp / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [2, 16], "default": 16}}}))
    sweep = tmp / f"{name}.yaml"
    sweep.write_text(yaml.safe_dump(join_shared({
        "name": name, "model": str(model), "search_space": str(space), "engine": "fake",
        "server": {"startup_timeout_s": 60, "env": {"FAKE_ENGINE_STARTUP_S": "0.3",
                                                     "FAKE_ENGINE_TTFT_MS": "20",
                                                     "FAKE_ENGINE_TPOT_MS": "10"}},
        "workload": {"num_prompts": 24, "input_len": 16, "output_len": 8, "warmup_requests": 0},
        # steps of 1 s at 4, 8, 16 req/s: the decision needs a capacity per measurement,
        # not a fine one (capacity.py's search is test_search_integration.py's)
        "capacity": {"start_rate": 4, "max_rate": 32, "max_steps": 3, "tolerance": 0.5,
                     "step_duration_s": 1, "min_requests": 6},
        "objective": {"metric": "cost_per_hour_for_target"},
        "sla": sla,
        "target": {"request_rate": 30, "headroom": 0.2},
        "pricing": {"per_replica_hour": 0.4, "currency": "EUR"},
        "cluster": {"max_concurrent_trials": 1},
        "results_dir": str(tmp / "results"), **extra,
    }, ray)))
    return sweep


@pytest.mark.timeout(400)
def test_summary_json_best_json_and_the_decision_section(shared_ray, tiny_model, short_tmp):
    sweep = capacity_sweep(shared_ray, short_tmp, tiny_model, "decide", {"p99_ttft_ms": 2000},
                           search={"sampler": "grid", "n_trials": 2, "baseline": True,
                                   "confirm_top": 1, "baseline_repeats": 1, "seed": 0})
    summary = short_tmp / "out" / "summary.json"
    res = run_joined(shared_ray, ["run", str(sweep), "--summary-json", str(summary)], short_tmp)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    written = json.loads(summary.read_text())

    trials = read_trials(short_tmp / "results", "decide")
    spec = load_sweep(sweep)
    expected = sweep_decision(trials, spec, load_search_space(spec.search_space), str(sweep))
    assert written == json.loads(json.dumps(expected.as_json()))  # what the rows say
    assert written["feasible"] and written["verdict"]["ship"] is not None
    shipped = trials[(trials["trial_number"] == written["verdict"]["ship"])
                     | (trials["confirmation_of"] == written["verdict"]["ship"])]
    lowest = shipped.loc[shipped["capacity_rps"].idxmin()]
    fleet = fleet_for(30, float(lowest["capacity_rps"]), headroom=0.2, price_per_replica_hour=0.4)
    f = written["fleet"]
    assert (f["trial"], f["replicas"], f["gpus"]) == (lowest["trial_number"], fleet.replicas,
                                                      fleet.gpus)
    assert f["cost_per_hour"] == pytest.approx(fleet.cost_per_hour) and f["currency"] == "EUR"
    assert written["best"]["command"] == shipped.iloc[0]["serve_command"]
    assert written["exports"] == [f"vllm-sweep export {sweep} --format {x}"
                                  for x in ("serve", "ray-serve", "k8s", "json")]
    fleet_line = f"{fleet.replicas} replica"
    assert fleet_line in res.stdout and "EUR/h" in res.stdout  # the console's final summary

    best = cli_in_process("best", str(sweep), "--format", "json", cwd=short_tmp)
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout) == written

    report = cli_in_process("report", str(sweep), "--out", str(short_tmp / "r.html"),
                            cwd=short_tmp)
    assert report.returncode == 0, report.stderr
    check_report(short_tmp / "r.html", min_plots=1)
    top = decision_on_screen(short_tmp / "r.html")
    assert top["first"] == "Decision" and top["top"] < 900, top  # in the first screen
    assert f"{fleet.gpus}" in top["text"] and "EUR" in top["text"]
    assert "vllm-sweep export" in top["text"] and "sweep pricing.per_replica_hour" in top["text"]


def decision_on_screen(html: Path) -> dict:
    """The page's first section heading, where the Decision section starts and its text, as
    headless Chromium lays it out at 1400 x 900."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(html.resolve().as_uri(), wait_until="load")
            return page.evaluate("""() => {
              const s = document.getElementById('decision');
              return {first: document.querySelector('h2').textContent,
                      top: s.getBoundingClientRect().top, text: s.innerText};
            }""")
        finally:
            browser.close()


@pytest.mark.timeout(300)
def test_no_feasible_configuration_exits_4(shared_ray, tiny_model, short_tmp):
    sweep = capacity_sweep(shared_ray, short_tmp, tiny_model, "none", {"p99_ttft_ms": 0.001},
                           search={**NO_REMEASURE, "n_trials": 1, "baseline": False})
    data = yaml.safe_load(sweep.read_text())
    data["capacity"]["max_steps"] = 2  # 4 req/s broke, 2 req/s broke: capacity 0
    sweep.write_text(yaml.safe_dump(data))
    summary = short_tmp / "summary.json"
    res = run_joined(shared_ray, ["run", str(sweep), "--summary-json", str(summary)], short_tmp)
    assert res.returncode == EXIT_NO_FEASIBLE == 4, res.stdout[-3000:] + res.stderr[-3000:]
    written = json.loads(summary.read_text())
    assert not written["feasible"] and written["verdict"]["kind"] == "no_feasible"
    assert written["best"] is None and written["fleet"] is None and written["exports"] == []
    row = read_trials(short_tmp / "results", "none").iloc[0]
    assert row["capacity_rps"] == 0 and not row["feasible"]
    assert pd.isna(row["gpus_for_target"]) and pd.isna(row["objective"])  # no fleet, not 0
    best = cli_in_process("best", str(sweep), "--format", "json", cwd=short_tmp)
    assert best.returncode == 1 and best.stdout == ""


def test_bad_input_exits_2_and_writes_no_summary(tiny_model, tmp_path):
    # the input is refused before any Ray is joined: the address is never used
    unused = SharedRay("127.0.0.1:1", new_marker(), tmp_path)
    sweep = capacity_sweep(unused, tmp_path, tiny_model, "bad", {"p99_ttft_ms": 500},
                           search={"n_trials": 1})
    data = yaml.safe_load(sweep.read_text())
    data["pricing"] = {"file": str(tmp_path / "no-such-prices.yaml")}
    sweep.write_text(yaml.safe_dump(data))
    summary = tmp_path / "summary.json"
    res = cli_in_process("run", str(sweep), "--summary-json", str(summary), cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr
    assert "pricing.file" in res.stderr and "no-such-prices.yaml" in res.stderr
    assert not summary.exists()
