"""A whole outcome-only iteration, ours vs TRL's GRPOTrainer, on the same workload (issue 8).

    python -m benchmarks.trl_grpo [--prompts 4] [--group 4] [--new-tokens 64] [--iterations 3]
                                  [--threads 1] [--bf16] [--train-all] [--flow] [--trl-venv DIR]

Workload, the same on both sides: SmolLM2-135M-Instruct (our safetensors folder of
`builtin:smollm2-135m-instruct`), `prompts` reasoning-gym basic_arithmetic problems per
iteration (configs/smollm2-arith-full.yaml's generator settings, new problems every iteration, built
by our `ReasoningGymEnv` and rendered as the same system + user chat), `group` samples each at
temperature 1.0 with up to `new-tokens` tokens, outcome-only reward (our verifier: `parse_answer`
with configs/smollm2-arith-full.yaml's answer fallback, then reasoning-gym's `score_answer`: +1 or -1),
group z-scored advantages, one PPO-clip optimizer step (AdamW, lr 1e-5, grad clip 1, ε 0.2) over
the whole batch in one micro-batch, fp32 weights (bf16 weights with --bf16) on both sides.
--bf16 on a CPU without bf16 units (neither amx_bf16 nor avx512_bf16 in /proc/cpuinfo's flags, or
in RLANYTHING_CPU_FLAGS when set) times nothing and says so in one line: bf16 is emulated there.

  ours   our library in this process, as the training steps call it: `rollout.play` with the
         TransformersEngine (log-probs recorded while sampling), `verify_episode`, the
         advantages step's `compute_samples` at lam=0 (the outcome-only baseline: no RM term),
         `ppo_update` with updates=1. The model and optimizer stay in memory, as TRL's do.
         Like a real iteration it trains only kept samples (tasks inside algo.policy_band,
         advantage ≠ 0); --train-all trains every sample, TRL's amount of backward work.
  trl    GRPOTrainer (TRL in its own venv, `-m benchmarks._trl_worker` in a subprocess):
         num_generations=group, one generation batch per optimizer step, num_iterations=1
         (no extra old-log-prob forward, as ours), beta=0, loss_type grpo, no gradient
         checkpointing and no bf16 autocast (TRL's defaults turn both on; off here to match ours),
         fused AdamW (`optim="adamw_torch_fused"`, as ours; TRL's default is the multi-tensor one).
  flow   (--flow) our real `rlanything train` with configs/smollm2-arith-full.yaml at these sizes and
         algo.lam=0: each step's own time from summary.json. Its iteration also reloads and saves
         checkpoints and runs rm_score, rm_update and adapt_tasks, which TRL has no counterpart
         for: its policy steps (rollout+verify+advantages+policy_update) are the comparable part.

Order: ours, TRL, ours again (the load of a shared machine drifts; ours brackets TRL). The first
iteration of each round is a warm-up; the medians of the rest are printed: seconds per iteration,
generated tokens, generated tokens per second of iteration wall (`tok/s`) and of generation alone
(`gen tok/s`), samples trained, accuracy, and ours/TRL throughput (tok/s): ours vs trl is the
apples-to-apples ratio. Load averages are printed beside each side: compare ratios from one run.
On a machine busy with other work, `--threads 1` (both sides) holds up far better than 2 threads.

TRL never enters our venv: on first use this builds its own (default ~/.cache/rlanything/
trl-venv, or RLANYTHING_TRL_VENV / --trl-venv) with the command it prints (pinned torch: a CPU
wheel where the machine has one; an unpinned torch pulls a multi-GB CUDA build).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from benchmarks.common import header, timed_precisions
from rlanything.agent.advantage_rows import compute_samples
from rlanything.agent.play import play
from rlanything.agent.update_data import to_samples
from rlanything.config import load_config
from rlanything.envs.reasoning import ReasoningGymEnv
from rlanything.envs.verification import verify_episode
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.loading import load_model, load_tokenizer, resolve_model_path
from rlanything.models.prompts import policy_messages
from rlanything.models.training.trainer import make_optimizer, ppo_update

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "smollm2-arith-full.yaml"
TRL_PINS = ["torch==2.13.0", "trl==1.16.0", "reasoning-gym==0.1.25"]
LR = 1e-5


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# --- TRL's venv --------------------------------------------------------------------------


def trl_venv(arg: str | None) -> Path:
    return Path(arg or os.environ.get("RLANYTHING_TRL_VENV") or Path.home() / ".cache/rlanything/trl-venv")


def ensure_trl_venv(venv: Path) -> Path:
    """The venv's python, building the venv first when it lacks trl or reasoning-gym."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import trl, reasoning_gym"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    command = f"python3 -m venv {venv} && {venv}/bin/pip install {' '.join(TRL_PINS)}"
    print(f"   building TRL's venv (once): {command}", flush=True)
    start = time.perf_counter()
    subprocess.run(command, shell=True, check=True)
    print(f"   built in {time.perf_counter() - start:.0f} s", flush=True)
    return python


# --- the workload ------------------------------------------------------------------------


def workload(num: int, seed: int) -> tuple[list[dict], list[list[dict]], str]:
    """`num` reasoning-gym specs, their chat prompts, and the answer fallback, from
    configs/smollm2-arith-full.yaml's env section (its generator settings)."""
    env_config = load_config(CONFIG, [f"env.num_problems={num}"]).env
    specs = ReasoningGymEnv.initial_specs(env_config, seed)
    env = ReasoningGymEnv(env_config)
    prompts = []
    for spec in specs:  # reset first: it sets the worked example the prompt starts with
        question = env.reset(spec)
        prompts.append(policy_messages(env.system_prompt, [question], [], env.example))
    return specs, prompts, env_config.answer_fallback


# --- ours --------------------------------------------------------------------------------


def run_ours(args, specs, fallback: str) -> list[dict]:
    path = resolve_model_path("builtin:smollm2-135m-instruct")
    env_config = load_config(CONFIG, []).env
    tokenizer = load_tokenizer(path)
    model = load_model(path, "bfloat16" if args.bf16 else "float32")
    engine = TransformersEngine(model, tokenizer, batch_size=args.prompts * args.group)
    optimizer = make_optimizer(model, LR, weight_decay=0.0)
    algo = load_config(CONFIG, []).algo
    out = []
    for it in range(args.iterations):
        batch = specs[it * args.prompts : (it + 1) * args.prompts]
        tasks = [{"task_id": i, "slot": i, "version": 0, "spec": s, "pending": False} for i, s in enumerate(batch)]
        t0 = time.perf_counter()
        rows, episodes = play(
            engine,
            tokenizer,
            lambda: ReasoningGymEnv(env_config),
            tasks,
            group_size=args.group,
            max_steps=1,
            max_new_tokens=args.new_tokens,
            temperature=1.0,
            top_p=1.0,
            seed=args.seed + it,
            answer_fallback=fallback,
        )
        t1 = time.perf_counter()
        actions = {r["traj_id"]: [r["action"]] for r in rows}
        outcomes = pd.DataFrame(
            [
                verify_episode(env_config, ep, json.dumps(tasks[ep["task_id"]]["spec"]), actions.get(ep["traj_id"], []))
                for ep in episodes
            ]
        )
        t2 = time.perf_counter()
        # the advantages step at lam=0: the RM's scores are multiplied by 0, so one blank
        # judgment per step stands in for them (no RM runs)
        blank = pd.DataFrame(
            {"traj_id": outcomes.traj_id, "step_idx": 0, "judge_idx": 0, "step_score": 0, "parsed": False}
        )
        trainable = outcomes[outcomes.valid & ~outcomes.pending]
        adv = compute_samples(
            trainable,
            blank,
            m=1,
            lam=0.0,
            band=algo.band,
            policy_band=algo.policy_band,
            outcome_weight=algo.outcome_weight,
            rm_balance=algo.rm_balance,
            rm_advantage=algo.rm_advantage,
        )
        policy = adv[adv.kind == "policy"]
        kept = policy if args.train_all else policy[policy.kept]
        samples = to_samples(
            kept[["traj_id", "step_idx", "advantage"]].merge(pd.DataFrame(rows), on=["traj_id", "step_idx"])
        )
        t3 = time.perf_counter()
        ppo_update(
            model,
            optimizer,
            samples,
            pad_id=tokenizer.pad_token_id,
            temperature=1.0,
            clip_eps=algo.clip_eps,
            kl_beta=algo.kl_beta,
            grad_clip=1.0,
            updates=1,
            micro_batch_size=args.prompts * args.group,
            seed=args.seed + it,
        )
        t4 = time.perf_counter()
        out.append(
            {
                "step_s": t4 - t0,
                "gen_s": t1 - t0,
                "verify_s": t2 - t1,
                "adv_s": t3 - t2,
                "update_s": t4 - t3,
                "gen_tokens": sum(len(r["response_ids"]) for r in rows),
                "trained": len(samples),
                "accuracy": float((outcomes.outcome == 1).mean()),
            }
        )
    return out


# --- TRL ---------------------------------------------------------------------------------


def run_trl(args, python: Path, specs, prompts, fallback: str, tmp: Path) -> dict:
    job = {
        "model": str(resolve_model_path("builtin:smollm2-135m-instruct")),
        "prompts": prompts,
        "specs": [json.dumps(s) for s in specs],
        "num_prompts": args.prompts,
        "group_size": args.group,
        "max_new_tokens": args.new_tokens,
        "temperature": 1.0,
        "lr": LR,
        "iterations": args.iterations,
        "seed": args.seed,
        "bf16": args.bf16,
        "threads": torch.get_num_threads(),
        "answer_fallback": fallback,
        "output_dir": str(tmp / "trl-out"),
    }
    (tmp / "job.json").write_text(json.dumps(job))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(torch.get_num_threads()),
    }
    # run as a module from the repository root: its verifier imports come from this checkout
    command = [str(python), "-m", "benchmarks._trl_worker", str(tmp / "job.json")]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("TRL_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"TRL worker failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return json.loads(line[len("TRL_RESULT ") :])


# --- our full training flow (--flow) -----------------------------------------------------

POLICY_STEPS = ("rollout", "verify", "advantages", "policy_update")


def run_flow(args, tmp: Path) -> list[dict]:
    root = tmp / "flow"
    root.mkdir()
    n = args.prompts * args.group
    sets = [
        f"run.root={root}",
        "run.name=bench-trl",
        f"run.seed={args.seed}",
        "algo.lam=0",
        f"policy.tasks_per_iteration={args.prompts}",
        f"env.num_problems={args.prompts}",
        f"policy.group_size={args.group}",
        f"policy.max_new_tokens={args.new_tokens}",
        "policy.temperature=1.0",
        "policy.optim.updates_per_iteration=1",
        f"policy.optim.micro_batch_size={n}",
        f"policy.batch_size={n}",
        f"policy.precision={'bf16' if args.bf16 else 'fp32'}",
        f"policy.optim.precision={'bf16' if args.bf16 else 'fp32'}",
    ]
    env = {
        **os.environ,
        "PREFECT_HOME": str(root / "prefect"),
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "RLANYTHING_PROGRESS": "0",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "OMP_NUM_THREADS": str(torch.get_num_threads()),
    }
    cli = [
        sys.executable,
        "-c",
        "from rlanything.cli import app; app()",
        "train",
        "--config",
        str(CONFIG),
        "--iterations",
        str(args.iterations),
        *[a for s in sets for a in ("--set", s)],
    ]
    proc = subprocess.run(cli, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"flow run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out = []
    for it in range(args.iterations):
        summary = json.loads((root / "bench-trl" / f"iter_{it:04d}" / "summary.json").read_text())
        steps = {k[len("time/") : -2]: v for k, v in summary.items() if k.startswith("time/") and k.endswith("_s")}
        out.append(
            {
                "policy_s": sum(steps.get(s, 0.0) for s in POLICY_STEPS),
                "all_s": sum(steps.values()),
                "gen_tokens": summary.get("tokens/policy_response", 0),
                "steps": steps,
                "trained": summary.get("policy/samples", 0),
                "accuracy": summary.get("accuracy", 0.0),
            }
        )
    return out


# --- report ------------------------------------------------------------------------------


def med(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)  # the first is a warm-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4, help="problems per iteration")
    parser.add_argument("--group", type=int, default=4, help="samples per problem (G)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=3, help="per side; the first is a warm-up")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="bf16 on both sides (ours: bf16 generation, bf16 autocast over fp32 weights in the update)",
    )
    parser.add_argument("--train-all", action="store_true", help="ours trains every sample, as TRL does")
    parser.add_argument("--flow", action="store_true", help="also time `rlanything train` (lam=0)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads on both sides (default torch's; 1 holds up better on a loaded machine)",
    )
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--trl-venv", default=None, help="default $RLANYTHING_TRL_VENV or ~/.cache/rlanything/trl-venv")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    header(
        f"outcome-only GRPO iteration vs TRL GRPOTrainer: SmolLM2-135M, {args.prompts} prompts × G={args.group}, "
        f"{args.new_tokens} new tokens, T=1.0, {'bf16' if args.bf16 else 'fp32'}, {args.iterations} iterations (1 warm-up)"
    )
    if args.bf16 and not timed_precisions(["bf16"]):
        return  # a CPU without bf16 units: bf16 would time its emulation (the line printed says so)
    specs, prompts, fallback = workload(args.prompts * args.iterations, args.seed)
    python = None if args.skip_trl else ensure_trl_venv(trl_venv(args.trl_venv))

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="rla-bench-trl-") as tmp:
        loads = [load()]
        rounds = [run_ours(args, specs, fallback)]
        loads.append(load())
        if python is not None:
            trl = run_trl(args, python, specs, prompts, fallback, Path(tmp))
            loads.append(load())
            results["trl"] = {
                "s": med(trl["step_s"]),
                "tokens": med(trl["gen_tokens"]),
                "gen_s": med(trl["gen_s"]),
                "trained": trl["trained_samples"],
                "acc": statistics.mean(trl["accuracy"]),
                "load": f"{loads[1]} → {loads[2]}",
                "detail": f"generate {med(trl['gen_s']):.1f} + rest {med(trl['step_s']) - med(trl['gen_s']):.1f} "
                f"(TRL {trl['trl']}, transformers {trl['transformers']}, torch {trl['torch']})",
            }
            # ours again after TRL: the load of a shared machine drifts, so ours brackets TRL
            rounds.append(run_ours(args, specs, fallback))
            loads.append(load())
        kept = [r for rnd in rounds for r in (rnd[1:] if len(rnd) > 1 else rnd)]  # each round's first: warm-up
        mid = {k: statistics.median(r[k] for r in kept) for k in kept[0]}
        results = {
            "ours": {
                "s": mid["step_s"],
                "tokens": mid["gen_tokens"],
                "gen_s": mid["gen_s"],
                "trained": mid["trained"],
                "acc": statistics.mean(r["accuracy"] for rnd in rounds for r in rnd),
                "load": "; ".join(f"{loads[i]} → {loads[i + 1]}" for i in range(0, len(loads) - 1, 2)),
                "detail": f"generate {mid['gen_s']:.1f} + verify {mid['verify_s']:.2f} + advantages {mid['adv_s']:.2f} "
                f"+ update {mid['update_s']:.1f}; s/iter before, after TRL: "
                + ", ".join(f"{med([r['step_s'] for r in rnd]):.1f}" for rnd in rounds),
            },
            **results,
        }
        if args.flow:
            load_before = load()
            flow = run_flow(args, Path(tmp))
            tokens = med([r["gen_tokens"] for r in flow])
            results["flow-policy"] = {
                "s": med([r["policy_s"] for r in flow]),
                "tokens": tokens,
                "gen_s": med([r["steps"]["rollout"] for r in flow]),
                "trained": med([r["trained"] for r in flow]),
                "acc": statistics.mean(r["accuracy"] for r in flow),
                "load": f"{load_before} → {load()}",
                "detail": ", ".join(f"{k} {med([r['steps'].get(k, 0.0) for r in flow]):.1f}" for k in POLICY_STEPS),
            }
            results["flow-all"] = {
                **results["flow-policy"],
                "s": med([r["all_s"] for r in flow]),
                "detail": "all seven steps, incl. "
                + ", ".join(
                    f"{k} {med([r['steps'].get(k, 0.0) for r in flow]):.1f}"
                    for k in ("rm_score", "rm_update", "adapt_tasks")
                ),
            }

    print(
        f"   {'side':12s} {'s/iter':>7s} {'gen tok':>7s} {'tok/s':>6s} {'gen tok/s':>9s} {'trained':>7s} {'acc':>5s}  load avg"
    )
    for name, r in results.items():
        print(
            f"   {name:12s} {r['s']:7.1f} {r['tokens']:7.0f} {r['tokens'] / r['s']:6.1f} "
            f"{r['tokens'] / r['gen_s']:9.1f} {r['trained']:7.0f} {r['acc']:5.2f}  {r['load']}"
        )
        print(f"   {'':12s} {r['detail']}")
    if "trl" in results:
        trl_tps = results["trl"]["tokens"] / results["trl"]["s"]
        for name in ("ours", "flow-policy", "flow-all"):
            if name in results:
                ratio = results[name]["tokens"] / results[name]["s"] / trl_tps
                tag = " (apples-to-apples)" if name == "ours" else ""
                print(f"   throughput {name}/trl: {ratio:.2f}×{tag}  (goal ≥ 2×)")


if __name__ == "__main__":
    main()
