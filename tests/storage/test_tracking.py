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
