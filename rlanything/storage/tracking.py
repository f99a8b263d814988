"""MLflow tracking: one MLflow run per training run, found again by tag on resume.

Tasks use `MlflowClient` with the explicit run id (no global active run), so a step can run in
any process. Artifacts of iteration N go under `iter_NNNN/`; `log_artifact` overwrites, so a
resumed step that logs again is harmless. Status: RUNNING while a process trains (set again on
resume), FINISHED or FAILED when it ends; a process killed by SIGKILL leaves it RUNNING until
the run is resumed.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

from filelock import FileLock
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

RUN_TAG = "rlanything.run_dir"


# MLflow 3's UI has two views: GenAI ("Evaluations", traces) and model training (runs, metric
# charts, artifacts). Experiments carry the kind tag its UI reads, and every link we print names
# the view: MLflow 3.17's UI picks it from the link's `workflowType` (or the last one the browser
# chose) and opens GenAI otherwise, whatever the tag says (seen in a browser, November 2026).
EXPERIMENT_KIND = "mlflow.experimentKind"
KIND_TAG = {EXPERIMENT_KIND: "custom_model_development"}
UI_VIEW = "workflowType=machine_learning"


def ui_link(base: str, uri: str | None = None, run_id: str | None = None) -> str:
    """A link into the MLflow UI at `base` that opens the model-training view: the run's page when
    `run_id` is given (its experiment read from the store at `uri`), else the experiments list.

    >>> ui_link("http://127.0.0.1:5000")
    'http://127.0.0.1:5000/#/experiments?workflowType=machine_learning'
    """
    if run_id is None:
        return f"{base}/#/experiments?{UI_VIEW}"
    experiment_id = client(uri).get_run(run_id).info.experiment_id
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{UI_VIEW}"


def client(uri: str) -> MlflowClient:
    """A client of the store at `uri`; a SQLite store is opened first (`_open_sqlite`)."""
    if uri.startswith("sqlite:///"):
        _open_sqlite(uri)
    return MlflowClient(tracking_uri=uri)


@functools.cache  # once per process and store: afterwards MLflow's own store cache serves it
def _open_sqlite(uri: str) -> None:
    """Open (and on first use create) a SQLite store under a file lock beside it: MLflow creates a
    new store's tables in a migration, and two processes doing that at once (two runs started
    together on a fresh run.root) fail with "table _alembic_tmp_experiments already exists"
    (measured); the lock makes the second wait and then find the tables made."""
    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{db}.lock"):
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


def get_or_create_run(uri: str, experiment: str, artifact_root: Path, run_dir: Path, run_name: str) -> str:
    """The MLflow run id of the training run in `run_dir`, created on first use."""
    mlf = client(uri)
    exp = mlf.get_experiment_by_name(experiment)
    if exp is None:
        # An explicit artifact location, else artifacts land in ./mlruns under the CWD.
        try:
            exp_id = mlf.create_experiment(
                experiment, artifact_location=artifact_root.resolve().as_uri(), tags=KIND_TAG
            )
        except MlflowException:  # another process made it since (two runs started together)
            if (exp := mlf.get_experiment_by_name(experiment)) is None:
                raise
            exp_id = exp.experiment_id
    else:
        exp_id = exp.experiment_id
        if exp.tags.get(EXPERIMENT_KIND) is None:  # an experiment made before we tagged them
            mlf.set_experiment_tag(exp_id, EXPERIMENT_KIND, KIND_TAG[EXPERIMENT_KIND])
    found = mlf.search_runs([exp_id], filter_string=f"tags.`{RUN_TAG}` = '{run_dir}'", max_results=1)
    if found:
        return found[0].info.run_id
    run = mlf.create_run(exp_id, run_name=run_name, tags={RUN_TAG: str(run_dir)})
    return run.info.run_id


def log_params(uri: str, run_id: str, params: dict) -> None:
    mlf = client(uri)
    existing = mlf.get_run(run_id).data.params
    new = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in existing]
    for i in range(0, len(new), 100):
        mlf.log_batch(run_id, params=new[i : i + 100])


def log_metrics(uri: str, run_id: str, metrics: dict[str, float], step: int) -> None:
    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
    client(uri).log_batch(run_id, metrics=batch)


def log_artifacts(uri: str, run_id: str, paths: list[Path], artifact_path: str | None) -> None:
    """Log files (and folders) under `artifact_path` (None: the run's artifact root)."""
    mlf = client(uri)
    for path in paths:
        if path.is_dir():
            mlf.log_artifacts(
                run_id, str(path), artifact_path=f"{artifact_path}/{path.name}" if artifact_path else path.name
            )
        else:
            mlf.log_artifact(run_id, str(path), artifact_path=artifact_path)


def set_tags(uri: str, run_id: str, tags: dict[str, str]) -> None:
    mlf = client(uri)
    for key, value in tags.items():
        mlf.set_tag(run_id, key, value)


def set_running(uri: str, run_id: str) -> None:
    """Mark a resumed run RUNNING again (a killed process leaves it RUNNING, a failed one FAILED)."""
    client(uri).update_run(run_id, status="RUNNING")


def set_terminated(uri: str, run_id: str, status: str = "FINISHED") -> None:
    client(uri).set_terminated(run_id, status=status)
