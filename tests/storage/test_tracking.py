"""The MLflow experiment opens in MLflow's model-training view (it carries the kind tag), and a fresh
store opened by several processes at once works for all of them."""

import subprocess
import sys
import time

from mlflow import MlflowClient

from rlanything.storage import tracking


def test_new_and_existing_experiments_get_the_model_training_kind(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.get_or_create_run(uri, "fresh", tmp_path / "art", tmp_path / "run-a", "a")
    mlf = MlflowClient(tracking_uri=uri)
    assert mlf.get_experiment_by_name("fresh").tags["mlflow.experimentKind"] == "custom_model_development"

    mlf.create_experiment("older", artifact_location=(tmp_path / "art2").as_uri())  # made before the tag existed
    assert "mlflow.experimentKind" not in mlf.get_experiment_by_name("older").tags
    run_id = tracking.get_or_create_run(uri, "older", tmp_path / "art2", tmp_path / "run-b", "b")
    assert mlf.get_experiment_by_name("older").tags["mlflow.experimentKind"] == "custom_model_development"
    assert tracking.get_or_create_run(uri, "older", tmp_path / "art2", tmp_path / "run-b", "b") == run_id


def test_printed_links_open_the_model_training_view(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.get_or_create_run(uri, "links", tmp_path / "art", tmp_path / "run", "r")
    experiment_id = MlflowClient(tracking_uri=uri).get_run(run_id).info.experiment_id
    assert (
        tracking.ui_link("http://127.0.0.1:5000", uri, run_id)
        == f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"
    )


# A separate Python each, started together: imports done, every one waits for the go file, then
# opens the store and makes its run (fresh interpreters: nothing inherited from the test process).
CHILD = """
import sys, time
from pathlib import Path
from rlanything.storage import tracking
go, uri, index = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(go.parent / f"ready-{index}").touch()
while not go.exists():
    time.sleep(0.001)
tracking.get_or_create_run(uri, "together", go.parent / "art", Path(f"/r{index}"), "r")
"""


def test_runs_started_together_on_a_fresh_store_all_open_it(tmp_path):
    # Without the lock in tracking.client, MLflow's table-creating migration runs in each process
    # at once and all but one fail ("table _alembic_tmp_experiments already exists").
    uri, go = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "go"
    args = [[sys.executable, "-c", CHILD, str(go), uri, str(i)] for i in range(4)]
    children = [subprocess.Popen(a, stderr=subprocess.PIPE, text=True) for a in args]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    errors = [child.communicate(timeout=120)[1] for child in children]
    assert [child.returncode for child in children] == [0, 0, 0, 0], errors
    mlf = MlflowClient(tracking_uri=uri)
    assert len(mlf.search_runs([mlf.get_experiment_by_name("together").experiment_id])) == 4
