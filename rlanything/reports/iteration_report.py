"""What a person reads in the MLflow UI without downloading anything: plots, a markdown
summary, and a few trajectories rendered as text.

The UI lists Parquet files but cannot preview them (measured here), so each iteration also gets
  curves.png     the run's metrics over iterations so far (accuracy, mean outcome, RM agreement
                 and parse rate, losses, KL, task adaptation decisions, step wall times)
  iteration.png  this iteration: accuracy per task, advantages, RM verdicts vs outcomes, lengths
  tasks.png      task adaptation so far: each buffer slot's accuracy over iterations (a new
                 marker where an accepted rewrite replaced the slot's version, pending
                 rewrites hollow) and the cumulative count of accepted tasks
  summary.md     headline metrics against the previous iteration, step states (Cached = resumed
                 from Prefect's persisted result), adaptation decisions, every metric
  samples.md     a few trajectories: task, prompt, response, action, observation, judgments
The history comes from the run folder's `iter_NNNN/summary.json` files, not from MLflow, so the
plots do not depend on what the tracking server holds. Plots are drawn on bare `Figure`s, which
render with matplotlib's Agg canvas without touching pyplot's global backend (so importing this
module in a notebook leaves inline plots alone).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from rlanything import metric_names as names
from rlanything.algo.curriculum import task_accuracy
from rlanything.pipeline import STEPS
from rlanything.storage.artifacts import artifact_schema, read_artifact
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import atomic_write, write_text

# panel title -> metrics drawn in it, over iterations
CURVES = {
    "Outcomes": [names.ACCURACY, names.MEAN_OUTCOME],
    "Reward model": [
        names.RM_AGREEMENT,
        names.RM_PARSE_RATE,
        names.RM_OUTCOME_ACCURACY,
        names.RM_OUTCOME_AUROC,
        names.RM_PROCESS_ACCURACY,  # environments with step labels only
        names.RM_SCORE_GAP,
    ],
    "Losses": names.update_metrics("loss"),
    "KL to the generating model (k3)": names.update_metrics("kl"),
    "Updates: clip fraction, entropy (nats)": [*names.update_metrics("clip_frac"), *names.update_metrics("entropy")],
    "Learning rate (an iteration's last step)": names.update_metrics("lr_last"),
    "Task adaptation": [*map(names.adapt_metric, ("proposed", "accepted", "rejected")), names.ADAPT_ACCEPTED_TOTAL],
}
HEADLINE = [
    names.ACCURACY,
    names.MEAN_OUTCOME,
    names.RM_AGREEMENT,
    names.RM_OUTCOME_ACCURACY,
    names.RM_OUTCOME_AUROC,
    names.RM_PROCESS_ACCURACY,  # environments with step labels (TextWorld, reasoning-gym)
    names.RM_SCORE_GAP,
    names.RM_PARSE_RATE,
    names.UNIT_TESTS_PARSE_RATE,  # rm.role unit_tests (coding)
    names.UNIT_TESTS_CORRECT_RATE,
    names.UNIT_TESTS_VERDICT_AGREEMENT,
    *names.update_metrics("loss"),
    *names.update_metrics("kl"),
    *(
        names.update_metric(kind, m)
        for kind in names.UPDATE_KINDS
        for m in ("clip_frac", "entropy", "grad_norm", "optimizer_steps")
    ),
    names.POLICY_KEPT,
    names.RM_KEPT,
    names.adapt_metric("accepted"),
    names.adapt_metric("rejected"),
]
TEXT_LIMIT = 1500  # characters of one field shown in samples.md


def metric_history(layout: RunLayout, upto: int) -> pd.DataFrame:
    """Metrics of iterations 0..upto that have a summary.json, one row per iteration."""
    rows = {}
    for iteration in range(upto + 1):
        path = layout.iter_dir(iteration) / "summary.json"
        if path.exists():
            rows[iteration] = json.loads(path.read_text())
    return pd.DataFrame.from_dict(rows, orient="index").drop(columns="iteration", errors="ignore").sort_index()


def plot_curves(history: pd.DataFrame, out: Path) -> Path:
    """curves.png: one panel per entry of CURVES plus the step wall times, x = iteration."""
    fig = Figure(figsize=(20, 8), layout="constrained")
    axes = fig.subplots(2, 4)
    for ax, (title, keys) in zip(axes.flat, CURVES.items()):
        drawn = [k for k in keys if k in history]
        for key in drawn:
            ax.plot(history.index, history[key], marker="o", label=key)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    ax = axes.flat[len(CURVES)]
    bottom = np.zeros(len(history))
    for step in STEPS:
        key = names.step_time(step)
        if key in history:
            values = history[key].fillna(0).to_numpy(float)
            ax.bar(history.index, values, bottom=bottom, label=step)
            bottom += values
    ax.set_title("Step wall time (s)")
    ax.set_xlabel("iteration")
    ax.legend(fontsize=8)
    for ax in axes.flat:
        ax.set_xlim(history.index.min() - 0.5, history.index.max() + 0.5)
        ax.set_xticks(history.index)
    fig.suptitle(f"run {out.parent.parent.name}: metrics over iterations")
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=80, format="png"))
    return out


def plot_iteration(layout: RunLayout, iteration: int, out: Path) -> Path:
    """iteration.png: accuracy per task, policy advantages, RM verdicts by outcome, lengths."""
    outcomes, steps, judgments, adv = (
        read_artifact(layout, iteration, n) for n in ("outcomes", "rollouts", "judgments", "advantages")
    )
    fig = Figure(figsize=(18, 4), layout="constrained")
    axes = fig.subplots(1, 4)

    valid = outcomes[outcomes.valid]
    acc = pd.Series(task_accuracy(valid.outcome.to_numpy(), valid.task_id.to_numpy())).sort_index()
    pending = valid.groupby("task_id").pending.first()
    bars = axes[0].bar(acc.index, acc.to_numpy(), color=["tab:orange" if pending[t] else "tab:blue" for t in acc.index])
    axes[0].bar_label(bars, fmt="%.2f", fontsize=7)
    axes[0].set_ylim(0, 1)
    axes[0].set_title("accuracy per task (orange: pending rewrite)")
    axes[0].tick_params(axis="x", labelrotation=60, labelsize=7)

    for kind, color in (("policy", "tab:blue"), ("rm", "tab:green")):
        values = adv[adv.kind == kind].advantage
        if len(values):
            axes[1].hist(values, bins=20, alpha=0.6, color=color, label=f"{kind} ({len(values)})")
    axes[1].set_title("advantages" if len(adv) else "advantages (no sample this iteration)")
    if len(adv):  # none where every task left the band and nothing was judged
        axes[1].legend(fontsize=8)

    merged = judgments.merge(outcomes[["traj_id", "outcome"]], on="traj_id")
    table = pd.crosstab(merged.outcome, merged.step_score).reindex(index=[-1, 1], columns=[-1, 0, 1], fill_value=0)
    axes[2].imshow(table.to_numpy(), cmap="Blues")
    for (i, j), count in np.ndenumerate(table.to_numpy()):
        axes[2].text(j, i, str(count), ha="center", va="center")
    axes[2].set_xticks(range(3), ["-1", "unparsed", "+1"])
    axes[2].set_yticks(range(2), ["-1", "+1"])
    axes[2].set_xlabel("RM step score")
    axes[2].set_ylabel("trajectory outcome")
    axes[2].set_title("RM verdicts vs outcomes")

    axes[3].hist(steps.response_tokens, bins=20, alpha=0.6, label="policy step")
    axes[3].hist(judgments.response_ids.map(len), bins=20, alpha=0.6, label="RM judgment")
    axes[3].set_title("response lengths (tokens)")
    axes[3].legend(fontsize=8)
    fig.suptitle(f"iteration {iteration}")
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=80, format="png"))
    return out


def adaptation_history(layout: RunLayout, upto: int) -> pd.DataFrame:
    """adaptation.parquet of iterations 0..upto stacked, with an `iteration` column."""
    frames = []
    for iteration in range(upto + 1):
        if layout.artifact(iteration, "adaptation").exists():
            frames.append(read_artifact(layout, iteration, "adaptation").assign(iteration=iteration))
    if not frames:
        return pd.DataFrame(columns=artifact_schema("adaptation").names + ["iteration"])
    return pd.concat(frames, ignore_index=True)


def slot_accuracy(history: pd.DataFrame) -> pd.DataFrame:
    """Accuracy of each slot's regular (active) version: index iteration, columns slot.

    >>> slot_accuracy(pd.DataFrame({"iteration": [0, 0, 1], "slot": [0, 1, 0], "role": ["regular"] * 3,
    ...                             "accuracy": [0.5, 1.0, 0.25]})).to_dict()
    {0: {0: 0.5, 1: 0.25}, 1: {0: 1.0, 1: nan}}
    """
    regular = history[history.role == "regular"]
    return regular.pivot_table(index="iteration", columns="slot", values="accuracy", aggfunc="first", dropna=False)


def accepted_counts(history: pd.DataFrame) -> pd.DataFrame:
    """Pending rewrites judged per iteration: columns accepted, rejected, accepted_total
    (cumulative), one row per iteration in `history`."""
    iterations = sorted(history.iteration.unique())
    pending = history[history.role == "pending"]
    decided = pending.groupby(["iteration", "decision"]).size().unstack(fill_value=0)
    decided = decided.reindex(index=iterations, columns=["accepted", "rejected"], fill_value=0).fillna(0).astype(int)
    return decided.assign(accepted_total=decided.accepted.cumsum())


def plot_tasks(history: pd.DataFrame, band: tuple[float, float], out: Path) -> Path:
    """tasks.png: left, accuracy of each slot's active version per iteration (one line per slot;
    `vN` printed where an accepted rewrite changed the version; pending rewrites as hollow
    markers at the iteration that measured them); right, accepted and rejected rewrites per
    iteration and the cumulative count of accepted tasks."""
    fig = Figure(figsize=(15, 5), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[2, 1])
    regular, pending = history[history.role == "regular"], history[history.role == "pending"]
    accuracy, cmap = slot_accuracy(history), matplotlib.colormaps["tab20"]
    for slot in accuracy.columns:
        color = cmap(int(slot) % 20)
        left.plot(accuracy.index, accuracy[slot], marker="o", ms=4, color=color, alpha=0.8, label=f"slot {slot}")
        rows = regular[regular.slot == slot].sort_values("iteration")
        changed = rows.version.ne(rows.version.shift()) & (rows.version > 0)
        for row in rows[changed].itertuples(index=False):
            left.annotate(
                f"v{row.version}",
                (row.iteration, row.accuracy),
                textcoords="offset points",
                xytext=(3, 4),
                fontsize=7,
                color=color,
            )
        tried = pending[pending.slot == slot]
        left.scatter(tried.iteration, tried.accuracy, s=40, facecolors="none", edgecolors=color)
    for edge in band:
        left.axhline(edge, color="grey", ls="--", lw=1)
    left.set_ylim(-0.05, 1.05)
    left.set_title("accuracy per task slot (dashed: band; hollow: pending rewrite; vN: accepted version)")
    if 0 < len(accuracy.columns) <= 20:
        left.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))

    counts = accepted_counts(history)
    right.bar(counts.index, counts.accepted, color="tab:green", label="accepted")
    right.bar(counts.index, counts.rejected, bottom=counts.accepted, color="tab:red", alpha=0.6, label="rejected")
    right.plot(counts.index, counts.accepted_total, marker="o", color="black", label="accepted tasks (cumulative)")
    right.set_title("rewrites judged per iteration")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.set_xticks(counts.index)
    fig.suptitle(f"run {out.parent.parent.name}: task adaptation")
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=80, format="png"))
    return out


def _text(value) -> str:
    """A nullable string cell as text ("" for None/NaN)."""
    return "" if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def summary_markdown(layout: RunLayout, iteration: int, history: pd.DataFrame, states: dict[str, str]) -> str:
    """The iteration in a page: step states, headline metrics vs the previous iteration,
    adaptation decisions and every metric."""
    now = history.loc[iteration]
    before = history.loc[iteration - 1] if iteration - 1 in history.index else None
    lines = [f"# Run `{layout.run_dir.name}`, iteration {iteration}", ""]
    lines += [
        "Steps: " + " → ".join(f"{s} ({states.get(s, '?')})" for s in STEPS),
        "",
        "`Cached`: the step had finished in an earlier attempt; its result came back from Prefect.",
        "",
    ]
    if now.get(names.RM_GUARD_ALARM, 0) == 1:  # algo/rm_accuracy.py: the reward-hacking alarm
        lines += [
            f"**Reward model flagged**: its judgments stopped predicting outcomes (outcome accuracy "
            f"{_fmt(now.get(names.RM_OUTCOME_ACCURACY))}, score gap {_fmt(now.get(names.RM_SCORE_GAP))}); "
            f"the policy's λ this iteration: {_fmt(now.get(names.RM_GUARD_LAM))}.",
            "",
        ]
    lines += ["| metric | this iteration | previous |", "|---|---|---|"]
    for key in HEADLINE:
        if key in now and pd.notna(now[key]):
            prev = _fmt(before[key]) if before is not None and key in before and pd.notna(before[key]) else ""
            lines.append(f"| {key} | {_fmt(now[key])} | {prev} |")
    adaptation = read_artifact(layout, iteration, "adaptation")
    lines += ["", "## Task adaptation", ""]
    if len(adaptation):
        lines += ["| task | role | accuracy | direction | decision | reason |", "|---|---|---|---|---|---|"]
        for row in adaptation.itertuples(index=False):
            reason = _text(row.reason).replace("|", "/").replace("\n", " ")[:120]
            acc = "" if pd.isna(row.accuracy) else f"{row.accuracy:.2f}"
            lines.append(f"| {row.task_id} | {row.role} | {acc} | {_text(row.direction)} | {row.decision} | {reason} |")
    else:
        lines.append("No task was measured.")
    lines += ["", "## All metrics", "", "| metric | value |", "|---|---|"]
    lines += [f"| {key} | {_fmt(now[key])} |" for key in sorted(now.index) if pd.notna(now[key])]
    return "\n".join(lines) + "\n"


def _clip(text: str | None) -> str:
    text = _text(text)
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + f"\n… [{len(text) - TEXT_LIMIT} more characters]"


def _block(title: str, text: str | None) -> list[str]:
    return [f"**{title}**", "", "```text", _clip(text).replace("```", "'''"), "```", ""]


def pick_trajectories(outcomes: pd.DataFrame, count: int) -> list[int]:
    """Up to `count` traj_ids, successes first, then failures, from as many tasks as possible.

    >>> pick_trajectories(pd.DataFrame({"traj_id": [0, 1, 2, 3], "task_id": ["a", "a", "b", "b"],
    ...                                 "outcome": [-1, 1, -1, -1]}), 2)
    [1, 2]
    """
    ranked = outcomes.assign(first=~outcomes.task_id.duplicated()).sort_values(
        ["outcome", "first", "traj_id"], ascending=[False, False, True]
    )
    chosen, tasks = [], set()
    for row in ranked.itertuples(index=False):  # one per task first
        if row.task_id not in tasks and len(chosen) < count:
            chosen.append(int(row.traj_id))
            tasks.add(row.task_id)
    for traj_id in ranked.traj_id:
        if len(chosen) < count and int(traj_id) not in chosen:
            chosen.append(int(traj_id))
    return chosen


def render_trajectories(layout: RunLayout, iteration: int, count: int = 3) -> str:
    """samples.md: a few trajectories step by step, with the RM's judgments of each step."""
    outcomes, episodes, steps, judgments = (
        read_artifact(layout, iteration, n) for n in ("outcomes", "episodes", "rollouts", "judgments")
    )
    first, first_screen = (
        episodes.set_index("traj_id").first_observation,
        episodes.set_index("traj_id").first_screenshot,
    )
    lines = [f"# Run `{layout.run_dir.name}`, iteration {iteration}: sample trajectories", ""]
    for traj_id in pick_trajectories(outcomes, count):
        out = outcomes.set_index("traj_id").loc[traj_id]
        lines += [
            f"## Trajectory {traj_id}: task {out.task_id}, rollout {out.rollout_idx}",
            "",
            f"outcome **{int(out.outcome):+d}**, {out.num_steps} step(s), termination `{out.termination}`"
            + (", pending rewrite (not trained)" if out.pending else "")
            + ("" if out.valid else f", invalid: {out.error}"),
            "",
        ]
        lines += _block("Task (first observation)", first.get(traj_id))
        if _text(first_screen.get(traj_id)):  # screenshots/ sits beside samples.md
            lines += [f"![the screen at the start]({first_screen.get(traj_id)})", ""]
        for step in steps[steps.traj_id == traj_id].sort_values("step_idx").itertuples(index=False):
            lines += [f"### Step {step.step_idx}", ""]
            if step.step_idx == 0:
                lines += _block("Prompt the policy saw", step.prompt)
            lines += _block(f"Response ({step.response_tokens} tokens, finish: {step.finish_reason})", step.response)
            lines += [f"**Action**: `{_text(step.action) or '(none)'}` ({step.action_status})", ""]
            lines += _block("Observation", step.observation)
            if _text(step.screenshot):
                lines += [f"![the screen after step {step.step_idx}]({step.screenshot})", ""]
            judged = judgments[(judgments.traj_id == traj_id) & (judgments.step_idx == step.step_idx)]
            scores = ", ".join(f"{s:+d}" if p else "unparsed" for s, p in zip(judged.step_score, judged.parsed))
            lines += [f"**Judgments** ({len(judged)}): {scores}", ""]
            for j in judged.sort_values("judge_idx").itertuples(index=False):
                lines += _block(
                    f"judgment {j.judge_idx} ({j.verdict_mode}): box {j.raw_box!r}, score {j.step_score:+d}",
                    j.reasoning,
                )
    return "\n".join(lines) + "\n"


def write_reports(
    layout: RunLayout, iteration: int, states: dict[str, str], band: tuple[float, float], plots: bool
) -> list[Path]:
    """Write curves.png, tasks.png, iteration.png (with `plots`), summary.md and samples.md into
    iter_NNNN/ (after its summary.json); returns their paths for MLflow, the run-level plots first."""
    folder = layout.iter_dir(iteration)
    history = metric_history(layout, iteration)
    summary, samples = folder / "summary.md", folder / "samples.md"
    write_text(summary_markdown(layout, iteration, history, states), summary)
    write_text(render_trajectories(layout, iteration), samples)
    if not plots:
        return [summary, samples]
    tasks = plot_tasks(adaptation_history(layout, iteration), band, folder / "tasks.png")
    return [
        plot_curves(history, folder / "curves.png"),
        tasks,
        plot_iteration(layout, iteration, folder / "iteration.png"),
        summary,
        samples,
    ]
