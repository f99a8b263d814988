"""The benchmarks run in this process (`run_benchmark`, tests/conftest.py: no new interpreter to
start) and the decoding step once as users start it, `python -m benchmarks.decode_step`.

The decoding-step benchmark runs as shipped (a shrunk shape, so it takes seconds): it loads the
shipped model in fp32 and then in bf16 (on a CPU with bf16 units), times both cache layouts in each
and prints numbers that parse. Its timings are not checked here (speed is measured by running it, see docs/benchmarks.md),
only that it still runs against the engine's current code and prints what the docs quote.

Benchmarks time bf16 only on a CPU with bf16 units (benchmarks/common.py): the tests that time
precisions run them on this machine's own flags (without the suite's empty RLANYTHING_CPU_FLAGS,
tests/conftest.py) and expect bf16 where this CPU has the units, and one test pretends a CPU
without them through RLANYTHING_CPU_FLAGS."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlanything.models.precision import BF16_FLAGS, FLAGS_ENV, cpu_flags

REPO = Path(__file__).resolve().parents[1]
NOT_TIMED = "bf16 not timed on this CPU: no bf16 units (neither amx_bf16 nor avx512_bf16 in the flags of {source})"
AVX2_ONLY = "fpu sse4_2 avx fma avx2"  # the flags of a CPU without bf16 units
BF16_FIGURES = r"bf16 ceiling|\| bf16 \||bf16 speed-up|log p bf16|^   bf16:|ours bf16"


def machine_env(**extra: str) -> dict[str, str]:
    """This process's environment without RLANYTHING_CPU_FLAGS (the suite sets it empty): a
    benchmark run in it reads this CPU's own flags from /proc/cpuinfo. `extra` added."""
    return {**{k: v for k, v in os.environ.items() if k != FLAGS_ENV}, **extra}


def machine_has_bf16_units() -> bool:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(FLAGS_ENV, raising=False)
        return bool(set(BF16_FLAGS) & cpu_flags())


DECODE_ARGS = ["--rows", "4", "--steps", "2", "--no-ct2", "--openvino", "none"]


def decode_step_process(*args: str, env: dict[str, str], timeout: int) -> str:
    """The decoding-step benchmark started as users start it (`python -m benchmarks.decode_step`)."""
    command = [sys.executable, "-m", "benchmarks.decode_step", *DECODE_ARGS, *args]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_decode_step_benchmark_prints_both_layouts_in_both_precisions_against_the_limit(run_benchmark):
    """Both precisions asked for: both timed on a CPU with bf16 units, fp32 alone (bf16 said to be
    left out) on one without."""
    precisions = ("fp32", "bf16") if machine_has_bf16_units() else ("fp32",)
    args = ["--shapes", "9:6,12:8", "--precision", "fp32,bf16", "--profile"]
    out = run_benchmark("decode_step", *DECODE_ARGS, *args, env={FLAGS_ENV: None})
    assert re.search(r"^   cpu .+: avx2 (yes|no), avx512f (yes|no), avx512_bf16 (yes|no), amx_bf16", out, re.M)
    assert (NOT_TIMED.format(source="/proc/cpuinfo") in out) == (precisions == ("fp32",)), out
    for name in precisions:
        limit = re.search(rf"{name} ceiling \d+ GFLOP/s .* limit ([\d.]+) ms", out)
        assert limit and float(limit.group(1)) > 0, out
        assert re.search(
            rf"{name}: the Linear layers alone at 4 rows: [\d.]+ ms \(\d+%\); reading the weights once: [\d.]+ ms",
            out,
        )
    lines = re.findall(
        r"shared +(\d+) own +(\d+) \| (fp32|bf16) \| in rows +([\d.]+) ms .* held once +([\d.]+) ms", out
    )
    expected = [(s, o, p) for s, o in (("9", "6"), ("12", "8")) for p in precisions]
    assert [line[:3] for line in lines] == expected, out
    assert all(float(rows) > 0 and float(once) > 0 for *_, rows, once in lines)
    for name in precisions:  # --profile: the last shape's held-once step, split into parts
        line = re.search(rf"{name}: where a held-once step of shape 12:8 goes \(ms, profiled\): (.+)$", out, re.M)
        found = re.findall(r"([^,]+?) ([\d.]+)(?:,|$)", line.group(1).strip()) if line else []
        parts = {part.strip(): ms for part, ms in found}
        assert {"Linear layers", "attention", "sampling (vocab-wide)", "other", "total"} <= set(parts), out
        assert float(parts["Linear layers"]) > 0 and float(parts["sampling (vocab-wide)"]) > 0, out
        total = float(parts.pop("total"))
        assert abs(sum(map(float, parts.values())) - total) <= 0.1 * len(parts), out
    table = out.split("limit")[-1]
    assert "ct2" not in table and "openvino" not in table  # --no-ct2 --openvino none: neither column
    if precisions == ("fp32",):
        assert not re.search(BF16_FIGURES, out, re.M), out
        return
    speedups = re.findall(r"bf16 speed-up \(fp32 ms / bf16 ms\) \| in rows ([\d.]+) \| held once ([\d.]+)", out)
    assert len(speedups) == 2 and all(float(x) > 0 for pair in speedups for x in pair), out
    mismatch = re.search(
        r"\|log p fp32 - log p bf16\| .*\((\d+) tokens, T = 1\): mean ([\d.]+), p99 ([\d.]+), max ([\d.]+)", out
    )
    # predicted tokens: the prefix's 8 once, then each row's 9 + 6 - 3 - 1 - 9 of its own
    assert mismatch and int(mismatch.group(1)) == 8 + 4 * 2, out
    mean, p99, top = map(float, mismatch.groups()[1:])
    assert 0 < mean <= top and p99 <= top < 5, out  # bf16 rounds the logits: differs, but not wildly


def test_decode_step_benchmark_leaves_bf16_out_on_a_cpu_without_bf16_units(run_benchmark):
    """A CPU without bf16 units (RLANYTHING_CPU_FLAGS naming an AVX2-only one): bf16 asked for is
    said not to be timed, and nothing of it runs or prints (no ceiling, no step, no mismatch):
    beside fp32 the run is a --precision fp32 run, bf16 alone exits at once."""
    avx2_only = machine_env(**{FLAGS_ENV: AVX2_ONLY})
    not_timed = NOT_TIMED.format(source=FLAGS_ENV)
    both = decode_step_process("--shapes", "9:6", "--precision", "fp32,bf16", env=avx2_only, timeout=180)
    assert re.search(
        r"^   cpu .+: avx2 yes, avx512f no, avx512_bf16 no, amx_bf16 no, .*\(flags from RLANYTHING_CPU_FLAGS\)$",
        both,
        re.M,
    )
    assert re.search(r"fp32 ceiling \d+ GFLOP/s", both) and re.search(r"\| fp32 \| in rows", both)
    flags = re.compile(r"\b(avx512_bf16|amx_bf16)\b")  # the cpu line names them
    said = [line for line in both.splitlines() if "bf16" in flags.sub("", line)]  # the header and the skip
    assert len(said) == 2 and said[0].endswith("limit, fp32 and bf16") and not_timed in said[1], both
    assert not re.search(BF16_FIGURES, both, re.M), both
    alone = run_benchmark(
        "decode_step", *DECODE_ARGS, "--shapes", "9:6", "--precision", "bf16", env={FLAGS_ENV: AVX2_ONLY}
    )
    assert not_timed in alone and "ceiling" not in alone and "Linear layers" not in alone


def test_textgame_base_benchmark_plays_held_out_games_and_prints_the_win_rate(tmp_path, run_benchmark):
    """The text-game starting-point benchmark on the tiny model and two one-room games: every
    turn and the closing line parse, and the worked example is played before the games."""
    args = ["-c", "configs/tiny-textworld.yaml", "-n", "2", "--set", "env.options.worked_example=true"]
    args += ["--set", f"env.options.games_dir={tmp_path}", "--set", "env.max_steps=2"]
    out = run_benchmark("textgame_base", *args)
    assert re.search(r"^2 in_domain games of textworld ready in [\d.]+ s$", out, re.M), out
    turns = re.findall(r"turn: +(\d+) games, prompt max +(\d+) mean +(\d+) tokens", out)
    assert turns and int(turns[0][0]) == 2 and len(turns) <= 2, out  # at most env.max_steps turns
    done = re.search(r"strict wins (\d+)/2 = [\d.]+% \[[\d.]+, [\d.]+\]; replies boxed (\d+)/(\d+)", out)
    assert done and int(done.group(3)) == sum(int(t[0]) for t in turns), out  # a reply per game and turn
    # the worked example (a won game of the same settings) was generated beside the two games
    assert len(list(tmp_path.glob("custom-*/game.z8"))) == 3


def test_int8_benchmark_times_torch_int8_beside_fp32_and_bf16_and_prints_each_mismatch(run_benchmark):
    """The int8 benchmark as shipped, shrunk: our step in fp32, bf16 (on a CPU with bf16 units,
    else said to be left out) and torch int8, and each mismatch against fp32 (bf16 small, int8
    nonzero), in lines that parse."""
    ours = (
        ["ours fp32", "ours bf16", "ours torch int8"] if machine_has_bf16_units() else ["ours fp32", "ours torch int8"]
    )
    args = ["--rows", "4", "--steps", "2", "--shape", "9:6", "--no-ct2"]
    out = run_benchmark("int8_generation", *args, env={FLAGS_ENV: None})
    assert (NOT_TIMED.format(source="/proc/cpuinfo") in out) == ("ours bf16" not in ours), out
    times = re.findall(r"4 rows, shared 9 own 6 \| (ours [\w ]+?) +([\d.]+) ms \| ours fp32 / it ([\d.]+)", out)
    assert [t[0] for t in times] == ours, out
    assert all(float(ms) > 0 for _, ms, _ in times) and float(times[0][2]) == 1.0
    found = dict(
        (label, (float(mean), int(n)))
        for label, mean, n in re.findall(
            r"mismatch against ours fp32 \| (ours [\w ]+?) +\|Δ log p\| mean ([\d.]+), .* of (\d+) tokens", out
        )
    )
    # predicted tokens: the prefix's 8 once, then each row's 9 + 6 - 3 - 1 - 9 of its own
    assert set(found) == set(ours[1:]) and {n for _, n in found.values()} == {8 + 4 * 2}
    assert found["ours torch int8"][0] > 0, out
    if "ours bf16" in found:
        assert 0 < found["ours bf16"][0] < 1, out


def judged_evaluation(folder: Path, games: range, changed: int | None = None) -> Path:
    """A made-up judged evaluation of text games: per game a progress step (its prompt says
    "good"), a setback ("bad": invalid, or farther in odd games), a no-op, then the last step.
    Game `changed` gets a new setback prompt (the other prompts repeat those of any other
    evaluation made with the same games: one per distinct prompt is kept)."""
    import pandas as pd

    folder.mkdir(parents=True)
    rules = ["closer", "invalid", "unchanged", "closer"]
    judged, labels = [], []
    for g in games:
        for step, rule in enumerate(rules):
            rule = "farther" if rule == "invalid" and g % 2 else rule
            word = "good" if rule == "closer" else "bad"
            tail = " again" if g == changed and step == 1 else ""
            key = {"split": "in_domain", "problem_idx": g, "step_idx": step}
            judged += [key | {"judge_idx": j, "prompt": f"game {g} step {step}: a {word} move{tail}"} for j in (0, 1)]
            labels.append(key | {"label": 1 if rule == "closer" else -1, "rule": rule, "last": step == 3})
    pd.DataFrame(judged).to_parquet(folder / "judgments.parquet")
    pd.DataFrame(labels).to_parquet(folder / "step_labels.parquet")
    return folder


def test_judge_capacity_pools_distinct_labelled_steps_and_splits_the_games(tmp_path):
    """Two evaluations of 12 games: the steps before the last with a ranked rule, one per distinct
    prompt (2 per game, and odd game 5's changed setback, farther, once more: 25), the halves by game."""
    from benchmarks.judge_capacity import in_train_half, labelled_steps

    dirs = [judged_evaluation(tmp_path / "a", range(12)), judged_evaluation(tmp_path / "b", range(12), changed=5)]
    steps = labelled_steps(dirs)
    assert len(steps) == 25 and set(steps.step_idx) == {0, 1}
    assert steps.rule.value_counts().to_dict() == {"closer": 12, "farther": 7, "invalid": 6}
    assert steps.good.tolist() == (steps.rule == "closer").tolist()
    train = in_train_half(steps, seed=0)
    halves = [set(steps.problem_idx[side]) for side in (train, ~train)]
    assert len(halves[0]) == len(halves[1]) == 6 and not halves[0] & halves[1]
    assert (train == in_train_half(steps, seed=0)).all() and (train != in_train_half(steps, seed=1)).any()


def test_judge_capacity_finetune_learns_a_separable_label_and_probe_reads_the_states(tmp_path, run_benchmark):
    """The tiny RM trained on "good"/"bad" prompts ranks the held-out games' steps: AUROC 1.0 on
    both halves after 3 epochs (a flipped loss ranks them at 0, an update that does not step at
    0.5 or below); the probe writes the 3 layers' states of every step."""
    import pandas as pd

    dirs = [str(judged_evaluation(tmp_path / "a", range(12)))]
    rm = ["--rm", "builtin:tiny-random"]
    out = run_benchmark(
        "judge_capacity", "finetune", *dirs, *rm, "--epochs", "3", "--lr", "3e-3", "--out", f"{tmp_path}/f.csv"
    )
    last = re.findall(r"^epoch (\d) \(.*test half AUROC ([\d.]+) .*; train half ([\d.]+)$", out, re.M)
    assert [e for e, *_ in last] == ["1", "2", "3"] and last[-1][1:] == ("1.000", "1.000"), out
    rows = pd.read_csv(tmp_path / "f.csv")
    assert len(rows) == 3 * 12 and rows.problem_idx.nunique() == 6  # the test half, every epoch
    top = ["--train-top-layers", "1", "--out", f"{tmp_path}/t.csv"]  # the last of 2 layers and the norm only
    out = run_benchmark("judge_capacity", "finetune", *dirs, *rm, "--epochs", "3", "--lr", "3e-3", *top)
    assert re.findall(r"^epoch 3 \(.*test half AUROC ([\d.]+) .*; train half ([\d.]+)$", out, re.M) == [("1.000",) * 2]
    out = run_benchmark("judge_capacity", "probe", *dirs, *rm, "--out", f"{tmp_path}/p.npz")
    assert re.search(r"^probe on 3 layers: test half AUROC [\d.]+ ", out, re.M), out
    assert (
        len(re.findall(r"^probe on layer \d+ from \d+ train steps \(C [\d.e-]+\): test half AUROC [\d.]", out, re.M))
        == 4
    ), out
    states = np.load(tmp_path / "p.npz")["states"]
    assert states.shape[:2] == (24, 3)
    again = run_benchmark("judge_capacity", "probe", *dirs, *rm, "--states", f"{tmp_path}/p.npz", "--out", "unused")
    assert again.split("untrained RM")[1] == out.split("untrained RM")[1]  # the saved passes, the same figures
    with pytest.raises(SystemExit, match="other steps or halves"):
        run_benchmark(
            "judge_capacity", "probe", *dirs, *rm, "--seed", "1", "--states", f"{tmp_path}/p.npz", "--out", "x"
        )


def test_judge_capacity_reads_the_steps_a_runs_sibling_target_valued(tmp_path):
    """A run's valued steps (progress nonzero; 0 and NaN are not valued), one per distinct prompt
    (trajectory 1 repeats trajectory 0's first step), good where the progress is positive, the
    game's rule beside it ("?" where the step has no label); an iteration without a progress
    file (a policy-only run's) adds nothing."""
    import pandas as pd

    from benchmarks.judge_capacity import sibling_steps

    folder = tmp_path / "run" / "iter_0000"
    folder.mkdir(parents=True)
    (tmp_path / "run" / "iter_0001").mkdir()
    keys = {"traj_id": [0, 0, 0, 1, 1], "step_idx": [0, 1, 2, 0, 1]}
    pd.DataFrame(keys | {"progress": [0.5, -0.25, 0.0, 0.5, float("nan")]}).to_parquet(folder / "progress.parquet")
    prompts = ["take key", "go west", "look", "take key", "open door"]
    pd.DataFrame(keys | {"prompt": prompts}).to_parquet(folder / "judgments.parquet")
    labels = {"traj_id": [0, 0, 1], "step_idx": [0, 2, 0], "rule": ["closer", "unchanged", "closer"]}
    pd.DataFrame(labels).to_parquet(folder / "step_labels.parquet")
    steps = sibling_steps([tmp_path / "run"])
    assert steps[["prompt", "good", "rule"]].values.tolist() == [["take key", True, "closer"], ["go west", False, "?"]]


def test_judge_capacity_trains_on_the_runs_prompts_with_either_label(tmp_path):
    """`--train-runs` with the sibling signs, or the same prompts with the game's labels (the
    no-op and the unlabelled step out); `--train-limit` samples the train half."""
    import argparse

    import pandas as pd

    from benchmarks.judge_capacity import in_train_half, labelled_steps, training_steps

    folder = tmp_path / "run" / "iter_0000"
    folder.mkdir(parents=True)
    keys = {"traj_id": [0, 0, 0, 1], "step_idx": [0, 1, 2, 0]}
    pd.DataFrame(keys | {"progress": [0.5, 0.25, -0.5, -0.5]}).to_parquet(folder / "progress.parquet")
    pd.DataFrame(keys | {"prompt": ["take key", "look", "go west", "eat key"]}).to_parquet(folder / "judgments.parquet")
    labels = {"traj_id": [0, 0, 0], "step_idx": [0, 1, 2], "rule": ["closer", "unchanged", "invalid"]}
    pd.DataFrame(labels).to_parquet(folder / "step_labels.parquet")
    steps = labelled_steps([judged_evaluation(tmp_path / "a", range(12))])
    train = in_train_half(steps, seed=0)
    args = argparse.Namespace(train_limit=0, train_runs=[tmp_path / "run"], train_labels="sibling", seed=0)
    assert training_steps(steps, train, args).good.tolist() == [True, True, False, False]
    args.train_labels = "game"
    fit = training_steps(steps, train, args)
    assert fit[["prompt", "good"]].values.tolist() == [["take key", True], ["go west", False]]
    args.train_runs, args.train_limit = [], 5
    fit = training_steps(steps, train, args)
    assert len(fit) == 5 and set(fit.index) <= set(np.flatnonzero(train))


def test_judge_capacity_verdict_losses_by_hand():
    """Odds 4 against a −1 label: the log-loss softplus(4) = 4.018 pushes back with gradient
    σ(4) = 0.982; the loop's expected reward at T 0.8, p = σ(5) = 0.99331, costs 2p − 1 = 0.98661
    and pushes back with only 2p(1 − p)/0.8 = 0.01662."""
    import torch

    from benchmarks.judge_capacity import verdict_loss

    for loss, value, grad in (("cross_entropy", 4.01815, 0.98201), ("reward", 0.98661, 0.01662)):
        odds = torch.tensor(4.0, requires_grad=True)
        out = verdict_loss(odds, -1.0, loss)
        out.backward()
        assert (round(out.item(), 5), round(odds.grad.item(), 5)) == (value, grad), loss
