"""What the RM update's gradient is made of, on a run's real judgments: the tokens the RM chose
(its reasoning and the constrained verdict's first token) against the ones appended around
them ("\\n\\boxed{", the "1" of "-1", "}").

    python -m benchmarks.verdict_gradient RUN_DIR [--iteration 0] [--limit 48]

Takes the RM's first mini-batch of that iteration exactly as its update drew it (the kept
judgments, the trainer's seeded shuffle; at most `limit` of them, for time) and the weights the
update started from, and computes the PPO-clip gradient (fp32, the sampler's log-probs as the
old ones) three times: every token trained (`rm.train_forced_tokens: true`), the chosen tokens
only (false), the appended tokens only. Prints each gradient's norm and the cosines between
them. Where the appended tokens' gradient is large and orthogonal to the decision's, the
every-token update spends its step on tokens no verdict depends on. Needs a run whose RM gives
constrained verdicts.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import cpu_line, header
from rlanything.agent.run_context import model_path
from rlanything.agent.update_data import judgment_samples
from rlanything.config import load_config
from rlanything.models.loading import load_model, load_tokenizer
from rlanything.models.training.trainer import Sample, epoch_mini_batches, ppo_update
from rlanything.seeding import derive_seed
from rlanything.storage.layout import RunLayout


def first_mini_batch(run_dir: Path, iteration: int, limit: int):
    """-> (config, the RM's start weights, its first mini-batch of samples with `trained` set)."""
    config = load_config(run_dir / "config.yaml")
    layout = RunLayout(run_dir)
    samples = judgment_samples(config, layout, iteration, chosen_only=True)
    if not samples:
        sys.exit(f"iteration {iteration} kept no RM sample: nothing trained")
    rng = random.Random(derive_seed(config.run.seed, iteration, "rm_update"))  # the update's own seed
    units = [s.unit for s in samples]
    mini = epoch_mini_batches(rng, len(samples), config.rm.optim.updates_per_iteration, units)[0]
    kept = mini[:limit]
    cut = {units[i] for i in kept} - {None}
    kept += [i for i in mini[limit:] if units[i] in cut]  # the partners of kept samples: no half pair
    return config, model_path(config, layout, "rm", iteration), [samples[i] for i in kept]


def gradient(start: Path, samples: list[Sample], config, pad_id: int) -> torch.Tensor:
    model = load_model(start)
    ppo_update(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),  # keeps the weights: only the gradient is read
        samples,
        pad_id=pad_id,
        temperature=config.rm.temperature,
        clip_eps=config.algo.clip_eps,
        kl_beta=config.algo.kl_beta,
        grad_clip=1e9,
        updates=1,
        micro_batch_size=config.rm.optim.micro_batch_size,
        seed=0,
    )
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--iteration", type=int, default=0)
    parser.add_argument("--limit", type=int, default=48, help="judgments of the mini-batch used, at most")
    args = parser.parse_args()
    header("the RM update's gradient: chosen tokens against appended ones")
    print(f"   {cpu_line()}")
    config, start, samples = first_mini_batch(args.run_dir, args.iteration, args.limit)
    pad_id = load_tokenizer(start).pad_token_id
    chosen = sum(sum(s.trained) for s in samples)
    total = sum(s.response_len for s in samples)
    print(f"{len(samples)} judgments of iteration {args.iteration}'s first RM mini-batch, from {start}")
    print(f"tokens: {chosen} chosen, {total - chosen} appended")
    variants = {
        "every token": [replace(s, trained=None) for s in samples],
        "chosen only": samples,
        "appended only": [replace(s, trained=[not t for t in s.trained]) for s in samples],
    }
    grads = {name: gradient(start, batch, config, pad_id) for name, batch in variants.items()}
    for name, g in grads.items():
        print(f"{name:14s} gradient norm {float(g.norm()):.4f}")
    names = list(grads)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            cos = float(grads[a] @ grads[b] / (grads[a].norm() * grads[b].norm()))
            print(f"cosine({a}, {b}) {cos:.3f}")


if __name__ == "__main__":
    main()
