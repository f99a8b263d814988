"""TRL side of benchmarks/trl_grpo.py: GRPOTrainer steps on the workload it is handed.

    cd REPO && <trl-venv>/bin/python -m benchmarks._trl_worker job.json

Runs in TRL's own venv (never ours): torch, trl and reasoning-gym are installed there, and
rlanything is not. trl_grpo.py starts it as a module from the repository root, so `python -m`
puts that root first on the module path and the verifier our training uses (`ReasoningGymEnv` +
`parse_answer`) imports from this checkout: both sides score answers with the same code.
job.json (written by trl_grpo.py) holds the model folder, the chat prompts and reasoning-gym
specs in order, and the sizes. Prints one line `TRL_RESULT {json}` with per-step wall times,
generation times and generated-token counts.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlanything.algo.parsing import parse_answer
    from rlanything.envs.reasoning import ReasoningGymEnv

    torch.set_num_threads(job["threads"])
    stats = {"gen_s": [], "gen_tokens": [], "accuracy": [], "step_begin": [], "step_end": []}

    def outcome_reward(completions, spec, completion_ids, **kwargs) -> list[float]:
        """+1 when the verifier accepts the answer, else -1 (our verify step's replay)."""
        rewards = []
        for completion, spec_json in zip(completions, spec):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            action, _ = parse_answer(text, fallback=job["answer_fallback"])
            env = ReasoningGymEnv()
            env.reset(json.loads(spec_json))
            env.step(action)
            rewards.append(float(env.outcome()))
            env.close()
        stats["gen_tokens"].append(sum(len(ids) for ids in completion_ids))
        stats["accuracy"].append(sum(r > 0 for r in rewards) / len(rewards))
        return rewards

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_single_turn(self, *args, **kwargs):
            start = time.perf_counter()
            out = super()._generate_single_turn(*args, **kwargs)
            stats["gen_s"].append(time.perf_counter() - start)
            return out

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            stats["step_begin"].append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            stats["step_end"].append(time.perf_counter())

    n, g = job["num_prompts"], job["group_size"]
    dtype = "bfloat16" if job["bf16"] else "float32"
    config = GRPOConfig(
        output_dir=job["output_dir"],
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        use_cpu=not torch.cuda.is_available(),
        seed=job["seed"],
        max_steps=job["iterations"],
        # one generation batch (N prompts × G) per optimizer step, all in one forward/backward,
        # one pass over it (num_iterations 1: no separate old-log-prob forward, as ours)
        per_device_train_batch_size=n * g,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=g,
        num_iterations=1,
        shuffle_dataset=False,
        max_completion_length=job["max_new_tokens"],
        temperature=job["temperature"],
        top_p=1.0,
        top_k=0,
        learning_rate=job["lr"],
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        loss_type="grpo",
        scale_rewards="group",
        # TRL's defaults (gradient checkpointing on, bf16 autocast on) would make it slower or
        # change the precision; match ours: no checkpointing, weights in `dtype`, no autocast
        gradient_checkpointing=False,
        bf16=False,
        model_init_kwargs={"dtype": dtype},
        optim="adamw_torch_fused",  # ours steps a fused AdamW too (the default makes ~10 passes)
        dataloader_num_workers=0,
        disable_tqdm=True,
        log_completions=False,
    )
    dataset = Dataset.from_dict({"prompt": job["prompts"], "spec": job["specs"]})
    tokenizer = AutoTokenizer.from_pretrained(job["model"], padding_side="left")
    trainer = TimedGRPOTrainer(
        model=job["model"],
        reward_funcs=outcome_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimes()],
    )
    start = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - start
    begins, ends = stats["step_begin"], stats["step_end"]
    # a step's wall: from the previous step's end (the first: its own begin) to its end, so it
    # includes whatever TRL does between steps (logging, data loading)
    step_s = [ends[0] - begins[0]] + [b - a for a, b in zip(ends, ends[1:])]
    print(
        "TRL_RESULT "
        + json.dumps(
            {
                "trl": trl.__version__,
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "step_s": step_s,
                "gen_s": stats["gen_s"],
                "gen_tokens": stats["gen_tokens"],
                "accuracy": stats["accuracy"],
                "train_s": train_s,
                "trained_samples": n * g,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
