"""The MLflow experiment opens in MLflow's model-training view: it carries the kind tag."""

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
