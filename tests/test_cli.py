"""The command line's own behaviour: fault specs, the run lock, error messages, prefect.yaml.

Training through the CLI is exercised in tests/flows/test_resume.py; `server` and `serve`
in tests/flows/test_serve_ui.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlanything.cli import app
from rlanything.debug_faults import InjectedFault, inject_fault, parse_fault
from rlanything.flows.runlock import RunBusyError, holder, run_lock

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_fault_specs_are_parsed_strictly():
    assert parse_fault("sigkill:rollout") == ("sigkill", "rollout", None, "start")
    assert parse_fault("raise:rm_update@3:end") == ("raise", "rm_update", 3, "end")
    for bad in ("sigkill", "explode:rollout", "raise:rolout", "raise:verify:middle", "raise:verify:end:x"):
        with pytest.raises(ValueError, match="RLANYTHING_FAULT"):
            parse_fault(bad)


def test_a_fault_fires_only_at_its_step_iteration_and_phase(monkeypatch):
    monkeypatch.setenv("RLANYTHING_FAULT", "raise:verify@1:end")
    inject_fault("verify", 0, "end")  # other iteration
    inject_fault("verify", 1, "start")  # other phase
    inject_fault("rollout", 1, "end")  # other step
    with pytest.raises(InjectedFault, match="step verify of iteration 1"):
        inject_fault("verify", 1, "end")
    monkeypatch.delenv("RLANYTHING_FAULT")
    inject_fault("verify", 1, "end")


def test_a_hold_fault_keeps_the_step_until_a_stop(monkeypatch):
    import threading

    from rlanything import debug_faults as common
    from rlanything import stopping

    monkeypatch.setenv("RLANYTHING_FAULT", "hold:rollout@0")
    monkeypatch.setattr(common, "HOLD_LIMIT_S", 0.3)
    start = time.monotonic()
    inject_fault("rollout", 0, "start")  # nobody stops it: it lets the step go after the limit
    assert 0.3 <= time.monotonic() - start < 5
    stopper = threading.Timer(0.3, stopping.request)
    monkeypatch.setattr(common, "HOLD_LIMIT_S", 60)
    stopper.start()
    try:
        with pytest.raises(stopping.Stopped):
            inject_fault("rollout", 0, "start")
    finally:
        stopper.join()
        stopping.reset()
    assert time.monotonic() - start < 10


def test_the_run_lock_is_reentrant_here_and_exclusive_across_processes(tmp_path):
    run_dir = tmp_path / "locked"
    with run_lock(run_dir):
        with run_lock(run_dir):  # the CLI holds it, then the flow takes it again
            assert holder(run_dir)["pid"] == os.getpid()
    script = (
        "import sys, time\nfrom rlanything.flows.runlock import run_lock\n"
        f"with run_lock({str(run_dir)!r}):\n    print('held', flush=True)\n    sys.stdin.read()\n"
    )
    other = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(
            RunBusyError, match=rf"already being trained or resumed by another process \(pid {other.pid} "
        ):
            with run_lock(run_dir):
                pass
    finally:
        other.communicate("", timeout=30)  # closing stdin lets it release the lock and exit
    deadline = time.monotonic() + 10
    while True:  # the kernel dropped the lock with the process
        try:
            with run_lock(run_dir):
                break
        except RunBusyError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_resume_of_a_missing_run_and_a_bad_config_fail_with_a_message(tmp_path):
    result = runner.invoke(app, ["resume", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no run at" in result.output
    result = runner.invoke(app, ["train", "-c", str(REPO / "configs" / "tiny.yaml"), "--set", "policy.group_sise=2"])
    assert result.exit_code == 2 and "group_sise" in result.output


def test_serve_without_a_prefect_server_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    result = runner.invoke(app, ["serve", "--root", str(tmp_path), "-c", str(REPO / "configs" / "tiny.yaml")])
    assert result.exit_code == 2 and "rlanything server start" in result.output
    result = runner.invoke(app, ["server", "status", "--root", str(tmp_path)])
    assert result.exit_code == 0 and "no server recorded" in result.output


def test_prefect_yaml_deploys_the_training_flow(prefect_api_url):
    """`prefect deploy --name train` with the repository's prefect.yaml registers rlanything-train/train
    on a process work pool, with the training flow's parameters and a working-directory pull step."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    with get_client(sync_client=True) as client:
        if not any(p.name == "rlanything" for p in client.read_work_pools()):
            client.create_work_pool(WorkPoolCreate(name="rlanything", type="process"))
    env = {**os.environ, "PREFECT_API_URL": prefect_api_url, "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--name", "train"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("rlanything-train/train")
    assert deployment.entrypoint == "rlanything/flows/training.py:train_flow"
    assert deployment.parameters == {"config_path": "configs/tiny.yaml", "overrides": [], "iterations": None}
    assert set(deployment.parameter_openapi_schema["properties"]) == {"config_path", "overrides", "iterations"}
    assert deployment.work_pool_name == "rlanything" and deployment.global_concurrency_limit.limit == 1
    pull = deployment.pull_steps[0]["prefect.deployments.steps.set_working_directory"]
    assert Path(pull["directory"]).resolve() == REPO


def test_resume_refuses_a_run_whose_folder_was_moved(tmp_path):
    from rlanything.config import load_config, save_config

    config = load_config(REPO / "configs" / "tiny.yaml", [f"run.root={tmp_path / 'elsewhere'}", "run.name=moved"])
    save_config(config, tmp_path / "here" / "moved" / "config.yaml")
    result = runner.invoke(app, ["resume", str(tmp_path / "here" / "moved")])
    assert result.exit_code == 2 and "was the folder moved?" in " ".join(result.output.split())


def test_tasks_prints_the_buffer_and_a_slots_lineage(tmp_path, monkeypatch):
    from rlanything import cli
    from rlanything.storage.buffer import add_pending, initial_buffer, settle_pending, write_buffer

    monkeypatch.setattr(cli.console, "width", 250)  # a wide terminal: no folded ids

    buffer = initial_buffer([{"seed": 1}, {"seed": 2}])
    buffer, child = add_pending(buffer, "s0001v00", {"seed": 20}, "harder", "too easy", 0.9, iteration=0)
    write_buffer(buffer, tmp_path / "r" / "tasks" / "v0001.parquet")
    judged = settle_pending(buffer, child, True, "accepted", 0.5, iteration=1)
    write_buffer(judged, tmp_path / "r" / "tasks" / "v0002.parquet")
    everything = runner.invoke(app, ["tasks", str(tmp_path / "r")], terminal_width=250)
    assert everything.exit_code == 0, everything.output
    assert "v0002.parquet" in everything.output and "s0000v00" in everything.output
    one = runner.invoke(app, ["tasks", str(tmp_path / "r"), "--lineage", "1"], terminal_width=250)
    assert one.exit_code == 0 and "s0000v00" not in one.output
    assert "s0001v00" in one.output and "retired" in one.output and "accepted" in one.output
    missing = runner.invoke(app, ["tasks", str(tmp_path / "r"), "--lineage", "7"])
    assert missing.exit_code != 0 and "slot 7 does not exist" in missing.output


def test_config_prints_the_resolved_config_and_names_a_bad_key():
    import yaml

    done = runner.invoke(app, ["config", "-c", str(REPO / "configs" / "tiny.yaml"), "--set", "rm.verdict=free"])
    assert done.exit_code == 0, done.output
    resolved = yaml.safe_load(done.output)
    assert resolved["rm"]["verdict"] == "free" and resolved["policy"]["group_size"] == 4  # override + file
    assert resolved["algo"]["clip_eps"] == 0.2  # a default the file does not set
    bad = runner.invoke(app, ["config", "-c", str(REPO / "configs" / "tiny.yaml"), "--set", "rm.verdikt=free"])
    assert bad.exit_code == 2 and "verdikt" in bad.output


def test_prepare_converts_smollm2_once():
    from rlanything.models.loading import smollm2_model_dir

    done = runner.invoke(app, ["prepare"])
    assert done.exit_code == 0, done.output
    assert "ready at" in done.output and (smollm2_model_dir() / "config.json").exists()


def test_every_command_shows_an_example_in_its_help():
    from typer.testing import CliRunner

    from rlanything.cli import app

    commands = [
        "train",
        "resume",
        "tasks",
        "eval",
        "config",
        "prepare",
        "serve",
        "server start",
        "server stop",
        "server status",
    ]
    for command in commands:
        result = CliRunner().invoke(app, [*command.split(), "--help"], terminal_width=200)
        assert result.exit_code == 0, (command, result.output)
        assert "Example" in result.output and "rlanything " + command.split()[0] in result.output, command
