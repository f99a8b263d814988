r"""Greedy evaluation of a policy on held-out problems (`rlanything eval`).

One episode per held-out problem, decoded greedily (temperature 0: the argmax token at every
position, so an evaluation is a deterministic function of the weights and the problems), through
the same multi-turn loop as training rollouts (`play`). The verifier is asked when the episode
ends, in the process that played it; an episode that reached the step cap is a failure, one whose
environment crashed is recorded as invalid (`valid` False, its error kept) and left out of the
accuracy, as in training.

Per episode we record whether the answers came from a \boxed{}: `success` is the outcome with
the environment's answer fallback (`env.answer_fallback`: an unboxed response read as its last
number, first word or last code block), `strict_success` the same outcome only where no step needed the fallback, and `boxed`
whether every step's answer was boxed. With `answer_fallback: none` the two successes agree.

Held-out problems come from the environment's `heldout_specs` (see envs/heldout.py for how they
are kept apart from training); `heldout_problems` also drops any spec the run's buffer held.

No evaluation is played twice. Greedy decoding makes a split's episodes a function of what
`play_key` hashes: the policy's weights (`storage.checkpoints.weights_digest`), the split's
problems, the environment's and the policy's generation settings, the token budget and
rlanything's own source. A policy that did not change between two evaluations (a frozen policy,
`policy.optim.frozen`; the same checkpoint evaluated again) therefore reuses the episodes of the
earlier one (`earlier_split`) instead of playing them again, and the RM's judgments too where
`rm_key` (the RM's weights and settings, on those episodes) is also unchanged; an RM that changed
judges the reused episodes again, from their steps (steps.parquet). The RM's sampling seed is not
in `rm_key`: the same RM on the same episodes measures the same thing, its judgments are reused
whatever the iteration that first drew them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from rlanything.agent.play import play
from rlanything.algo.metrics import wilson_interval
from rlanything.algo.parsing import FALLBACKS
from rlanything.envs.base import Environment, make_env, replayable
from rlanything.envs.heldout import SPLITS, drop_trained, heldout_specs
from rlanything.models.engines.generation import GenerationEngine
from rlanything.models.engines.make import make_engine
from rlanything.storage.buffer import read_buffer
from rlanything.storage.parquet import read_table
from rlanything.storage.schemas import EVAL_EPISODES, EVAL_JUDGMENTS, EVAL_STEPS


class ScoredEnv:
    """An environment that asks its verifier when the episode is closed (before closing it).

    Attributes the rollout loop looks for (system_prompt, last_screenshot, replayable, ...)
    are those of the wrapped environment. Non-replayable environments were already asked at the
    end of the live episode (`live_outcome`), so they are not asked twice."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self.outcome_value: int | None = None
        self.outcome_error: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, spec):
        return self.env.reset(spec)

    def step(self, action):
        return self.env.step(action)

    def outcome(self) -> int:
        return self.env.outcome()

    def close(self) -> None:
        try:
            if replayable(self.env):
                self.outcome_value = int(self.env.outcome())
        except Exception as err:  # a crashing verifier is recorded, never a silent -1
            self.outcome_error = f"verifier: {type(err).__name__}: {err}"
        finally:
            self.env.close()


def heldout_problems(env_config, split: str, n: int, run_seed: int, trained: list[dict]) -> tuple[list[dict], int]:
    """The first `n` held-out specs of `split` that the run never met -> (specs, dropped).

    `trained`: every spec the run's buffer ever held (all versions; [] for a bare model);
    `run_seed`: the seed its initial buffer was drawn with. Twice as many candidates as needed
    are drawn, so a few collisions with model-written rewrites still leave `n`."""
    candidates = heldout_specs(env_config, split, 2 * n, run_seed)
    return drop_trained(candidates, trained, n)


def play_greedy(
    engine: GenerationEngine,
    tokenizer,
    env_config,
    specs: list[dict],
    split: str,
    *,
    max_new_tokens: int,
    seed: int = 0,
    make: Callable[[], Environment] | None = None,
) -> list[dict]:
    """Play each spec once, greedily -> one row per episode (see `episode_row`)."""
    return play_greedy_steps(
        engine, tokenizer, env_config, specs, split, max_new_tokens=max_new_tokens, seed=seed, make=make
    )[0]


def play_greedy_steps(
    engine: GenerationEngine,
    tokenizer,
    env_config,
    specs: list[dict],
    split: str,
    *,
    max_new_tokens: int,
    seed: int = 0,
    make: Callable[[], Environment] | None = None,
) -> tuple[list[dict], list[dict]]:
    """`play_greedy`, also returning `play`'s step rows (traj_id = problem_idx, step_idx, response,
    observation, ...): what the RM judges (agent/eval_judge.py)."""
    envs: list[ScoredEnv] = []

    def new_env() -> ScoredEnv:
        env = ScoredEnv((make or (lambda: make_env(env_config)))())
        envs.append(env)  # play creates them in task order, one per task (group size 1)
        return env

    tasks = [
        {"task_id": f"{split}-{k:05d}", "slot": k, "version": 0, "spec": spec, "pending": False}
        for k, spec in enumerate(specs)
    ]
    steps, trajectories = play(
        engine,
        tokenizer,
        new_env,
        tasks,
        group_size=1,
        max_steps=env_config.max_steps,
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        top_p=1.0,
        seed=seed,
        answer_fallback=env_config.answer_fallback,
    )
    by_traj: dict[int, list[dict]] = {}
    for row in steps:
        by_traj.setdefault(row["traj_id"], []).append(row)
    rows = []
    for k, traj in enumerate(sorted(trajectories, key=lambda t: t["traj_id"])):
        traj_steps = sorted(by_traj.get(k, []), key=lambda r: r["step_idx"])
        rows.append(episode_row(split, env_config.kind, k, specs[k], traj, traj_steps, envs[k]))
    return rows, steps


def episode_row(split: str, kind: str, index: int, spec: dict, traj: dict, steps: list[dict], env: ScoredEnv) -> dict:
    """One row of eval episodes.parquet (schema EVAL_EPISODES) from `play`'s records."""
    termination, error = traj["termination"], traj["error"]
    valid, outcome = termination != "env_error", -1
    if termination == "done":
        verdict = env.outcome_value if replayable(env.env) else traj["live_outcome"]
        if verdict is None:
            valid, error = False, env.outcome_error or "verifier: no outcome recorded"
        else:
            outcome = int(verdict)
    statuses = [s["action_status"] for s in steps]
    fallback_steps = sum(s in FALLBACKS for s in statuses)  # read by a fallback, not from a box
    success = valid and outcome == 1
    return {
        "split": split,
        "env_kind": kind,
        "problem_idx": index,
        "spec": json.dumps(spec, sort_keys=True),
        "first_observation": traj["first_observation"],
        "outcome": outcome,
        "valid": valid,
        "success": success,
        "strict_success": success and fallback_steps == 0,
        "boxed": bool(statuses) and all(s == "ok" for s in statuses),
        "fallback_steps": fallback_steps,
        "num_steps": len(steps),
        "termination": termination,
        "error": error,
        "prompt_tokens": sum(s["prompt_tokens"] for s in steps),
        "response_tokens": sum(s["response_tokens"] for s in steps),
        "truncated_steps": sum(s["finish_reason"] == "length" for s in steps),
        "actions": [s["action"] for s in steps],
        "last_response": steps[-1]["response"] if steps else "",
    }


def step_rows(split: str, steps: list[dict]) -> list[dict]:
    """`play`'s step records of a split (traj_id = problem_idx) -> EVAL_STEPS rows."""
    columns = ("step_idx", "task_id", "response", "observation")
    return [{"split": split, "problem_idx": row["traj_id"], **{k: row[k] for k in columns}} for row in steps]


def _digest(blob: dict) -> str:
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]


@functools.cache
def source_digest() -> str:
    """sha256 of rlanything's Python source: a later version may prompt, parse or verify
    differently, so its evaluations reuse none of an earlier version's episodes."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def play_key(config, split: str, specs: list[dict], weights_digest: str | None, precision: str) -> str | None:
    """What decides a split's greedy episodes, hashed (module docstring), with the policy's
    resolved generation `precision`; None without a weights digest (weights that are no
    folder): such episodes are never reused."""
    if weights_digest is None:
        return None
    # the weights say the model; `precision` is hashed resolved (auto and bf16 alike where they agree)
    policy = config.policy.model_dump(mode="json", exclude={"model", "optim", "precision"})
    blob = {
        "weights": weights_digest,
        "split": split,
        "specs": specs,
        "env": config.env.model_dump(mode="json"),
        "policy": policy,
        "precision": precision,
        "max_new_tokens": config.eval.max_new_tokens or config.policy.max_new_tokens,
        "source": source_digest(),
    }
    return _digest(blob)


def rm_key(config, weights_digest: str | None, episodes_key: str | None, precision: str) -> str | None:
    """What decides the RM's judgments of a split's episodes (`play_key` `episodes_key`),
    hashed: the RM's weights, its settings (rm.*, but the seed; module docstring) and its
    resolved generation `precision`."""
    if weights_digest is None or episodes_key is None:
        return None
    rm = config.rm.model_dump(mode="json", exclude={"model", "optim", "precision"})
    return _digest({"weights": weights_digest, "rm": rm, "episodes": episodes_key, "precision": precision})


@dataclass(frozen=True)
class EarlierSplit:
    """One split of an earlier evaluation (its folder, its summary.json row) whose episodes a new
    evaluation reuses."""

    folder: Path
    row: dict

    @property
    def played_in(self) -> str:
        """The evaluation that played the episodes ("eval/iter_0000"), through any reuse chain."""
        return self.row.get("episodes_from") or f"eval/{self.folder.name}"

    @property
    def judged_in(self) -> str:
        return self.row.get("judgments_from") or f"eval/{self.folder.name}"

    def _rows(self, name: str, schema) -> pd.DataFrame:
        frame = read_table(self.folder / name, schema)
        return frame[frame.split == self.row["split"]].reset_index(drop=True)

    def episodes(self) -> pd.DataFrame:
        return self._rows("episodes.parquet", EVAL_EPISODES)

    def steps(self) -> pd.DataFrame:
        return self._rows("steps.parquet", EVAL_STEPS)

    def judgments(self, key: str | None) -> pd.DataFrame | None:
        """Its RM's judgments of the split where its `rm_key` is `key` (the RM and its settings
        unchanged: the judgments a new one would draw), else None (judge again)."""
        if key is None or self.row.get("rm_key") != key or not (self.folder / "judgments.parquet").is_file():
            return None
        return self._rows("judgments.parquet", EVAL_JUDGMENTS)


def earlier_split(folders: list[Path], split: str, specs: list[dict], keys: dict) -> EarlierSplit | None:
    """The split `split` of an earlier evaluation in `folders` (each with a summary.json) with the
    same `play_key` as `keys` -> its episodes are this evaluation's; one whose `rm_key` is also
    the same first (its judgments are too). None: play. The files must hold the split's episodes
    of `specs` in order and their steps (a summary.json that names a key its files no longer
    hold, as after a crash between the two writes, is passed over)."""
    if keys.get("play_key") is None:
        return None
    matches = []
    for folder in folders:
        path = Path(folder) / "summary.json"
        rows = json.loads(path.read_text()).get("splits", []) if path.is_file() else []
        matches += [
            EarlierSplit(Path(folder), r) for r in rows if r["split"] == split and r.get("play_key") == keys["play_key"]
        ]
    matches.sort(key=lambda m: keys.get("rm_key") is None or m.row.get("rm_key") != keys["rm_key"])
    wanted = [json.dumps(spec, sort_keys=True) for spec in specs]
    for match in matches:
        if (match.folder / "steps.parquet").is_file() and match.episodes().spec.tolist() == wanted:
            return match
    return None


def trained_specs(run_dir: str | None) -> list[dict]:
    """Every spec a run's task buffer ever held (every snapshot, every version and status)."""
    if run_dir is None:
        return []
    specs = {}
    for snapshot in sorted((Path(run_dir) / "tasks").glob("v*.parquet")):
        for spec in read_buffer(snapshot).spec:
            specs[spec] = json.loads(spec)
    return list(specs.values())


def play_split(
    config, weights: str, specs: list[dict], split: str, precision: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The policy in `weights` plays `specs` greedily in `precision` -> (episodes, EVAL_STEPS
    steps); its engine is gone when this returns (before the RM loads)."""
    engine, tokenizer = make_engine(config.policy, "policy", Path(weights), precision)
    max_new_tokens = config.eval.max_new_tokens or config.policy.max_new_tokens
    rows, steps = play_greedy_steps(engine, tokenizer, config.env, specs, split, max_new_tokens=max_new_tokens)
    episodes = pd.DataFrame(rows) if rows else pd.DataFrame(columns=EVAL_EPISODES.names)
    return episodes, pd.DataFrame(step_rows(split, steps), columns=EVAL_STEPS.names)


def merged_splits(path: Path, schema, parts: list[str], evaluated: set[str]) -> pd.DataFrame:
    """The splits' part files (removed) and the rows of the earlier `path` whose split is not
    evaluated again now (kept beside the new ones), in `SPLITS` order."""
    frames = [read_table(Path(p), schema) for p in parts]
    if path.exists():  # an earlier evaluation in this folder
        earlier = read_table(path, schema)
        frames.insert(0, earlier[~earlier.split.isin(evaluated)])
    frames = [f for f in frames if len(f)] or [pd.DataFrame(columns=schema.names)]
    merged = pd.concat(frames, ignore_index=True)
    for part in parts:
        Path(part).unlink()
    return merged.sort_values("split", key=lambda s: s.map(SPLITS.index), kind="stable", ignore_index=True)


PROVENANCE = ("play_key", "rm_key", "episodes_from", "judgments_from")
"""The keys of a summary.json split row that say where its episodes and judgments come from
(`agent.eval_parts.play_and_judge`'s provenance): what a later evaluation compares to reuse them."""


def is_nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def split_provenance(out: Path, parts: list[dict], evaluated: set[str]) -> dict[str, dict]:
    """split -> its `PROVENANCE`: this evaluation's for the splits evaluated now, the earlier
    summary.json's for the splits kept from it."""
    earlier = json.loads((out / "summary.json").read_text())["splits"] if (out / "summary.json").exists() else []
    kept = {r["split"]: {k: r.get(k) for k in PROVENANCE} for r in earlier if r["split"] not in evaluated}
    return kept | {part["split"]: part["provenance"] for part in parts}


def rate(flags: pd.Series) -> float:
    """Mean of a boolean series, NaN when empty."""
    return float(flags.mean()) if len(flags) else math.nan


def success_summary(episodes: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """One row per group of `episodes` with the held-out metrics.

    episodes: one row per evaluated episode with boolean columns `valid` (False: the
    environment failed; not counted in n, counted in env_errors), `success` (outcome +1, with
    the environment's answer fallback), `strict_success` (outcome +1 and every answer came from
    a \boxed{}) and `boxed` (every step's answer was boxed); `by`: grouping columns (e.g.
    ["split"] or ["env_kind", "split"]).
    -> columns by + n, successes, accuracy, ci_low, ci_high, strict_accuracy, strict_ci_low,
    strict_ci_high, fallback_accuracy (= accuracy), format_rate, env_errors.

    >>> frame = pd.DataFrame({"split": ["a"] * 4, "valid": [True] * 4, "success": [True, True, False, False],
    ...                       "strict_success": [True, False, False, False], "boxed": [True, False, True, False]})
    >>> row = success_summary(frame, ["split"]).iloc[0]
    >>> int(row.n), float(row.accuracy), float(row.strict_accuracy), float(row.format_rate)
    (4, 0.5, 0.25, 0.5)
    """
    rows = []
    for key, group in episodes.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        valid = group[group.valid.astype(bool)]
        n, k, strict = len(valid), int(valid.success.sum()), int(valid.strict_success.sum())
        low, high = wilson_interval(k, n)
        s_low, s_high = wilson_interval(strict, n)
        accuracy = k / n if n else math.nan
        rows.append(
            {
                **dict(zip(by, key)),
                "n": n,
                "successes": k,
                "accuracy": accuracy,
                "ci_low": low,
                "ci_high": high,
                "strict_accuracy": strict / n if n else math.nan,
                "strict_ci_low": s_low,
                "strict_ci_high": s_high,
                "fallback_accuracy": accuracy,
                "format_rate": rate(valid.boxed.astype(bool)),
                "env_errors": int((~group.valid.astype(bool)).sum()),
            }
        )
    columns = [
        *by,
        "n",
        "successes",
        "accuracy",
        "ci_low",
        "ci_high",
        "strict_accuracy",
        "strict_ci_low",
        "strict_ci_high",
        "fallback_accuracy",
        "format_rate",
        "env_errors",
    ]
    return pd.DataFrame(rows, columns=columns)
