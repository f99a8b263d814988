"""Step 2's domain logic: the outcome of a trajectory, from its environment's verifier.

A finished episode is replayed action by action in a fresh environment and the verifier asked
(`replay_outcome`): the outcome never depends on state the live episode may have left behind.
Environments that cannot be replayed (`replayable = False`, a desktop VM) keep the verdict
taken at the end of the live episode. Library code: the verify task reads and writes the
Parquet files around `verify_episode`.

The same step also asks environments that know them for ground-truth labels of single steps
(`label_episode`, `envs.base.step_labels`): they measure the RM (its process accuracy) and never
reach the reward.
"""

from __future__ import annotations

import collections
import json
import logging

import pandas as pd

from rlanything import stopping
from rlanything.environment import runs_code
from rlanything.envs.base import env_class, make_env, optional, replayable, step_labels

TEST_COUNTS = ("tests_passed", "tests_total")  # null for environments without ground-truth tests
OUTCOME_IDS = ("traj_id", "task_id", "slot", "version", "rollout_idx", "num_steps", "termination", "pending")


def replay_outcome(env_config, spec: dict, actions: list[str | None]) -> int:
    """Replay a trajectory's actions in a fresh environment and ask its verifier."""
    return replay(env_config, spec, actions)[0]


def replay(
    env_config, spec: dict, actions: list[str | None], sandbox_runs: collections.Counter[str] | None = None
) -> tuple[int, list[bool] | None]:
    """`replay_outcome`, with the per-test results of environments that keep them in
    `test_results` (coding; None for the others). `sandbox_runs`, when given, adds the programs
    an environment that runs code (`runs_code`) ran in the sandbox, by isolation."""
    env = make_env(env_config)
    try:
        env.reset(spec)
        for action in actions:
            env.step(action)
        outcome = env.outcome()
        return outcome, optional(env, "test_results")
    finally:
        if sandbox_runs is not None and runs_code(env_config.kind):  # those of a failed outcome() too
            sandbox_runs.update(env.sandbox_runs)
        env.close()


def verify_episode(
    env_config,
    episode: dict,
    spec: str,
    actions: list[str | None],
    sandbox_runs: collections.Counter[str] | None = None,
) -> dict:
    """One outcomes.parquet row from an episodes.parquet row (`spec` as JSON, `actions` in step
    order): a finished episode is replayed in a fresh environment and its verifier asked, or,
    for environments that cannot be replayed, the verdict taken at the end of the live episode
    is kept; hitting the step cap is a failure without asking; an environment error is invalid.
    A verifier that raises makes the row invalid with the error recorded, never a silent -1.
    tests_passed / tests_total: the ground-truth tests of a replayed coding trajectory, else None.
    `sandbox_runs`: see `replay`."""
    outcome, valid, error = -1, episode["termination"] != "env_error", episode["error"]
    tests = None
    verified_by = "step_cap" if episode["termination"] == "max_steps" else episode["termination"]
    if episode["termination"] == "done" and not replayable(env_class(env_config.kind)):
        verified_by = "live"
        if episode["live_outcome"] is None or pd.isna(episode["live_outcome"]):
            valid, error = False, "verifier: no live outcome recorded for a non-replayable environment"
        else:
            outcome = int(episode["live_outcome"])
    elif episode["termination"] == "done":
        verified_by = "replay"
        try:
            outcome, tests = replay(env_config, json.loads(spec), actions, sandbox_runs)
        except Exception as err:  # a crashing verifier is recorded, never a silent -1
            valid, error = False, f"verifier: {type(err).__name__}: {err}"
    ids = {k: v for k, v in episode.items() if k in OUTCOME_IDS}
    counts = (
        {"tests_passed": sum(tests), "tests_total": len(tests)} if tests is not None else dict.fromkeys(TEST_COUNTS)
    )
    return {**ids, "outcome": outcome, "valid": valid, "error": error, "verified_by": verified_by, **counts}


def label_episode(env_config, outcome: dict, spec: str, actions: list[str | None]) -> list[dict] | None:
    """step_labels.parquet rows of one trajectory (`outcome`: its outcomes.parquet row, `spec` as
    JSON, `actions` in step order): one per step the environment labels; None when the
    environment labels no step. Trajectories whose steps are never judged get none: invalid ones
    (environment error, crashed verifier) and pending ones (a rewrite under evaluation)."""
    if not outcome["valid"] or outcome["pending"]:
        return []
    labels = step_labels(env_class(env_config.kind), env_config, json.loads(spec), actions)
    if labels is None:
        return None
    ids, rows = {"traj_id": outcome["traj_id"], "task_id": outcome["task_id"]}, []
    for step_idx, labelled in enumerate(labels):
        if labelled is not None:
            label, rule = labelled
            rows.append({**ids, "step_idx": step_idx, "label": label, "rule": rule})
    return rows


def verify_all(env_config, episodes: pd.DataFrame, steps: pd.DataFrame, specs: pd.Series):
    """Step 2 over an iteration: every episode's outcome (`verify_episode`) and, where the
    environment knows them, its step labels (`label_episode`; a labelling failure costs that
    trajectory's labels only: they measure the RM and never reach the reward). `steps`: the
    rollouts, `specs`: spec by task_id -> (outcome rows, label rows, labelling failures, the
    programs the replays ran in the sandbox by isolation)."""
    # a missing action reads back as NaN (pandas' string dtype); environments are promised None
    actions = (
        steps.sort_values("step_idx")
        .groupby("traj_id")
        .action.apply(lambda column: [a if isinstance(a, str) else None for a in column])
    )
    sandbox_runs = collections.Counter()
    rows = []
    for ep in episodes.itertuples(index=False):
        stopping.check()  # a replay can take long (a game, a sandboxed program)
        rows.append(
            verify_episode(env_config, ep._asdict(), specs[ep.task_id], actions.get(ep.traj_id, []), sandbox_runs)
        )
    labels, label_errors = [], 0
    for row in rows:
        stopping.check()
        try:
            labelled = label_episode(env_config, row, specs[row["task_id"]], actions.get(row["traj_id"], []))
        except Exception as err:  # labels only measure the RM: a failure costs this trajectory's labels
            label_errors += 1
            logging.getLogger(__name__).warning("step labels of trajectory %d: %r", row["traj_id"], err)
            continue
        if labelled is None:  # the environment labels no step
            break
        labels += labelled
    return rows, labels, label_errors, sandbox_runs
