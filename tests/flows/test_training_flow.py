"""Two iterations of the tiny config through real Prefect, real MLflow (SQLite) and Parquet."""

import json
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from rlanything.config import ConfigError
from rlanything.models.loading import load_model, resolve_model_path
from rlanything.storage import schemas
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import read_table

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = {
    "rollouts": schemas.ROLLOUTS,
    "episodes": schemas.EPISODES,
    "outcomes": schemas.OUTCOMES,
    "step_labels": schemas.STEP_LABELS,
    "judgments": schemas.JUDGMENTS,
    "unit_tests": schemas.UNIT_TESTS,
    "pass_matrix": schemas.PASS_MATRIX,
    "advantages": schemas.ADVANTAGES,
    "policy_update": schemas.UPDATE,
    "rm_update": schemas.UPDATE,
    "adaptation": schemas.ADAPTATION,
}


@pytest.fixture(scope="module")
def run(prefect_server, tmp_path_factory):
    from rlanything.flows.training import train_flow

    root = tmp_path_factory.mktemp("runs")
    overrides = [f"run.root={root}", "run.name=e2e", "env.num_problems=4", "policy.tasks_per_iteration=3"]
    overrides += ["policy.optim.epochs=2", "policy.optim.warmup_steps=6"]  # PPO epochs, lr warmup across iterations
    result = train_flow(str(REPO / "configs" / "tiny.yaml"), overrides)
    return result, overrides


def test_every_step_wrote_its_artifacts_with_their_schemas(run):
    result, _ = run
    layout = RunLayout(Path(result["run_dir"]))
    for iteration in (0, 1):
        tables = {name: read_table(layout.artifact(iteration, name), schema) for name, schema in ARTIFACTS.items()}
        steps, outcomes, judgments = tables["rollouts"], tables["outcomes"], tables["judgments"]
        assert len(outcomes) == 3 * 4  # tasks_per_iteration × group_size
        assert set(outcomes.outcome) <= {-1, 1} and outcomes.valid.all()
        assert len(steps) == outcomes.num_steps.sum()  # one row per step
        assert (steps.response_tokens == steps.response_ids.map(len)).all()
        assert (steps.logprobs.map(len) == steps.response_tokens).all()
        per_step = judgments.groupby(["traj_id", "step_idx"]).size()
        assert len(per_step) == len(steps) and (per_step == 3).all()  # m judgments of every step
        assert set(judgments.step_score) <= {-1, 1} and judgments.parsed.all()  # constrained mode
        assert tables["unit_tests"].empty and tables["pass_matrix"].empty  # rm.role judge writes no tests
        assert outcomes.tests_passed.isna().all() and outcomes.tests_total.isna().all()  # no test suite here
        # reasoning-gym: the one step of every trainable trajectory is labelled with its outcome
        labels = tables["step_labels"].merge(outcomes, on=["traj_id", "task_id"])
        assert len(labels) == len(steps) and (labels.step_idx == 0).all() and (labels.label == labels.outcome).all()
        assert set(labels.rule) == {"answer"}
        adv = tables["advantages"]
        assert (adv.kind == "policy").sum() == len(steps) and (adv.kind == "rm").sum() == len(judgments)
        # updates_per_iteration (tiny.yaml) × epochs; the lr warms up over the run's first 6 steps
        update = tables["policy_update"]
        assert update.update_idx.tolist() == [0, 1, 2, 3] and update.epoch.tolist() == [0, 0, 1, 1]
        warm = [1 / 6, 2 / 6, 3 / 6, 4 / 6] if iteration == 0 else [5 / 6, 1, 1, 1]
        assert update.lr.tolist() == pytest.approx([1e-4 * w for w in warm], rel=1e-6)
        assert update.clip_frac.iloc[0] == 0 and update.kl.iloc[0] == pytest.approx(0.0, abs=1e-6)
        assert (update.entropy > 0).all() and (update.grad_norm > 0).all()
        assert len(tables["rm_update"]) == 1 and tables["rm_update"].lr.iloc[0] == pytest.approx(1e-4)
        adaptation = tables["adaptation"]
        assert len(adaptation) == 3 and (adaptation.direction == "easier").all()  # accuracy 0
        # tiny.yaml asks the (random) environment model for rewrites: none parses, each is recorded
        assert (adaptation.decision == "no_valid_rewrite").all() and (adaptation.attempts == 3).all()
        assert adaptation.reason.str.contains("boxed").all() and adaptation.critic_summary.notna().all()
        assert (layout.checkpoint("policy", iteration) / "optimizer.pt").exists()
        assert layout.iteration_done(iteration).exists()
        # every sample names the weights that produced it: the base, then the last checkpoint
        for table, kind, base in (
            (steps, "policy", "builtin:tiny-random"),
            (judgments, "rm", "builtin:tiny-random?seed=1"),
        ):
            served = str(resolve_model_path(base).resolve()) if iteration == 0 else f"checkpoints/{kind}/iter_0000"
            assert set(table.weights) == {served}
        assert set(outcomes.verified_by) <= {"replay", "step_cap"}
    assert layout.tasks_snapshot(2).exists()


def test_weights_changed(run):
    result, _ = run
    layout = RunLayout(Path(result["run_dir"]))
    for kind, base in (("policy", "builtin:tiny-random"), ("rm", "builtin:tiny-random?seed=1")):
        before = load_model(resolve_model_path(base)).state_dict()
        after = load_model(layout.checkpoint(kind, 1)).state_dict()
        changed = [name for name in before if not torch.equal(before[name], after[name])]
        assert len(changed) > len(before) // 2, (kind, changed)


def test_mlflow_holds_params_metrics_and_artifacts(run):
    result, _ = run
    client = MlflowClient(result["mlflow_uri"])
    mlrun = client.get_run(result["mlflow_run_id"])
    assert mlrun.info.status == "FINISHED"
    assert mlrun.data.params["policy.group_size"] == "4" and mlrun.data.params["rm.verdict"] == "constrained"
    for key in (
        "accuracy",
        "mean_outcome",
        "rm/parse_rate",
        "policy/loss",
        "rm/loss",
        "policy/kl",
        "tokens/policy_response",
        "time/rollout_s",
        "time/rm_update_s",
        "rm/outcome_accuracy",
        "rm/score_gap",
        "rm_guard/alarm",
        "rm_guard/lam",
        "rm/process_accuracy",  # reasoning-gym has step labels
        "rm/process_labels",
    ):
        history = client.get_metric_history(mlrun.info.run_id, key)
        assert sorted(m.step for m in history) == [0, 1], key
    # the guard only warns by default: flagged or not, the policy's λ stays algo.lam
    assert [m.value for m in client.get_metric_history(mlrun.info.run_id, "rm_guard/lam")] == [1.0, 1.0]
    # one labelled step per trajectory (3 tasks × 4), each judged: all of them count
    history = lambda key: sorted((m.step, m.value) for m in client.get_metric_history(mlrun.info.run_id, key))  # noqa: E731
    assert history("rm/process_labels") == [(0, 12), (1, 12)]
    assert history("rm/process_accuracy") == history("rm/step_outcome_accuracy")  # label = outcome here
    # every optimizer step's measures, x = the run's optimizer step (4 a policy iteration, 1 for the RM)
    for key in ("policy_step/kl", "policy_step/clip_frac", "policy_step/entropy", "policy_step/grad_norm"):
        assert [step for step, _ in history(key)] == list(range(8)), key
    assert [round(v / 1e-4, 4) for _, v in history("policy_step/lr")] == [0.1667, 0.3333, 0.5, 0.6667, 0.8333, 1, 1, 1]
    assert [step for step, _ in history("rm_step/entropy")] == [0, 1]
    for iteration in ("iter_0000", "iter_0001"):
        names = {Path(a.path).name for a in client.list_artifacts(mlrun.info.run_id, iteration)}
        assert {f"{n}.parquet" for n in ARTIFACTS} | {"summary.json"} <= names, names


def test_rerun_skips_finished_iterations_and_a_changed_config_is_refused(run):
    from rlanything.flows.training import train_flow

    result, overrides = run
    layout = RunLayout(Path(result["run_dir"]))
    stamp = layout.artifact(1, "rollouts").stat().st_mtime_ns
    again = train_flow(str(REPO / "configs" / "tiny.yaml"), overrides)
    assert again["mlflow_run_id"] == result["mlflow_run_id"]
    assert layout.artifact(1, "rollouts").stat().st_mtime_ns == stamp
    with pytest.raises(ConfigError, match="different config"):
        train_flow(str(REPO / "configs" / "tiny.yaml"), overrides + ["algo.lam=0"])


def test_the_verdict_gradient_benchmark_splits_the_rm_gradient_by_token(run, run_benchmark):
    """benchmarks/verdict_gradient.py on this run's first RM mini-batch: the every-token gradient
    is the chosen tokens' and the appended ones' together, so it leans towards both."""
    import re

    result, _ = run
    out = run_benchmark("verdict_gradient", result["run_dir"], "--limit", "4")
    judged, chosen, appended = map(
        int, re.search(r"(\d+) judgments.*\ntokens: (\d+) chosen, (\d+) appended", out).groups()
    )
    assert judged == 4 and chosen >= 4 and appended >= 6 * 4, out  # "\n\boxed{" and "}" at least
    norms = dict(re.findall(r"^(every token|chosen only|appended only) +gradient norm ([\d.]+)$", out, re.M))
    assert len(norms) == 3 and all(float(n) > 0 for n in norms.values()), out
    cos = dict(re.findall(r"^cosine\((.+)\) (-?[\d.]+)$", out, re.M))
    assert 0 < float(cos["every token, chosen only"]) < 1 and 0 < float(cos["every token, appended only"]) < 1


@pytest.mark.parametrize("kind", ["policy", "rm"])
def test_the_update_replay_benchmark_reruns_the_update_on_its_own_samples(run, kind, run_benchmark):
    """benchmarks/update_replay.py on iteration 0 of this run: the update replayed from the
    samples the step trained on (as many as it logged) in fp32 and, on a CPU with bf16 units,
    bf16 (without them the benchmark says so and times fp32 only), and profiled."""
    import re

    import pandas as pd

    from rlanything.models.precision import BF16_FLAGS, cpu_flags

    result, _ = run
    trained = pd.read_parquet(RunLayout(Path(result["run_dir"])).artifact(0, f"{kind}_update"))
    samples = int(trained[trained.epoch == 0].num_samples.sum())  # each kept sample once per epoch
    args = [result["run_dir"], "--kind", kind, "--repeats", "1", "--profile", "--attention", "tree,mask"]
    out = run_benchmark("update_replay", *args, env={"RLANYTHING_CPU_FLAGS": None})  # the suite empties them
    assert int(re.search(r"^   (\d+) samples, \d+ tokens", out, re.M).group(1)) == samples, out
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("RLANYTHING_CPU_FLAGS", raising=False)
        bf16 = bool(set(BF16_FLAGS) & cpu_flags())
    if bf16:
        assert float(re.search(r"bf16 speed-up \(tree; fp32 s / bf16 s\): ([\d.]+)", out).group(1)) > 0
    else:
        assert "bf16 not timed on this CPU" in out, out
    assert float(re.search(r"tree attention speed-up \(fp32; mask s / tree s\): ([\d.]+)", out).group(1)) > 0
    for precision in ("fp32", "bf16") if bf16 else ("fp32",):
        line = re.search(rf"^   {precision} mask: where the update goes \(s, profiled\): (.+)$", out, re.M)
        parts = {k.strip(): float(v) for k, v in re.findall(r"([^,]+?) ([\d.]+)(?:,|$)", line.group(1))}
        assert {"matmuls", "attention", "optimizer and clipping", "other", "total"} <= set(parts), out
        assert parts["matmuls"] > 0 and parts["optimizer and clipping"] > 0, out
        total = parts.pop("total")
        assert abs(sum(parts.values()) - total) <= 0.01 * len(parts), out


def test_the_first_rm_step_benchmark_scores_both_starts_in_both_precisions(run, run_benchmark):
    """benchmarks/first_rm_step.py on this run: rounding the start to bf16 leaves what a bf16
    sampler runs unchanged (the loader's own cast), and a step of lr 1e-9 from the start placed
    within its bf16 values flips a weight's bf16 copy with probability 1e-9 / ulp (a handful of
    the tiny RM's weights): the bf16 P(+1) is the start's to the digit."""
    import re

    result, _ = run
    out = run_benchmark("first_rm_step", result["run_dir"], "--lr", "1e-9", "--prompts", "8")
    assert re.search(r"^   \d+ samples; 8 prompts of iteration 1$", out, re.M), out
    assert re.search(r"^   start weights exactly halfway between two bf16 values: [\d.]+%$", out, re.M), out
    p = dict(re.findall(r"^   (.+): P\(\+1\) scored in bf16 ([\d.]+), in fp32 [\d.]+$", out, re.M))
    assert len(p) == 4, out
    assert (
        p["start as loaded"]
        == p["start rounded to bf16"]
        == p["one step at lr 1e-09 from the start placed within its bf16 values"]
    ), p


def test_the_verdict_prior_benchmark_scores_the_same_prompts_under_two_rms(run, run_benchmark):
    """benchmarks/verdict_prior.py on this run: on iteration 0 the RM that judged is the run's
    starting RM, so both lines print the same P(+1) to the digit; on iteration 1 the judge is
    iteration 0's trained RM, which its lr-1e-4 update moved off the start."""
    import re

    result, _ = run
    line = re.compile(r"^(.+): mean P\(\+1\) ([\d.]+) \(won (?:[\d.]+|n/a), lost (?:[\d.]+|n/a)\), outcome AUROC", re.M)
    for iteration, same in ((0, True), (1, False)):
        out = run_benchmark("verdict_prior", result["run_dir"], "--iteration", str(iteration))
        assert re.search(
            rf"^   iteration {iteration}: \d+ judged steps \(\d+ of won episodes\), (bf16|fp32)$", out, re.M
        )
        p = dict(line.findall(out))
        assert len(p) == 2 and all(0 < float(v) < 1 for v in p.values()), out
        assert (p["the RM that judged them"] == p["builtin:tiny-random?seed=1"]) is same, out


def test_rm_replay_adds_the_earlier_iterations_kept_judgments_and_recomputes_their_logprobs(run):
    """rm.replay_iterations 1 at iteration 1 of this run: the RM trains on iteration 0's kept
    judgments (replayed, with the advantages iteration 0 gave them) and iteration 1's, and the
    update recomputes the old log-probs although this fp32 run would otherwise keep the sampler's."""
    from rlanything.agent.run_context import open_run
    from rlanything.agent.update_data import judgment_samples, update_job

    result, _ = run
    config, layout = open_run(result["run_dir"])
    replaying = config.model_copy(update={"rm": config.rm.model_copy(update={"replay_iterations": 1})})
    kept = []
    for i in (0, 1):
        adv = read_table(layout.artifact(i, "advantages"), schemas.ADVANTAGES)
        kept.append(adv[(adv.kind == "rm") & adv.kept].advantage.tolist())
    assert kept[0] and kept[1]
    plain = judgment_samples(config, layout, 1, chosen_only=False)
    samples = judgment_samples(replaying, layout, 1, chosen_only=False)
    assert len(plain) == len(kept[1]) and not any(s.replayed for s in plain)
    assert [s.replayed for s in samples] == [True] * len(kept[0]) + [False] * len(kept[1])
    assert sorted(s.advantage for s in samples[: len(kept[0])]) == pytest.approx(sorted(kept[0]))
    assert judgment_samples(replaying, layout, 0, chosen_only=False) == judgment_samples(config, layout, 0, False)
    job = lambda c: update_job(c, layout, 1, "rm", c.rm, 0)  # noqa: E731
    assert not job(config).recompute_old and job(replaying).recompute_old
    assert not update_job(replaying, layout, 1, "policy", replaying.policy, 0).recompute_old


def test_expected_verdicts_train_each_judged_steps_two_verdicts(prefect_server, tmp_path, run_benchmark):
    """algo.rm_verdicts expected through the real flow (one iteration, direct verdicts): the RM
    update trains two samples a judged step with kept judgments, not its m = 3 judgments, and
    its weights move; with algo.rm_stratify each step carries its payoff's sign. benchmarks/first_rm_step.py
    then replays that update's variants and prints, for the start as loaded, the paid objective of the
    recorded probabilities of both verdicts."""
    import re

    import numpy as np

    from rlanything.agent.run_context import open_run
    from rlanything.agent.update_data import judgment_samples
    from rlanything.flows.training import train_flow
    from rlanything.models.judge import verdict_choice
    from rlanything.models.loading import load_tokenizer

    overrides = [f"run.root={tmp_path}", "run.name=expected", "run.iterations=1", "env.num_problems=2"]
    overrides += ["policy.tasks_per_iteration=2", "rm.max_new_tokens=0", "rm.train_forced_tokens=false"]
    overrides += ["algo.rm_advantage=reward", "algo.rm_verdicts=expected", "adapt.enabled=false"]
    # two mini-batches, each of whole steps, each with both payoff signs where there are both
    overrides += ["rm.optim.updates_per_iteration=2", "algo.rm_stratify=true"]
    result = train_flow(str(REPO / "configs" / "tiny.yaml"), overrides)
    config, layout = open_run(result["run_dir"])
    adv = read_table(layout.artifact(0, "advantages"), schemas.ADVANTAGES)
    kept = adv[(adv.kind == "rm") & adv.kept]
    judged_steps = kept.groupby(["traj_id", "step_idx"]).ngroups
    assert judged_steps > 0 and len(kept) == 3 * judged_steps
    update = read_table(layout.artifact(0, "rm_update"), schemas.UPDATE)
    assert update.num_samples.sum() == 2 * judged_steps and update.num_tokens.sum() == 2 * judged_steps
    # two mini-batches of whole steps: K steps dealt ceil(K/2) and floor(K/2), never an odd sample count
    halves = [2 * (judged_steps - judged_steps // 2), 2 * (judged_steps // 2)]
    assert sorted(update.num_samples, reverse=True) == [h for h in halves if h]
    samples = judgment_samples(config, layout, 0, chosen_only=True)
    assert [s.advantage > 0 for s in samples[::2]] == [s.advantage < 0 for s in samples[1::2]]
    assert [s.stratum for s in samples] == [int(np.sign(s.advantage)) for s in samples[::2] for _ in (1, -1)]
    start = load_model(resolve_model_path(config.rm.model)).state_dict()
    trained = load_model(layout.checkpoint("rm", 0)).state_dict()
    assert any(not torch.equal(start[k], trained[k]) for k in start)

    judgments = read_table(layout.artifact(0, "judgments"), schemas.JUDGMENTS)
    steps = kept[kept.judge_idx == 0].merge(judgments, on=["traj_id", "step_idx", "judge_idx"])
    first = len(verdict_choice(load_tokenizer(layout.checkpoint("rm", 0))).opener)  # the token after "\\boxed{"
    own, other = (np.array([lp[first] for lp in steps[c]]) for c in ("logprobs", "unchosen_logprobs"))
    p = 1 / (1 + np.exp(np.where(steps.step_score > 0, other - own, own - other)))
    objective = np.mean(steps.advantage * steps.step_score * (2 * p - 1))
    assert steps.p_plus.to_numpy() == pytest.approx(p, abs=1e-5)  # judgments.p_plus: the same P(+1)
    metrics = json.loads((layout.iter_dir(0) / "summary.json").read_text())
    assert metrics["rm/p_plus_mean"] == pytest.approx(judgments.p_plus.mean(), abs=1e-6)
    line = re.compile(
        r"^     on its (\d+) steps: P\(\+1\) (?:[\d.]+|n/a) \(payoff > 0\), (?:[\d.]+|n/a) "
        r"\(payoff < 0\); paid objective (\S+)$",
        re.M,
    )
    variants = (
        [],
        ["--epochs", "2", "--updates", "2", "--sum-balanced"],
        ["--verdicts", "drawn", "--dithered-only"],
        ["--updates", "2", "--fp32-only"],  # the start as loaded, then its one result
    )
    for args in variants:
        out = run_benchmark("first_rm_step", result["run_dir"], "--lr", "1e-5", "--prompts", "4", *args)
        found = line.findall(out)
        starts = 1 if "--fp32-only" in args else 2  # scored before the steps: as loaded (and rounded to bf16)
        assert len(found) == starts + (1 if "--dithered-only" in args or "--fp32-only" in args else 2), out
        assert {int(n) for n, _ in found} == {judged_steps}, out
        assert float(found[0][1]) == pytest.approx(objective, abs=2e-3), (out, objective)
        if "--epochs" in args:  # 2 passes of 2 mini-batches of whole steps, as the update logged them
            assert f"{2 * min(2, judged_steps)} steps at lr 1e-05" in out, out
        if "--fp32-only" in args:  # nothing rounded to or scored in bf16
            scored = [row for row in out.splitlines() if "scored in" in row]
            assert len(scored) == 2 and not any("bf16" in row for row in scored), out
