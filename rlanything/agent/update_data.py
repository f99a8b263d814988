"""Steps 5–6's library side, Prefect-free: what an update trains on (`to_samples`, the policy's
kept steps, the RM's kept judgments or generated tests), the job it runs (`update_job`: from the
previous iteration's checkpoint, or the base, to this one's), running it (`train_model`) and
what it reports (`update_metrics`).

Both models start from the previous iteration's checkpoint (weights and AdamW moments) and write
this iteration's, even when no sample survived the filters, so the next iteration always has one
to load. The exception is an RM the run never loads nor trains (no RM in the loop,
`agent.run_context.saved_models`): its update writes an empty rm_update.parquet and no
checkpoint, which would only copy its base weights; whoever needs them takes the base.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pandas as pd

from rlanything.agent.run_context import model_path, saved_models
from rlanything.algo.advantages import expected_verdict_advantages
from rlanything.algo.mismatch import combine_steps
from rlanything.config import Config, PolicyConfig, RewardModelConfig
from rlanything.metric_names import STEP_MEASURES, update_metric
from rlanything.models.engines.generation import Choice
from rlanything.models.judge import chosen_tokens, verdict_choice
from rlanything.models.loading import load_tokenizer
from rlanything.models.precision import recompute_old_logprobs, run_precision
from rlanything.models.training.distributed import UpdateJob, launch_update, run_update
from rlanything.models.training.trainer import Sample
from rlanything.progress import progress
from rlanything.seeding import derive_seed
from rlanything.storage.artifacts import artifact_rows, read_artifact
from rlanything.storage.layout import RunLayout
from rlanything.storage.schemas import UPDATE


def to_samples(rows: pd.DataFrame, choice: Choice | None = None) -> list[Sample]:
    """rows with prompt_ids, response_ids, logprobs, advantage (and step_score with `choice`)
    -> trainer samples; with `choice`, each trains only the tokens its RM chose
    (`judge.chosen_tokens`: the constrained verdict's appended tokens are left out)."""
    return [
        Sample(
            list(r.prompt_ids) + list(r.response_ids),
            len(r.response_ids),
            list(r.logprobs),
            float(r.advantage),
            trained=None if choice is None else chosen_tokens(list(r.response_ids), int(r.step_score), choice),
        )
        for r in rows.itertuples(index=False)
    ]


def steps_taken(layout: RunLayout, kind: str, iteration: int) -> int:
    """Optimizer steps `kind` took in iterations 0..iteration-1 (their update artifacts): where
    the lr schedule stands when this iteration's update starts, the same on a resume."""
    return sum(artifact_rows(layout, i, f"{kind}_update") for i in range(iteration))


def update_job(
    config: Config,
    layout: RunLayout,
    iteration: int,
    kind: str,
    section: PolicyConfig | RewardModelConfig,
    first_step: int,
) -> UpdateJob:
    """The update of `kind` in `iteration`: from the previous checkpoint (or the base) to this one."""
    optim = section.optim
    precision = run_precision(config, layout.run_dir)[kind]
    generation, update = precision["generation"].precision, precision["update"].precision
    recompute = recompute_old_logprobs(config.algo.old_logprobs, generation, update)
    # replayed judgments are an older RM's: their ratio must start from this update's weights
    recompute = recompute or (kind == "rm" and config.rm.replay_iterations > 0)
    if config.algo.tis_cap is not None and not recompute:
        logging.getLogger(__name__).warning(
            "algo.tis_cap is off for the %s update: old_logprobs auto resolved to the sampler's "
            "(generation and update both fp32); set algo.old_logprobs trainer to use it",
            kind,
        )
    return UpdateJob(
        start=str(model_path(config, layout, kind, iteration).resolve()),
        out=str(layout.checkpoint(kind, iteration).resolve()),
        precision=update,
        recompute_old=recompute,
        tis_cap=config.algo.tis_cap if recompute else None,
        anchor=str(model_path(config, layout, kind, 0).resolve()) if optim.anchor_beta else None,
        anchor_beta=optim.anchor_beta,
        gradient_checkpointing=optim.gradient_checkpointing,
        train_top_layers=optim.train_top_layers,
        lora=section.lora.model_dump(),
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        grad_clip=optim.grad_clip,
        updates=optim.updates_per_iteration,
        micro_batch_size=optim.micro_batch_size,
        temperature=section.temperature,
        clip_eps=config.algo.clip_eps,
        kl_beta=config.algo.kl_beta,
        seed=derive_seed(config.run.seed, iteration, f"{kind}_update"),
        epochs=optim.epochs,
        first_step=first_step,
        warmup_steps=optim.warmup_steps,
        schedule=optim.schedule,
        total_steps=optim.total_steps or config.run.iterations * optim.epochs * optim.updates_per_iteration,
        min_lr_ratio=optim.min_lr_ratio,
        device=section.device,
        memory_gb=config.run.memory_gb,
        # the run's first weights, as a bf16 sampler ran them: its ties are not left for the first
        # update's sign to decide, nor its steps hidden under half an ulp (models.precision.dither_to_bf16_)
        dither_start_to="bf16" if generation == "bf16" and iteration == 0 else None,
        extra={"kind": kind, "iteration": iteration},
    )


def train_model(config: Config, layout: RunLayout, iteration: int, kind: str, samples: list[Sample]) -> list[dict]:
    """The update of `kind` ("policy" or "rm") in `iteration` on `samples`: from the previous
    checkpoint (or the base) to this iteration's, in this process or in the processes of
    `train.launch` -> its history (one row per optimizer step, UPDATE). A frozen model trains on
    nothing (its checkpoint keeps the start weights); a model the run never loads nor trains
    (`saved_models`) gets no checkpoint and an empty history."""
    section = config.policy if kind == "policy" else config.rm
    samples = [] if section.optim.frozen else samples  # a control run: the checkpoint keeps the start weights
    if kind not in saved_models(config):
        return []
    job = update_job(config, layout, iteration, kind, section, steps_taken(layout, kind, iteration))
    if config.train.launch:  # DDP / DeepSpeed processes of their own (train.launch)
        job_path = layout.iter_dir(iteration).resolve() / ".jobs" / f"{kind}_update.json"
        return launch_update(job, samples, config.train.launch, job_path)
    with progress(f"iter {iteration}: {kind}_update", len(samples)) as advance:
        return run_update(job, samples, config.train.backend, on_micro_batch=advance)


def update_metrics(kind: str, history: list[dict], first_step: int) -> tuple[dict, list[tuple[int, dict]]]:
    """The update's sample-weighted measures, its lr, mismatch and tokens; and every optimizer
    step's measures at x = the run's optimizer step (the step task logs them: MLflow charts them
    per step) -> (metrics, [(step, measures)])."""
    frame = pd.DataFrame(history, columns=UPDATE.names)
    weights = frame.num_samples / frame.num_samples.sum()
    metrics = {update_metric(kind, key): float((frame[key] * weights).sum()) for key in STEP_MEASURES}
    metrics[update_metric(kind, "lr_last")] = float(frame.lr.iloc[-1])
    if frame.anchor_kl.notna().any():  # the drift from the run's start (optim.anchor_beta)
        metrics[update_metric(kind, "anchor_kl")] = float((frame.anchor_kl * weights).sum())
    metrics |= mismatch_metrics(kind, frame)
    metrics[f"tokens/{kind}_trained"] = int(frame.num_tokens.sum())
    per_step = [
        (first_step + row.update_idx, {f"{kind}_step/{key}": getattr(row, key) for key in (*STEP_MEASURES, "lr")})
        for row in frame.itertuples(index=False)
    ]
    return metrics, per_step


def mismatch_metrics(kind: str, frame: pd.DataFrame) -> dict[str, float]:
    """The iteration's sampler/trainer gap from its first pass's steps (each sample once):
    token-weighted mean and share outside the cap, the largest gap; none where not recomputed."""
    first = frame[frame.epoch == 0]
    if first.mismatch_abs_mean.isna().all():
        return {}
    gap = combine_steps(first.mismatch_abs_mean, first.mismatch_abs_max, first.mismatch_outside_cap, first.num_tokens)
    return {f"mismatch/{kind}_{key}": value for key, value in gap.items()}


def policy_samples(layout: RunLayout, iteration: int) -> list[Sample]:
    """The policy's kept rollout steps of `iteration` (its advantages artifact) as trainer samples."""
    adv = read_artifact(layout, iteration, "advantages")
    kept = adv[(adv.kind == "policy") & adv.kept][["traj_id", "step_idx", "advantage"]]
    steps = read_artifact(layout, iteration, "rollouts")
    return to_samples(kept.merge(steps, on=["traj_id", "step_idx"], how="inner", validate="one_to_one"))


def unit_test_samples_of(layout: RunLayout, iteration: int) -> list[Sample]:
    """rm.role unit_tests: the RM's kept generated tests of `iteration` as trainer samples (judge_idx = test_idx)."""
    adv = read_artifact(layout, iteration, "advantages")
    tests = read_artifact(layout, iteration, "unit_tests").rename(columns={"test_idx": "judge_idx"})
    kept = adv[(adv.kind == "rm") & adv.kept][["task_id", "judge_idx", "advantage"]]
    return to_samples(kept.merge(tests, on=["task_id", "judge_idx"], how="inner", validate="one_to_one"))


def judgment_samples(config: Config, layout: RunLayout, iteration: int, chosen_only: bool) -> list[Sample]:
    """The RM's kept judgments of `iteration` (its advantages artifact) and, with
    `rm.replay_iterations` K, of the K iterations before it (marked `replayed`, with the
    advantages they were given then), as trainer samples; with `chosen_only`, each marks the
    tokens its RM chose (`to_samples`). With `algo.rm_verdicts` expected, each judged step
    with kept judgments gives its two verdicts instead (`expected_verdict_samples`)."""
    choice = None
    if chosen_only:  # the RM's tokenizer spells the appended verdict tokens
        choice = verdict_choice(load_tokenizer(model_path(config, layout, "rm", iteration)))
    samples = []
    for i in range(max(0, iteration - config.rm.replay_iterations), iteration + 1):
        adv, judgments = read_artifact(layout, i, "advantages"), read_artifact(layout, i, "judgments")
        kept = adv[(adv.kind == "rm") & adv.kept][["traj_id", "step_idx", "judge_idx", "advantage"]]
        rows = kept.merge(judgments, on=["traj_id", "step_idx", "judge_idx"], how="inner", validate="one_to_one")
        if config.algo.rm_verdicts == "expected":
            first_unit = len(samples)  # units never repeat
            samples += expected_verdict_samples(rows, choice, first_unit, stratified=config.algo.rm_stratify)
        else:
            samples += [replace(s, replayed=i < iteration) for s in to_samples(rows, choice)]
    return samples


def expected_verdict_samples(
    rows: pd.DataFrame, choice: Choice, first_unit: int = 0, stratified: bool = False
) -> list[Sample]:
    """`algo.rm_verdicts` expected: the kept judgments `rows` (as `to_samples` reads them, with
    unchosen_logprobs) -> two samples per judged step, its +1 and its -1 direct verdict, each
    training its decision token with the advantage of `expected_verdict_advantages`: the payoff
    a = advantage * S_j of the step's judgments (one value a step under `rm_advantage: reward`)
    and the judge's probabilities of the two verdicts, read from the first option tokens' recorded
    log-probs. The two samples of a step are one `Sample.unit` (numbered from `first_unit`): every
    mini-batch holds both or neither, so the update's first step is exact for the steps in its
    mini-batch; later mini-batches see moved weights, as a second epoch does. With `stratified`
    (algo.rm_stratify) a step's `Sample.stratum` is the sign of its payoff (1, -1, or 0: paid
    nothing), so every mini-batch holds the steps paid towards +1 and towards -1 in the pass's
    proportions. Raises ValueError
    for a judgment without both options' log-probs, or a step whose judgments disagree on the
    payoff."""
    steps = []
    for (traj_id, step_idx), step in rows.groupby(["traj_id", "step_idx"], sort=True):
        payoff = step.advantage.to_numpy() * step.step_score.to_numpy()
        if abs(payoff.max() - payoff.min()) > 1e-9 * (abs(payoff).max() + 1):
            raise ValueError(
                f"step {step_idx} of trajectory {traj_id}: its judgments' payoffs differ {payoff.tolist()}"
            )
        row = step.iloc[0]
        if row.unchosen_logprobs is None:
            raise ValueError(
                f"step {step_idx} of trajectory {traj_id}: the judgment lacks the unchosen verdict's log-probs "
                "(algo.rm_verdicts expected needs direct constrained verdicts judged by this version)"
            )
        score = int(row.step_score)
        verdicts = {score: (list(row.response_ids), list(row.logprobs))}
        verdicts[-score] = (choice.opener + choice.options[-score] + choice.closer, list(row.unchosen_logprobs))
        steps.append((list(row.prompt_ids), float(payoff[0]), verdicts))
    if not steps:
        return []
    first = len(choice.opener)  # the decision token's place in a direct verdict
    plus, minus = (np.array([v[s][1][first] for _, _, v in steps]) for s in (1, -1))
    advantages = expected_verdict_advantages(np.array([a for _, a, _ in steps]), plus, minus)
    return [
        Sample(
            prompt + tail,
            len(tail),
            logprobs,
            float(adv),
            trained=chosen_tokens(tail, verdict, choice),
            unit=first_unit + k,
            stratum=int(np.sign(paid)) if stratified else None,
        )
        for k, ((prompt, paid, verdicts), pair) in enumerate(zip(steps, advantages))
        for verdict, adv in zip((1, -1), pair)
        for tail, logprobs in [verdicts[verdict]]
    ]
