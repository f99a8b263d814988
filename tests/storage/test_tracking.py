"""The MLflow experiment opens in MLflow's model-training view (it carries the kind tag), and a fresh
store opened by several processes at once works for all of them."""

import multiprocessing
from pathlib import Path

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


def _open_at_once(uri: str, barrier, index: int) -> None:
    barrier.wait()  # every process opens the fresh store at the same moment
    tracking.get_or_create_run(
        uri, "together", Path(uri.removeprefix("sqlite:///")).parent / "art", Path(f"/r{index}"), "r"
    )


def test_runs_started_together_on_a_fresh_store_all_open_it(tmp_path):
    # Without the lock in tracking.client, MLflow's table-creating migration runs in each process
    # at once and all but one fail ("table _alembic_tmp_experiments already exists").
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(4)
    workers = [context.Process(target=_open_at_once, args=(uri, barrier, i)) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [worker.exitcode for worker in workers] == [0, 0, 0, 0]
    runs = MlflowClient(tracking_uri=uri).search_runs(
        [MlflowClient(tracking_uri=uri).get_experiment_by_name("together").experiment_id]
    )
    assert len(runs) == 4
