"""What sharding generation over Ray costs (`run.executor: ray`, models/engines/ray_engine.py).

    python -m benchmarks.ray_sharding [-c configs/tiny.yaml] [--set KEY=VALUE ...] [--rounds 3]

Workload: iteration 0's rollout and rm_score of the config, as the steps call them
(`agent.play.play` on the sampled tasks, then `agent.judging.judge_as_configured` on every
step), fp32. Compared in one process, interleaved, on the same tasks and seeds:
  local   one engine in this process, torch on 2 threads (what `executor: local` does here)
  local-1t  the same engines on 1 thread (separates the threads' cost from the sharding's)
  local-2s  the same engines on 2 threads, each call cut into 2 shards played in turn
          (`run.shards: 2` locally, models/engines/shards.py): the batches the Ray workers decode
  ray     `RayEngine` over 2 Ray actors of one CPU each, on a local cluster this script
          starts (num_cpus 2, 150 MB object store) and stops
Printed: the CPU, seconds per round of each (median), the ratio ray/local, the first call's
time on the workers (imports, loading both models), a weight sync (the policy workers loading
other weights from a folder, as after an update), the round trip of a
1-row, 1-token call through each (the fixed cost of one sharded call), and how many samples
differ from local-1t's: logits agree across batch compositions to float rounding only, which
now and then moves a sampled token (models/engines/ray_engine.py); and how many of ray's differ from
local-2s's, token ids or log-probs (the same shards: none expected). On 2 cores no gain is expected: 2 one-core workers have the cores one 2-thread process has;
what is measured is what sharding adds.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import time

import pandas as pd
import torch

from benchmarks.common import cpu_line, header
from rlanything.agent.judging import judge_as_configured, steps_to_judge
from rlanything.agent.play import play_as_configured
from rlanything.config import load_config
from rlanything.envs import initial_specs
from rlanything.models.engines import ray_engine
from rlanything.models.engines.generation import PrefixCache
from rlanything.models.engines.make import make_engine
from rlanything.models.engines.shards import ShardedEngine
from rlanything.models.loading import resolve_model_path
from rlanything.seeding import derive_seed
from rlanything.storage.buffer import initial_buffer, sample_batch


def one_round(config, tasks, policy, rm) -> tuple[float, float, list, list]:
    """Iteration 0's rollout, then its judgments -> (rollout s, rm_score s, step rows, judgments)."""
    start = time.perf_counter()
    rows, episodes = play_as_configured(policy[0], policy[1], config, tasks, 0, prefix_cache=PrefixCache())
    rollout_s = time.perf_counter() - start
    outcomes = pd.DataFrame(episodes).assign(valid=True, pending=False)
    todo = steps_to_judge(pd.DataFrame(rows), pd.DataFrame(episodes), outcomes, config.rm.history_steps)
    start = time.perf_counter()
    seed = derive_seed(config.run.seed, 0, "rm_score")
    judgments = judge_as_configured(rm[0], rm[1], todo, config, seed, prefix_cache=PrefixCache())
    return rollout_s, time.perf_counter() - start, rows, judgments


def round_trip_ms(engine, tokenizer, repeats: int = 5) -> float:
    """Median wall ms of a 1-row, 1-token generate call."""
    prompt = [tokenizer.encode("Hello")]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.generate(prompt, max_new_tokens=1, temperature=1.0, top_p=1.0, seed=0)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    # as the CLI sets it (rlanything/cli.py): MKL reads it at its first call, not when torch is
    # imported, so here, before any matmul, is in time: matmuls that do not depend on the thread count
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", default="configs/tiny.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    config = load_config(args.config, args.overrides)
    tasks = sample_batch(
        initial_buffer(initial_specs(config.env, config.run.seed)),
        config.policy.tasks_per_iteration,
        derive_seed(config.run.seed, 0, "sample"),
    )
    paths = {"policy": resolve_model_path(config.policy.model), "rm": resolve_model_path(config.rm_model)}
    sections = {"policy": config.policy, "rm": config.rm}
    torch.set_num_threads(2)
    header(f"rollout + rm_score of {args.config}: local (1 process, 2 threads) vs ray (2 actors, 1 CPU each)")
    print(f"   {cpu_line()}")
    print(f"   {len(tasks)} tasks x G={config.policy.group_size}, m={config.rm.judgments_per_step}")
    local = {role: make_engine(sections[role], role, paths[role], "fp32") for role in paths}
    # a fresh token for this script's own cluster, through the environment: none is left in ~/.ray;
    # set before Ray is imported, which reads its auth mode then
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    import ray

    # address "local": a new cluster, whatever `ray start` left in /tmp/ray
    ray.init(
        address="local", num_cpus=2, object_store_memory=150 * 2**20, include_dashboard=False, logging_level="WARNING"
    )
    try:
        remote = {
            role: (
                ray_engine.RayEngine(2, 2, sections[role], role, paths[role], "fp32", local[role][1]),
                local[role][1],
            )
            for role in paths
        }
        start = time.perf_counter()
        for role in paths:  # the workers load both models (a weight sync) on their first call
            round_trip_ms(*remote[role], repeats=1)
        load_s = time.perf_counter() - start
        sharded = {role: (ShardedEngine(engine, 2), tokenizer) for role, (engine, tokenizer) in local.items()}
        # engines, this process's threads
        arms = {"local": (local, 2), "local-1t": (local, 1), "local-2s": (sharded, 2), "ray": (remote, 2)}
        times = {name: [] for name in arms}
        samples = {}
        for n in range(args.rounds):  # interleaved, the order rotating: a busy spell hits every arm
            order = list(arms)[n % len(arms) :] + list(arms)[: n % len(arms)]
            for name in order:
                engines, threads = arms[name]
                torch.set_num_threads(threads)
                rollout_s, rm_s, rows, judgments = one_round(config, tasks, engines["policy"], engines["rm"])
                times[name].append((rollout_s, rm_s))
                samples[name] = [[(r["response_ids"], r["logprobs"]) for r in part] for part in (rows, judgments)]
        torch.set_num_threads(2)
        # the same folder named differently: the workers load the policy again, as after an update
        other = ray_engine.RayEngine(2, 2, config.policy, "policy", f"{paths['policy']}/", "fp32", local["policy"][1])
        start = time.perf_counter()
        round_trip_ms(other, local["policy"][1], repeats=1)
        sync_s = time.perf_counter() - start
        trip = {name: round_trip_ms(*(local if name == "local" else remote)["policy"]) for name in ("local", "ray")}
    finally:
        ray_engine.shutdown()
    med = {name: [statistics.median(t[k] for t in times[name]) for k in (0, 1)] for name in times}
    for name in arms:
        rollout_s, rm_s = med[name]
        print(f"{name:8s} rollout {rollout_s:7.2f} s  rm_score {rm_s:7.2f} s  both {rollout_s + rm_s:7.2f} s")
    for base in ("local", "local-1t"):
        ratio = sum(med["ray"]) / sum(med[base])
        print(
            f"ray / {base} (both steps): {ratio:.2f}; rollout {med['ray'][0] / med[base][0]:.2f}, "
            f"rm_score {med['ray'][1] / med[base][1]:.2f}"
        )
    print(f"workers' first call (start, import, load policy + RM from the model folders): {load_s:.2f} s")
    print(f"weight sync (both workers load other policy weights from their folder, 1-token call): {sync_s:.2f} s")
    print(f"1-row 1-token call (2 threads here): local {trip['local']:.1f} ms, ray {trip['ray']:.1f} ms")
    for name in ("local", "ray"):  # against local-1t: the same kernels, alone in one process
        steps, judged = (
            sum(a[0] != b[0] for a, b in zip(mine, base)) for mine, base in zip(samples[name], samples["local-1t"])
        )
        print(
            f"{name} samples unlike local-1t's: {steps} of {len(samples[name][0])} steps, "
            f"{judged} of {len(samples[name][1])} judgments (token ids)"
        )
    steps, judged = (
        sum(list(a[0]) != list(b[0]) or list(a[1]) != list(b[1]) for a, b in zip(mine, base))
        for mine, base in zip(samples["ray"], samples["local-2s"])
    )
    print(f"ray samples unlike local-2s's: {steps} steps, {judged} judgments (token ids or log-probs, bit for bit)")


if __name__ == "__main__":
    main()
