"""Rollout engine throughput on a multi-turn-like workload, against baselines timed in this run.

    python -m benchmarks.rollout_engine [--episodes 16] [--group 4] [--turns 2] [--new-tokens 24] [--bf16]

Workload: `episodes` chats, `group` of them per task (an RL rollout plays each task G times),
play `turns` turns; each turn's prompt is the chat so far (system + task + earlier replies + a
fixed observation), so prompts grow like a multi-turn rollout's, a task's G episodes share their
first prompt, and every turn is one batched generation of `new-tokens` tokens at temperature 1.

Compared, in one process, on the same prompts and seeds:
  plain      `model.generate` batched the same way, no log-probs (the floor of any HF engine)
  logits     the previous engine: generate(output_logits=True) + log-softmax of the stacked logits
  engine     rlanything's TransformersEngine (log-probs recorded step by step, a prompt repeated
             in a batch prefilled once, each episode's KV kept from turn to turn: PrefixCache)
  engine16   the same in bfloat16 (--bf16; left out, saying so, on a CPU without bf16 units:
             neither amx_bf16 nor avx512_bf16 in /proc/cpuinfo's flags or RLANYTHING_CPU_FLAGS)
  vllm       VllmEngine on a vLLM server (when RLANYTHING_VLLM_PYTHON names a vLLM venv's python;
             server start not timed); vllm16 with --bf16 (the server in bfloat16)
and the FLOP ceiling: 2·params FLOPs per token at the matmul FLOP/s measured here. Printed:
seconds, tokens/s, time ratio to `plain`, and two fractions of the ceiling: `run`, the tokens
the model really ran (non-pad tokens fed to its forward, counted by a hook: hardware use; a
prompt prefix an engine reused is not run; vLLM's server is not hooked, so its figure counts
every prompt and generated token once) and `effective`, the workload's tokens (every prompt and
generated token once: what `plain` has to run) over the engine's time.
Also checks that `engine`'s recorded log-probs equal a teacher-forced pass over its samples (so
the speed-up is not bought with different numbers). Its tokens differ from `plain`'s: it samples
by its own seed rule (models/engines/decode.py: one noise stream per row), generate by torch's generator.

    python -m benchmarks.rollout_engine --rollouts RUN/iter_0000/rollouts.parquet [--batch-sizes 32,64,128]
        [--new-tokens 64] [--temperature 0.7] [--openvino-ir DIR]

replays a real iteration's rollout prompts instead (their `prompt_ids`, e.g. from a run of
`configs/smollm2-arith.yaml`): `plain` and `engine` at each batch size, same seeds, then the
dedicated CPU engines of cpu_engines.py on the same prompt ids, max new tokens and temperature
(top-p 1, no top-k), each with `pip install '.[cpu-engines]'` (skipped, saying so, if missing):
  ct2        CTranslate2, the model converted to float32 (`generate_batch`, max_batch_size = batch)
  ct2-int8   the same converted to int8 weights: NOT fp32
  openvino   OpenVINO GenAI's ContinuousBatchingPipeline (at most `batch` sequences running) on
             an fp32 IR compiled in f32 (f32 KV cache, no dynamic quantization); the IR is
             exported by the optimum-cli beside RLANYTHING_OPTIMUM_PYTHON (a venv of its own with
             optimum-intel) or given as --openvino-ir DIR, else the row is skipped
Conversions, exports and compilations are timed and printed, not counted. Printed per (engine,
batch): seconds, forwards (prefills + decode steps; "—" for the CPU engines), ms per forward, new
tokens/s, the time ratio to `plain` at that batch, and the `effective` fraction of the fp32 ceiling.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from transformers import GenerationConfig

from benchmarks.common import TokensFed, header, matmul_ceiling, params_of, timed_precisions
from benchmarks.cpu_engines import cpu_engines
from rlanything.algo.losses import token_logprobs
from rlanything.models.engines.generation import PrefixCache, eos_ids, finish, left_pad
from rlanything.models.engines.transformers_engine import TransformersEngine, response_logprobs
from rlanything.models.loading import load_model, load_tokenizer, smollm2_model_dir
from rlanything.models.prompts import policy_messages, render

SYSTEM = "You play a text game. Think briefly, then answer with one command in \\boxed{}."
OBSERVATION = "You are in a kitchen. You see a fridge, a counter with an apple, and a door to the east."


class Plain(TransformersEngine):
    """Same batching and seeds as the engine, no log-probs."""

    @torch.no_grad()
    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seed):
        config = GenerationConfig(
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=0,
            max_new_tokens=max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids,
        )
        results = [None] * len(prompts)
        for b, idx in enumerate(self._batches(prompts)):
            ids, attn = left_pad([prompts[i] for i in idx], self.pad_id)
            torch.manual_seed(seed + b)
            seqs = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=config)
            for row, i in enumerate(idx):
                new = seqs[row, ids.shape[1] :].tolist()
                results[i] = finish(new, [0.0] * len(new), self.eos_ids, self.tokenizer)
        return results


class OutputLogits(TransformersEngine):
    """The engine before StepLogprobs: all steps' logits kept, log-softmaxed at the end."""

    @torch.no_grad()
    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seed):
        config = GenerationConfig(
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=0,
            max_new_tokens=max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids,
            output_logits=True,
            return_dict_in_generate=True,
        )
        results = [None] * len(prompts)
        for b, idx in enumerate(self._batches(prompts)):
            ids, attn = left_pad([prompts[i] for i in idx], self.pad_id)
            torch.manual_seed(seed + b)
            out = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=config)
            new = out.sequences[:, ids.shape[1] :]
            logprobs = token_logprobs(torch.stack(out.logits, dim=1).float(), new, temperature=temperature)
            for row, i in enumerate(idx):
                results[i] = finish(new[row].tolist(), logprobs[row].tolist(), self.eos_ids, self.tokenizer)
        return results


def play(engines: dict, tokenizer, episodes: int, group: int, turns: int, new_tokens: int) -> dict:
    """Every engine plays the same turns, interleaved: turn t's prompts are built from the
    `plain` engine's replies, and within a turn the engines run one after another in a rotating
    order, so load from other processes falls on all of them alike.
    -> {name: (seconds, generations per turn, prompt tokens, generated tokens, tokens fed)}."""
    observations = [[f"Task {e // group}: put the apple in the fridge. {OBSERVATION}"] for e in range(episodes)]
    responses: list[list[str]] = [[] for _ in range(episodes)]
    results = {name: [0.0, [], 0, 0, 0] for name in engines}
    names = list(engines)
    # rlanything's engine keeps each episode's KV from turn to turn, as `rollout.play` does
    reuse = {name: {"prefix_cache": PrefixCache()} for name, e in engines.items() if type(e) is TransformersEngine}
    for turn in range(turns):
        prompts = [
            render(tokenizer, policy_messages(SYSTEM, observations[e], responses[e]))[1] for e in range(episodes)
        ]
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            engine, start = engines[name], time.perf_counter()
            with TokensFed(*[engine.model] if hasattr(engine, "model") else []) as fed:
                gens = engine.generate(
                    prompts,
                    max_new_tokens=new_tokens,
                    temperature=1.0,
                    top_p=1.0,
                    seed=1000 * turn,
                    **reuse.get(name, {}),
                )
            result = results[name]
            result[0] += time.perf_counter() - start
            result[1].append(gens)
            prompt_tokens, new = sum(map(len, prompts)), sum(len(g.token_ids) for g in gens)
            result[2] += prompt_tokens
            result[3] += new
            result[4] += fed.total if hasattr(engine, "model") else prompt_tokens + new  # a server: every token once
        print(f"   ... turn {turn}: " + ", ".join(f"{n} {results[n][0]:.1f} s" for n in names), flush=True)
        for e, g in enumerate(results["plain"][1][-1]):
            responses[e].append(g.text)
            observations[e].append(OBSERVATION)
    return {name: tuple(r) for name, r in results.items()}


def replay(path: str, batch_sizes: list[int], new_tokens: int, temperature: float, openvino_ir: str | None) -> None:
    """Plain `generate`, the engine and the CPU engines (cpu_engines.py) on the prompts of a
    rollouts.parquet, per batch size."""
    import pandas as pd

    prompts = [[int(t) for t in ids] for ids in pd.read_parquet(path, columns=["prompt_ids"]).prompt_ids]
    header(f"rollout engine on {len(prompts)} prompts of {path}, up to {new_tokens} new tokens, T {temperature}")
    model_dir = smollm2_model_dir()
    tokenizer, model = load_tokenizer(model_dir), load_model(model_dir)
    ceiling = matmul_ceiling(torch.float32)
    peak = ceiling / (2 * params_of(model))  # tokens/s at the ceiling
    print(f"   matmul ceiling fp32 {ceiling / 1e9:.0f} GFLOP/s")
    prompt_tokens = sum(map(len, prompts))
    with tempfile.TemporaryDirectory(prefix="cpu-engines-") as work:
        eos = eos_ids(model.generation_config.eos_token_id, tokenizer)
        others = cpu_engines(Path(model_dir), Path(work), tokenizer, model.config, eos, openvino_ir)
        print(
            f"   {'engine':8s} {'batch':>5s} {'seconds':>8s} {'forwards':>9s} {'ms/fwd':>7s} {'new tok/s':>10s} "
            f"{'time/plain':>11s} {'effective':>10s}"
        )
        for batch in batch_sizes:
            base = None
            for name in ("plain", "engine", *others):
                if name in others:
                    start, calls = time.perf_counter(), None
                    gens = others[name].generate(prompts, batch, new_tokens, temperature, seed=7)
                    seconds = time.perf_counter() - start
                else:
                    kind = Plain if name == "plain" else TransformersEngine
                    gens, seconds, calls = run_hf(kind, model, tokenizer, prompts, batch, new_tokens, temperature)
                base = base or seconds
                new = sum(len(g.token_ids) for g in gens)
                forwards = "—" if calls is None else f"{calls:d}"
                per_forward = "—" if calls is None else f"{1000 * seconds / calls:.0f}"
                print(
                    f"   {name:8s} {batch:5d} {seconds:8.1f} {forwards:>9s} {per_forward:>7s} "
                    f"{new / seconds:10.1f} {seconds / base:11.2f} {(prompt_tokens + new) / seconds / peak:10.1%}",
                    flush=True,
                )


def run_hf(kind, model, tokenizer, prompts, batch: int, new_tokens: int, temperature: float):
    """`kind`(model) (Plain or TransformersEngine) on the prompts -> (generations, seconds, forwards)."""
    engine, calls = kind(model, tokenizer, batch_size=batch), []
    hook = model.register_forward_pre_hook(lambda *_, calls=calls: calls.append(1))
    start = time.perf_counter()
    gens = engine.generate(prompts, max_new_tokens=new_tokens, temperature=temperature, top_p=1.0, seed=7)
    seconds = time.perf_counter() - start
    hook.remove()
    return gens, seconds, len(calls)


def start_vllm(engines: dict, path, tokenizer, args):
    """A vLLM server on RLANYTHING_VLLM_PYTHON (start not timed), its engine added to `engines`
    as vllm (vllm16 with --bf16) -> the server, or None if that python is not there."""
    if not Path(os.environ["RLANYTHING_VLLM_PYTHON"]).is_file():
        return None
    from rlanything.config import VllmConfig
    from rlanything.models.engines.vllm_engine import VllmEngine, VllmServer

    cfg = VllmConfig(
        python=os.environ["RLANYTHING_VLLM_PYTHON"],
        max_model_len=2048,
        gpu_memory_utilization=1.0 if not torch.cuda.is_available() else 0.5,
        extra_args=["--enforce-eager"] if not torch.cuda.is_available() else [],
        env={"VLLM_CPU_KVCACHE_SPACE": "2"},
    )
    start = time.perf_counter()
    server = VllmServer(cfg, path, "bfloat16" if args.bf16 else "float32")
    print(f"   vllm server ready in {time.perf_counter() - start:.0f} s (not counted)")
    engines["vllm16" if args.bf16 else "vllm"] = VllmEngine(
        server, tokenizer, engines["engine"].eos_ids, concurrency=args.episodes
    )
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--group", type=int, default=4, help="episodes per task (G)")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=None, help="default 24; 64 with --rollouts")
    parser.add_argument("--bf16", action="store_true", help="also time the engine in bfloat16")
    parser.add_argument("--rollouts", help="replay the prompts of this rollouts.parquet instead")
    parser.add_argument("--batch-sizes", default="32,64,128", help="with --rollouts: batch sizes timed")
    parser.add_argument("--temperature", type=float, default=0.7, help="with --rollouts")
    parser.add_argument("--openvino-ir", help="with --rollouts: an fp32 OpenVINO IR folder to time")
    args = parser.parse_args()
    if args.rollouts:
        sizes = [int(b) for b in args.batch_sizes.split(",")]
        return replay(args.rollouts, sizes, args.new_tokens or 64, args.temperature, args.openvino_ir)
    args.new_tokens = args.new_tokens or 24
    header(
        f"rollout engine: SmolLM2-135M, {args.episodes} episodes (G={args.group}) × {args.turns} turns × "
        f"{args.new_tokens} new tokens"
    )
    args.bf16 = args.bf16 and "bf16" in timed_precisions(["bf16"])  # not on a CPU without bf16 units
    path = smollm2_model_dir()
    tokenizer = load_tokenizer(path)
    model = load_model(path)
    params = params_of(model)
    engines = {
        "plain": Plain(model, tokenizer, batch_size=args.episodes),
        "logits": OutputLogits(model, tokenizer, batch_size=args.episodes),
        "engine": TransformersEngine(model, tokenizer, batch_size=args.episodes),
    }
    if args.bf16:
        engines["engine16"] = TransformersEngine(load_model(path, "bfloat16"), tokenizer, batch_size=args.episodes)
    server = start_vllm(engines, path, tokenizer, args) if os.environ.get("RLANYTHING_VLLM_PYTHON") else None

    play({"plain": engines["plain"]}, tokenizer, args.episodes, args.group, 1, 4)  # warm-up (allocations, kernels)
    results = play(engines, tokenizer, args.episodes, args.group, args.turns, args.new_tokens)
    if server is not None:
        server.close()
    ceiling = matmul_ceiling(torch.float32)
    ceiling16 = matmul_ceiling(torch.bfloat16) if args.bf16 else None

    base = results["plain"][0]
    print(
        f"   matmul ceiling fp32 {ceiling / 1e9:.0f} GFLOP/s"
        + (f", bf16 {ceiling16 / 1e9:.0f} GFLOP/s" if ceiling16 else "")
    )
    print(
        f"   {'engine':9s} {'seconds':>8s} {'new tok/s':>10s} {'time/plain':>11s} {'of ceiling: run':>16s} {'effective':>10s}"
    )
    for name, (seconds, _, prompt_tokens, new, fed) in results.items():
        peak = (ceiling16 if name.endswith("16") else ceiling) * seconds / (2 * params)  # tokens at the ceiling
        print(
            f"   {name:9s} {seconds:8.2f} {new / seconds:10.1f} {seconds / base:11.2f} {fed / peak:16.1%} "
            f"{(prompt_tokens + new) / peak:10.1%}"
        )
    check_logprobs(model, tokenizer, results["engine"][1][0], args.episodes, args.group)


def check_logprobs(model, tokenizer, gens, episodes: int, group: int) -> None:
    """The engine's recorded log-probs of turn 0 against a teacher-forced pass over its own
    samples (its tokens differ from `plain`'s: it samples by the decode module's seed rule, one
    noise stream per row, where generate uses torch's global generator)."""
    prompts = [
        render(
            tokenizer, policy_messages(SYSTEM, [f"Task {e // group}: put the apple in the fridge. {OBSERVATION}"], [])
        )[1]
        for e in range(episodes)
    ]
    seqs, lens = [p + g.token_ids for p, g in zip(prompts, gens)], [len(g.token_ids) for g in gens]
    with torch.no_grad():
        logprobs, mask = response_logprobs(model, seqs, lens, tokenizer.pad_token_id, 1.0)
    gap = max(abs(x - y) for row, g in enumerate(gens) for x, y in zip(logprobs[row][mask[row]].tolist(), g.logprobs))
    print(f"   max |log-prob(engine) - teacher-forced log-prob| on its turn-0 samples = {gap:.2e}")


if __name__ == "__main__":
    main()
