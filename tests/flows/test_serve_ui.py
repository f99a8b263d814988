"""The UIs in a real browser: `rlanything server start`, `rlanything serve`, then headless
Chromium (Debian's /usr/bin/chromium driven by the PyPI `playwright` package) starts a training
run from the Prefect UI with an edited parameter, watches it complete, and finds the
iteration's plot in the MLflow UI; `rlanything server stop` ends everything.

Screenshots land in the test's tmp folder (`shots/`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rlanything.flows import servers

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (make system-deps)"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def api(url: str, body: dict | None = None):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode() if body is not None else None, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def rlanything(*args: str, env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlanything.cli", *args], env=env, cwd=REPO, text=True, capture_output=True, **kw
    )


def test_deployment_started_from_the_prefect_ui_completes_and_its_plots_show_in_mlflow(tmp_path, small_overrides):
    playwright = pytest.importorskip("playwright.sync_api")
    root, shots = tmp_path / "runs", tmp_path / "shots"
    shots.mkdir()
    prefect_port, mlflow_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "RLANYTHING_FAULT"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), RLANYTHING_PROGRESS="0", COLUMNS="200")
    env.update(PREFECT_RUNNER_POLL_FREQUENCY="1")  # serve's runner asks for new runs each second, not 10
    prefect_url, mlflow_url = f"http://127.0.0.1:{prefect_port}", f"http://127.0.0.1:{mlflow_port}"
    serve = None
    try:
        started = rlanything(
            "server",
            "start",
            "--root",
            str(root),
            "--prefect-port",
            str(prefect_port),
            "--mlflow-port",
            str(mlflow_port),
            env=env,
            timeout=300,
        )
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"Prefect UI  {prefect_url}" in started.stdout and f"MLflow UI   {mlflow_url}" in started.stdout
        status = rlanything("server", "status", "--root", str(root), env=env, timeout=60).stdout
        assert status.count("running") == 2 and status.count("answering") == 2 and "NOT" not in status, status

        sets = [
            a for o in [f"run.root={root}", "run.name=served", *small_overrides, "run.plots=true"] for a in ("--set", o)
        ]
        serve = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlanything.cli",
                "serve",
                "--root",
                str(root),
                "-c",
                "configs/tiny.yaml",
                *sets,
                "-n",
                "1",
                "--name",
                "ui-test",
            ],
            env=env,
            cwd=REPO,
            stdout=open(tmp_path / "serve.log", "w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 180
        while not _deployment(prefect_url):
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "the deployment never appeared"
            time.sleep(1)
        assert servers.read_state(root)["serve"]["pid"] == serve.pid

        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(60_000)

            # Prefect: the deployment is listed; start a run with one parameter edited.
            page.goto(f"{prefect_url}/deployments", wait_until="networkidle")
            page.get_by_text("ui-test").first.wait_for()
            page.screenshot(path=shots / "1-prefect-deployments.png")
            page.get_by_text("ui-test").first.click()
            page.get_by_role("button", name="Run", exact=True).click()
            page.get_by_text("Quick run", exact=True).click()
            dialog = page.get_by_role("dialog")
            dialog.wait_for()
            edited = [box for box in dialog.get_by_role("textbox").all() if box.input_value() == "run.name=served"]
            assert len(edited) == 1, [box.input_value() for box in dialog.get_by_role("textbox").all()]
            edited[0].fill("run.name=from-ui")
            page.screenshot(path=shots / "2-prefect-run-dialog.png")
            dialog.get_by_role("button", name="Run", exact=True).click()
            page.screenshot(path=shots / "3-prefect-run-scheduled.png")  # the toast, where it came in time
            # The run the click created, read from the API: the UI's toast ("... scheduled to start now") lasts
            # a few seconds, and a loaded 2-core machine once missed it for 60 s.
            flow_run_id = _flow_run_with(prefect_url, "run.name=from-ui", page=page)
            page.goto(f"{prefect_url}/runs/flow-run/{flow_run_id}", wait_until="networkidle")
            deadline = time.monotonic() + 420
            while (state := api(f"{prefect_url}/api/flow_runs/{flow_run_id}")["state"]["type"]) not in (
                "COMPLETED",
                "FAILED",
                "CRASHED",
            ):
                assert time.monotonic() < deadline, f"flow run still {state}"
                time.sleep(2)
            assert state == "COMPLETED", (tmp_path / "serve.log").read_text()[-3000:]
            page.reload(wait_until="networkidle")
            page.get_by_text("Completed", exact=True).first.wait_for()
            page.screenshot(path=shots / "4-prefect-flow-run-completed.png")
            page.get_by_text("Subflow Runs", exact=True).first.click()
            page.get_by_text(f"{root / 'from-ui'}: iteration 0").first.wait_for()  # the iteration's own flow run
            page.screenshot(path=shots / "5-prefect-subflow-runs.png")

            # MLflow: the run's iteration folder holds the Parquet files and the plots; open one.
            from mlflow.tracking import MlflowClient

            client = MlflowClient(mlflow_url)
            experiment = client.get_experiment_by_name("rlanything")
            (mlrun,) = client.search_runs([experiment.experiment_id], filter_string="attributes.run_name = 'from-ui'")
            assert mlrun.info.status == "FINISHED"
            page.goto(f"{mlflow_url}/#/experiments/{experiment.experiment_id}/runs/{mlrun.info.run_id}/artifacts")
            page.get_by_text("iter_0000", exact=True).first.click()
            for name in (
                "rollouts.parquet",
                "judgments.parquet",
                "curves.png",
                "iteration.png",
                "summary.md",
                "samples.md",
            ):
                page.get_by_text(name, exact=True).first.wait_for()
            page.get_by_text("curves.png", exact=True).first.click()
            page.get_by_text("iter_0000/curves.png").first.wait_for()  # the preview's header
            image = page.locator("img[src^='blob:']").first
            image.wait_for()
            assert image.evaluate("img => img.naturalWidth") > 800  # the PNG was fetched and decoded
            page.screenshot(path=shots / "6-mlflow-iteration-plot.png")
            page.get_by_text("summary.md", exact=True).first.click()
            page.get_by_text("Task adaptation", exact=True).first.wait_for()  # rendered markdown
            page.screenshot(path=shots / "7-mlflow-summary.png")
            browser.close()
    finally:
        stopped = rlanything("server", "stop", "--root", str(root), env=env, timeout=300)
        if serve is not None and serve.poll() is None:  # only if stop failed to end it
            serve.send_signal(signal.SIGKILL)
        if serve is not None:
            serve.wait(timeout=60)
    assert stopped.returncode == 0 and "stopped: serve, prefect, mlflow" in stopped.stdout, (
        stopped.stdout + stopped.stderr
    )
    assert not [name for name, entry in servers.read_state(root).items()]
    for port in (prefect_port, mlflow_port):
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still answers"
    assert (root / "from-ui" / "iter_0000" / "DONE").exists()


def _flow_run_with(prefect_url: str, override: str, page, timeout: float = 120) -> str:
    """Id of the flow run the page just created: the one whose overrides hold `override` (the page's
    text in the failure message)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in api(f"{prefect_url}/api/flow_runs/filter", {"limit": 50}):
            if override in (run["parameters"].get("overrides") or []):
                return run["id"]
        time.sleep(0.5)
    raise AssertionError(f"no flow run with {override}; the page says: {page.inner_text('body')[-2000:]}")


def _deployment(prefect_url: str) -> dict | None:
    try:
        return api(f"{prefect_url}/api/deployments/name/rlanything-train/ui-test")
    except OSError:
        return None
