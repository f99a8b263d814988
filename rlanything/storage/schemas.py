"""One explicit pyarrow schema per artifact (docs/architecture.md).

Column names equal the variable names used in code. Ids: `task_id` names one version of a
problem ("s003v01" = slot 3, version 1); `traj_id` numbers the trajectories of an iteration.
"""

import pyarrow as pa

_ids = [
    pa.field("traj_id", pa.int32(), nullable=False),
    pa.field("task_id", pa.string(), nullable=False),
    pa.field("slot", pa.int32(), nullable=False),
    pa.field("version", pa.int32(), nullable=False),
    pa.field("rollout_idx", pa.int32(), nullable=False),
]

ROLLOUTS = pa.schema(
    _ids
    + [
        pa.field("step_idx", pa.int32(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("response", pa.string(), nullable=False),
        pa.field("action", pa.string()),  # null when the response held no parseable action
        pa.field("action_status", pa.string(), nullable=False),
        pa.field("observation", pa.string(), nullable=False),
        pa.field("done", pa.bool_(), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("response_tokens", pa.int32(), nullable=False),
        pa.field("pending", pa.bool_(), nullable=False),  # a rewrite under evaluation: no training
        pa.field("screenshot", pa.string()),  # PNG of the screen after the step, relative to iter_NNNN/
        pa.field("weights", pa.string(), nullable=False),  # checkpoint that generated it (run-relative) or base path
    ]
)

EPISODES = pa.schema(
    _ids
    + [
        pa.field("first_observation", pa.string(), nullable=False),  # the task as the policy saw it
        pa.field("num_steps", pa.int32(), nullable=False),
        pa.field("termination", pa.string(), nullable=False),  # done | max_steps | env_error
        pa.field("error", pa.string()),
        pa.field("pending", pa.bool_(), nullable=False),
        pa.field("first_screenshot", pa.string()),  # PNG of the screen the episode began with
        pa.field("live_outcome", pa.int8()),  # the verifier at the episode's end (non-replayable envs)
    ]
)

OUTCOMES = pa.schema(
    _ids
    + [
        pa.field("outcome", pa.int8(), nullable=False),
        pa.field("num_steps", pa.int32(), nullable=False),
        pa.field("termination", pa.string(), nullable=False),  # done | max_steps | env_error
        pa.field("valid", pa.bool_(), nullable=False),  # False: environment failure, never trains
        pa.field("error", pa.string()),
        pa.field("pending", pa.bool_(), nullable=False),
        pa.field("verified_by", pa.string(), nullable=False),  # replay | live | step_cap | env_error
        # ground-truth tests passed / run, for environments that count them (coding); else null
        pa.field("tests_passed", pa.int32()),
        pa.field("tests_total", pa.int32()),
    ]
)

# Ground-truth labels of single steps, for environments that know them (envs.base.step_labels):
# one row per labelled step of a verified trajectory; empty for the others. Read by the RM's
# process accuracy (algo.rm_accuracy.process_accuracy), never by the reward.
STEP_LABELS = pa.schema(
    [
        pa.field("traj_id", pa.int32(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("step_idx", pa.int32(), nullable=False),
        pa.field("label", pa.int8(), nullable=False),  # +1 a good step, -1 a bad one
        pa.field("rule", pa.string(), nullable=False),  # which case of the environment's rule gave it
    ]
)

# Where both options of a constrained verdict were scored: the judge's P(+1), its two options'
# first-token probabilities at rm.temperature renormalised over the two (`Choice.pick`'s draw);
# else null. Less noisy than the m drawn verdicts: rm/p_plus_mean, the AUROC of P(+1).
P_PLUS = pa.field("p_plus", pa.float32())

LATER_COLUMNS = frozenset({"unchosen_logprobs", "p_plus"})
"""Nullable columns added to a schema after runs had written it (December 7): a file written
without them reads with them null (`storage.parquet.read_table`), so older runs still resume,
replay and re-judge. Any other difference is a schema mismatch."""

JUDGMENTS = pa.schema(
    [
        pa.field("traj_id", pa.int32(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("step_idx", pa.int32(), nullable=False),
        pa.field("judge_idx", pa.int32(), nullable=False),
        pa.field("verdict_mode", pa.string(), nullable=False),  # free | constrained
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("reasoning", pa.string(), nullable=False),
        pa.field("raw_box", pa.string()),
        pa.field("step_score", pa.int8(), nullable=False),  # -1 / +1, 0 when unparseable
        pa.field("parsed", pa.bool_(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
        # a constrained verdict scored with both options (a direct verdict, or an engine that scores
        # after the reasoning): the log-probs of the verdict not drawn (opener, option, closer); else
        # null. With `logprobs` it gives both options' probabilities (algo.rm_verdicts expected)
        pa.field("unchosen_logprobs", pa.list_(pa.float32())),
        P_PLUS,
        pa.field("weights", pa.string(), nullable=False),  # the RM checkpoint folder that judged
    ]
)

# algo.rm_target progress: the Monte-Carlo value of the states before and after each sampled step
# (agent.branching) and its progress, what the RM's judgments of that step are paid for. Empty
# with the paper's target.
PROGRESS = pa.schema(
    [
        pa.field("traj_id", pa.int32(), nullable=False),
        pa.field("step_idx", pa.int32(), nullable=False),
        pa.field("value_before", pa.float64()),  # V(s_t): mean outcome of the continuations; null: none valid
        pa.field("value_after", pa.float64()),  # V(s_t+1); the outcome where the step ended the episode
        pa.field("progress", pa.float64()),  # value_after - value_before (algo.mc_progress)
    ]
)

# rm.role unit_tests (coding): the RM's generated tests, one row per (problem, test), and
# the pass matrix, one row per (test, solution). Empty when the RM judges steps.
UNIT_TESTS = pa.schema(
    [
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("test_idx", pa.int32(), nullable=False),
        pa.field("style", pa.string(), nullable=False),  # assert | stdio
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("response", pa.string(), nullable=False),  # the RM's text
        pa.field("test", pa.string()),  # the parsed test as JSON ({"code"} or {"input", "output"}); null: unparsed
        pa.field("parsed", pa.bool_(), nullable=False),
        pa.field("parse_error", pa.string()),  # why it could not be parsed
        pa.field("correct", pa.bool_(), nullable=False),  # passes every solution that passes the ground truth
        pa.field("incorrect_caught", pa.int32(), nullable=False),  # incorrect solutions it fails
        pa.field("reward", pa.float32(), nullable=False),  # algo.unit_test_rewards.unit_test_rewards; -2 unparsed
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("weights", pa.string(), nullable=False),  # the RM checkpoint folder that wrote it
    ]
)

PASS_MATRIX = pa.schema(
    [
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("test_idx", pa.int32(), nullable=False),
        pa.field("traj_id", pa.int32(), nullable=False),  # the policy solution
        pa.field("passed", pa.bool_(), nullable=False),  # the generated test passes on it
        pa.field("solution_correct", pa.bool_(), nullable=False),  # it passes every ground-truth test
    ]
)

ADVANTAGES = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),  # policy | rm
        pa.field("traj_id", pa.int32(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("step_idx", pa.int32(), nullable=False),
        pa.field("judge_idx", pa.int32(), nullable=False),  # -1 for policy samples; test_idx for unit tests
        pa.field("reward", pa.float32(), nullable=False),
        pa.field("advantage", pa.float32(), nullable=False),
        pa.field("kept", pa.bool_(), nullable=False),
        pa.field("drop_reason", pa.string()),
    ]
)

UPDATE = pa.schema(
    [
        pa.field("update_idx", pa.int32(), nullable=False),  # the iteration's optimizer step, from 0
        pa.field("epoch", pa.int32(), nullable=False),  # the pass over the samples it belongs to
        pa.field("num_samples", pa.int32(), nullable=False),
        pa.field("num_tokens", pa.int32(), nullable=False),
        pa.field("loss", pa.float32(), nullable=False),
        pa.field("pg_loss", pa.float32(), nullable=False),
        pa.field("kl", pa.float32(), nullable=False),
        pa.field("anchor_kl", pa.float32()),  # k3 KL to the run's starting weights (null: optim.anchor_beta 0)
        pa.field("clip_frac", pa.float32(), nullable=False),
        pa.field("entropy", pa.float32(), nullable=False),  # mean next-token entropy on response tokens
        pa.field("grad_norm", pa.float32(), nullable=False),  # before clipping
        pa.field("lr", pa.float32(), nullable=False),
        # |trainer - sampler| log-prob per response token of the step's samples (null: not recomputed)
        pa.field("mismatch_abs_mean", pa.float32()),
        pa.field("mismatch_abs_max", pa.float32()),
        pa.field("mismatch_outside_cap", pa.float32()),  # ratio outside [1/C, C]
    ]
)

ADAPTATION = pa.schema(
    [
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("slot", pa.int32(), nullable=False),
        pa.field("version", pa.int32(), nullable=False),
        pa.field("role", pa.string(), nullable=False),  # regular (maybe rewritten) | pending (judged)
        pa.field("accuracy", pa.float32()),  # null: no valid rollout measured it
        pa.field("parent_accuracy", pa.float32()),  # pending rows: the accuracy it must beat
        pa.field("num_rollouts", pa.int32(), nullable=False),
        pa.field("direction", pa.string()),  # harder | easier | null (inside the band)
        pa.field("critic_summary", pa.string()),
        pa.field("rewrite", pa.string()),  # the environment model's answer that was kept (or the last)
        pa.field("candidate_id", pa.string()),  # the pending version proposed
        pa.field("candidate_spec", pa.string()),
        pa.field("attempts", pa.int32(), nullable=False),
        pa.field("decision", pa.string(), nullable=False),
        # regular: in_band | proposed | no_valid_rewrite | slot_busy | disabled
        # pending: accepted | rejected
        pa.field("reason", pa.string()),  # why: the acceptance rule's reason, or the rewrite errors
    ]
)

TASKS = pa.schema(
    [
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("slot", pa.int32(), nullable=False),
        pa.field("version", pa.int32(), nullable=False),
        pa.field("parent_id", pa.string()),
        pa.field("spec", pa.string(), nullable=False),  # JSON the environment builds a problem from
        pa.field("status", pa.string(), nullable=False),  # active | pending | rejected | retired
        pa.field("direction", pa.string()),
        pa.field("critic_summary", pa.string()),
        pa.field("accuracy", pa.float32()),  # last measured accuracy
        pa.field("parent_accuracy", pa.float32()),
        pa.field("decision", pa.string()),
        pa.field("created_iter", pa.int32(), nullable=False),
        pa.field("decided_iter", pa.int32()),
    ]
)

EVAL_EPISODES = pa.schema(
    [
        pa.field("split", pa.string(), nullable=False),  # in_domain | ood
        pa.field("env_kind", pa.string(), nullable=False),
        pa.field("problem_idx", pa.int32(), nullable=False),  # position in the split's held-out list
        pa.field("spec", pa.string(), nullable=False),  # JSON the environment built the problem from
        pa.field("first_observation", pa.string(), nullable=False),
        pa.field("outcome", pa.int8(), nullable=False),  # ±1; -1 at the step cap or when invalid
        pa.field("valid", pa.bool_(), nullable=False),  # False: the environment or verifier failed
        pa.field("success", pa.bool_(), nullable=False),  # outcome +1, with the env's answer fallback
        pa.field("strict_success", pa.bool_(), nullable=False),  # outcome +1, no step read by the fallback
        pa.field("boxed", pa.bool_(), nullable=False),  # every step's answer came from a \boxed{}
        pa.field("fallback_steps", pa.int32(), nullable=False),  # steps whose action the fallback read
        pa.field("num_steps", pa.int32(), nullable=False),
        pa.field("termination", pa.string(), nullable=False),  # done | max_steps | env_error
        pa.field("error", pa.string()),
        pa.field("prompt_tokens", pa.int32(), nullable=False),  # summed over the episode's steps
        pa.field("response_tokens", pa.int32(), nullable=False),
        pa.field("truncated_steps", pa.int32(), nullable=False),  # steps that hit max_new_tokens
        pa.field("actions", pa.list_(pa.string()), nullable=False),
        pa.field("last_response", pa.string(), nullable=False),
        pa.field("weights", pa.string(), nullable=False),  # the checkpoint (run-relative) or model folder
        pa.field(
            "iteration", pa.int32()
        ),  # the run's iteration whose checkpoint played; -1: its base; null: a bare model
    ]
)

# eval/<...>/steps.parquet beside episodes.parquet: every step of every held-out episode, what the
# RM judges (its response and the observation that answered it). Kept so that a later evaluation
# of the same weights can reuse the episodes and still have them judged by another RM.
EVAL_STEPS = pa.schema(
    [
        pa.field("split", pa.string(), nullable=False),
        pa.field("problem_idx", pa.int32(), nullable=False),  # the episode's row in episodes.parquet
        pa.field("step_idx", pa.int32(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),  # <split>-NNNNN, as the rollout loop named it
        pa.field("response", pa.string(), nullable=False),
        pa.field("observation", pa.string(), nullable=False),
    ]
)

# eval/<...>/step_labels.parquet: the environment's ground-truth label of each step of the valid
# held-out episodes the RM judged (envs.base.step_labels), where the environment knows them; what
# the RM's process accuracy and AUROC are measured against. `last`: the episode's last step (a won
# game's shows the win message: its verdict is read off, not judged, so it is reported apart).
EVAL_STEP_LABELS = pa.schema(
    [
        pa.field("split", pa.string(), nullable=False),
        pa.field("problem_idx", pa.int32(), nullable=False),
        *(STEP_LABELS.field(name) for name in ("step_idx", "label", "rule")),
        pa.field("last", pa.bool_(), nullable=False),
    ]
)

# Artifact name (iter_NNNN/<name>.parquet, as `storage/layout.py` PIPELINE lists them) -> its schema:
# the one place the pairing is written; read and write artifacts through `storage/artifacts.py`.
# eval/<...>/judgments.parquet beside episodes.parquet: the RM of the evaluated checkpoint on the
# held-out episodes (agent/eval_judge.py), one row per (episode, step, judgment). The token ids
# and log-probs of training's JUDGMENTS are left out: nothing trains on these.
EVAL_JUDGMENTS = pa.schema(
    [
        pa.field("split", pa.string(), nullable=False),  # in_domain | ood
        pa.field("problem_idx", pa.int32(), nullable=False),  # the episode's row in episodes.parquet
        pa.field("step_idx", pa.int32(), nullable=False),
        pa.field("judge_idx", pa.int32(), nullable=False),  # 0 .. m-1
        pa.field("verdict_mode", pa.string(), nullable=False),  # free | constrained
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("reasoning", pa.string(), nullable=False),
        pa.field("raw_box", pa.string()),
        pa.field("step_score", pa.int8(), nullable=False),  # -1 / +1, 0 when unparseable
        pa.field("parsed", pa.bool_(), nullable=False),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("response_tokens", pa.int32(), nullable=False),
        P_PLUS,
        pa.field("weights", pa.string(), nullable=False),  # the RM that judged (run-relative or model spec)
        pa.field("iteration", pa.int32()),  # as in episodes.parquet: -1 the base, null a bare model
    ]
)


ARTIFACTS = {
    "rollouts": ROLLOUTS,
    "episodes": EPISODES,
    "outcomes": OUTCOMES,
    "step_labels": STEP_LABELS,
    "judgments": JUDGMENTS,
    "progress": PROGRESS,
    "unit_tests": UNIT_TESTS,
    "pass_matrix": PASS_MATRIX,
    "advantages": ADVANTAGES,
    "policy_update": UPDATE,
    "rm_update": UPDATE,
    "adaptation": ADAPTATION,
}
