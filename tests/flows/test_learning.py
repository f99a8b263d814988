"""The loop learns, and this test can tell when it does not.

Random-init tiny models train on the one-word `first_letter` environment (configs/tiny-learn.yaml)
through the real training flow (Prefect, MLflow, Parquet). Each claim has a control run that
breaks exactly the part it checks, so a test that always passed would be caught:

* policy: greedy accuracy on held-out problems rises by a clear margin; with the advantage sign
  flipped it does not rise. Both runs are the policy-only arm, no RM in the loop: with
  tiny-learn.yaml's λ 0 the policy's reward is the outcome alone, so an RM judging and training
  beside it would leave the policy's run as it is (tests/agent/test_advantage_rows.py: λ 0 is the
  outcome-only baseline), at half the time. The flip is this test's own fault: the flows run their
  steps in this process, so `signed_policy_advantages` wraps the advantages step's
  `compute_samples` and scales its policy rows by -1, and the learning run goes through the very
  same wrapper with +1;
* reward model: with the policy held fixed (so the outcomes keep one distribution), the RM's
  agreement with the outcomes (`rm/agreement`) rises when the RM trains, not when it is frozen
  (`rm.optim.frozen`). Both RM runs play the very same episodes: only the RM differs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from rlanything.agent import rm_roles
from rlanything.storage.artifacts import read_artifact
from rlanything.storage.layout import RunLayout

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "tiny-learn.yaml"
HELD_OUT = 32  # problems
POLICY_MARGIN, NOISE = 0.30, 0.05  # held-out accuracy: rise when learning, at most noise when broken
RM_MARGIN, RM_NOISE = 0.15, 0.10  # RM agreement
SEED = int(os.environ.get("LEARNING_TEST_SEED", "0"))  # run.seed: check the margins hold for other seeds


def train(root: Path, name: str, overrides: list[str]) -> tuple[RunLayout, list[dict]]:
    """A run of tiny-learn.yaml -> its layout and every iteration's summary."""
    from rlanything.flows.training import train_flow

    sets = [f"run.root={root}", f"run.name={name}", f"run.seed={SEED}", "run.plots=false", *overrides]  # no reader
    result = train_flow(str(CONFIG), sets)
    layout = RunLayout(Path(result["run_dir"]))
    summaries = [json.loads((layout.iter_dir(i) / "summary.json").read_text()) for i in range(result["iterations"])]
    return layout, summaries


def held_out_accuracy(layout: RunLayout, iteration: str) -> float:
    """Greedy accuracy of the run's policy at `iteration` ("base" or a number) on held-out
    problems (seeds no training run draws), as `rlanything eval RUN@ITERATION` measures it."""
    from rlanything.flows.evaluation import eval_flow

    result = eval_flow(f"{layout.run_dir}@{iteration}", split="in_domain", problems=HELD_OUT)
    return result["metrics"]["eval/in_domain/accuracy"]


def policy_curve(root: Path, name: str, overrides: list[str] = ()) -> list[float]:
    """Held-out greedy accuracy of the base policy and after the last iteration."""
    layout, summaries = train(root, name, list(overrides))
    curve = [held_out_accuracy(layout, "base"), held_out_accuracy(layout, str(len(summaries) - 1))]
    print(
        f"{name}: held-out greedy accuracy base {curve[0]:.2f} -> {curve[1]:.2f}; rollout accuracy per iteration",
        [round(s["accuracy"], 2) for s in summaries],
    )
    return curve


def signed_policy_advantages(monkeypatch, sign: int) -> list[pd.DataFrame]:
    """Make the advantages step multiply its policy samples' advantages by `sign`: the step looks
    `compute_samples` up in its module when it runs, in this process. -> the frames as computed,
    before the sign, one per call."""
    computed, compute = [], rm_roles.compute_samples

    def signed(*args, **kwargs):
        samples = compute(*args, **kwargs)
        computed.append(samples.copy())
        samples.loc[samples.kind == "policy", "advantage"] *= sign
        return samples

    monkeypatch.setattr(rm_roles, "compute_samples", signed)
    return computed


def assert_every_iteration_signed(layout: RunLayout, computed: list[pd.DataFrame], sign: int) -> None:
    """Every iteration ran the wrapped step (no cached result skipped it) and trained on the
    signed advantages: the policy rows' times `sign`, the RM rows as computed."""
    iterations = len(list(layout.run_dir.glob("iter_*/summary.json")))
    assert iterations > 0 and len(computed) == iterations
    for iteration, samples in enumerate(computed):
        on_disk = read_artifact(layout, iteration, "advantages")
        policy = samples.kind == "policy"
        assert (samples.advantage[policy] != 0).any()  # something to flip
        expected = samples.advantage.where(~policy, sign * samples.advantage).to_numpy()
        assert on_disk.kind.tolist() == samples.kind.tolist()
        assert on_disk.advantage.to_numpy() == pytest.approx(expected)  # float32 on disk


# the policy-only arm: no RM judges or trains, the outcome alone teaches (config._check_no_rm)
NO_RM = ["rm.judgments_per_step=0", "algo.lam=0", "rm.optim.frozen=true", "adapt.enabled=false"]


def test_policy_learns(prefect_server, tmp_path, monkeypatch):
    computed = signed_policy_advantages(monkeypatch, +1)  # the control's wrapper, the sign left alone
    base, last = policy_curve(tmp_path, "learn", NO_RM)
    assert last - base >= POLICY_MARGIN
    layout = RunLayout(tmp_path / "learn")
    assert_every_iteration_signed(layout, computed, +1)
    for i in (0, 1):  # nothing was judged, and every trainable step was a policy sample
        assert read_artifact(layout, i, "judgments").empty
        samples, outcomes = read_artifact(layout, i, "advantages"), read_artifact(layout, i, "outcomes")
        steps = read_artifact(layout, i, "rollouts")
        assert set(samples.kind) == {"policy"}
        assert len(samples) == steps.traj_id.isin(outcomes[outcomes.valid & ~outcomes.pending].traj_id).sum() > 0


def test_policy_with_flipped_advantages_does_not_learn(prefect_server, tmp_path, monkeypatch):
    computed = signed_policy_advantages(monkeypatch, -1)
    base, last = policy_curve(tmp_path, "flipped", NO_RM)  # the learning run's, but for the sign
    assert last - base < NOISE
    assert_every_iteration_signed(RunLayout(tmp_path / "flipped"), computed, -1)


@pytest.fixture(scope="module")
def rm_runs(prefect_server, tmp_path_factory):
    """Two runs with the policy frozen: the RM trained, and the RM frozen."""
    root = tmp_path_factory.mktemp("rm-runs")
    # one allowed letter: ~8% successes, so the outcomes leave the RM room to improve its agreement
    frozen_policy = ["policy.optim.frozen=true", "run.iterations=4", "env.options.letters=a"]
    return {
        name: train(root, name, [*frozen_policy, *extra])
        for name, extra in (("rm-trained", []), ("rm-frozen", ["rm.optim.frozen=true"]))
    }


def agreement(summaries: list[dict]) -> tuple[float, float]:
    """RM agreement with the outcomes: iteration 0 (base RM) and the mean of the last two."""
    values = [s["rm/agreement"] for s in summaries]
    return values[0], sum(values[-2:]) / 2


def test_rm_runs_judge_the_same_episodes(rm_runs):
    """The control is fair: with the policy frozen both runs play identical episodes."""
    (trained, _), (frozen, _) = rm_runs["rm-trained"], rm_runs["rm-frozen"]
    for iteration in range(4):
        a, b = (read_artifact(layout, iteration, "outcomes") for layout in (trained, frozen))
        assert a.outcome.tolist() == b.outcome.tolist()


@pytest.mark.parametrize("name", ["rm-trained", "rm-frozen"])
def test_rm_agreement_rises_only_when_the_rm_trains(rm_runs, name):
    _, summaries = rm_runs[name]
    first, last = agreement(summaries)
    print(f"{name}: rm/agreement per iteration", [round(s["rm/agreement"], 2) for s in summaries])
    if name == "rm-trained":
        assert last - first >= RM_MARGIN
    else:
        assert last - first < RM_NOISE
