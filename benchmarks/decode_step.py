"""One decoding step of the default engine against the compute limit, in fp32 and bf16, with and
without the shared prefix, beside CTranslate2 and OpenVINO GenAI.

    python -m benchmarks.decode_step [--rows 64] [--steps 10] [--shapes 69:31,92:110]
        [--precision fp32,bf16] [--no-ct2] [--openvino default|f32,default|none] [--openvino-ir DIR]
        [--profile]

A step of `rows` sequences runs the model once on one token per row: 2 · params · rows FLOPs,
a precision's compute limit being that over the matmul FLOP/s timed in this process in the same
dtype (fp32 for fp32, bf16 for bf16). Each shape SHARED:OWN is a decoder state like the shipped
run's (configs/smollm2-arith-full.yaml): every row's context is SHARED tokens all rows have in
common (the chat template, system prompt and instructions: 69 for a rollout, 92 for a judgment)
then OWN tokens of its own (the rest of its prompt and what it generated: ~31 mid-rollout, ~110
mid-judgment). Printed first: the CPU's model name and which of its flags matter to fp32 and bf16
matmuls (avx2, avx512f, avx512_bf16, amx_bf16, amx_tile). Timed, one after another in one process
on the same random token rows (seed 0), for each precision of --precision in turn, the shipped
SmolLM2-135M-Instruct loaded in it (`load_model(path, "float32" | "bfloat16")`; one precision's
model freed before the next is loaded):
  in rows    the prefix copied into every row's cache (SDPA over SHARED + OWN columns per row)
  held once  the prefix's keys and values held once (models/engines/prefix_attention.py) and OWN columns
             per row: what the engine does when a call's prompts share >= MIN_SHARED tokens
Timed before our model is loaded (their threads, while alive, slow torch's down):
  ct2        CTranslate2 4.x on the model converted to float32 (the `cpu-engines` extra; skipped,
             with how to install it, when missing): every row a whole prompt of SHARED + OWN - 14
             tokens, `generate_batch` run to 4 and to 24 new tokens (no EOS), the step the
             difference over 20, so its middle step holds SHARED + OWN columns like ours.
  openvino   OpenVINO GenAI's ContinuousBatchingPipeline (cpu_engines.py) on the fp32 IR (from
             RLANYTHING_OPTIMUM_PYTHON's optimum-cli or --openvino-ir; skipped, with how to get
             one, without): `default` compiles it at OpenVINO's own CPU precision (not forced:
             bf16 on a CPU with bf16 units; printed, with the KV cache's, as the CPU plugin
             reports its defaults), `f32` with f32 forced. Our rows as whole prompts (the
             prefix in every row, no prefix caching), queued at once, no EOS, sampled at T = 1
             with log-probs; the first pipeline step (the prefill) and 3 more are warm-up, then
             `steps` steps are timed one by one, so the middle one holds SHARED + OWN columns.
Printed per shape: ms per step (the fastest of `steps` after warm-up; ct2: the fastest of 3
differences), the fraction of the compute limit of the step's precision (openvino: of the
precision it reports; ct2: fp32), held-once / in-rows, the bf16 speed-up (fp32 ms / bf16 ms,
above 1 when bf16 is faster) for both layouts, and held-once / ct2 (fp32) or / openvino (its
precision). Best against best: neighbours on a shared machine only ever slow a step or a matmul
down, so each timed precision's ceiling is timed before the first precision's steps and after each
precision's, and the best taken (one timed in a slow moment flatters every fraction). Printed
once per precision: the time of the model's Linear layers alone at `rows` rows (nothing else in a
step can beat it) and the time to read the weights once (a step reads them all: a floor set by
memory bandwidth, not by the FLOPs). Printed once when fp32 and bf16 both run: the first shape's
rows (SHARED + OWN - 3 - steps // 2 tokens each, as the timed steps start from) teacher-forced
through both models, and the mean, 99th percentile and max over every predicted token of
|log p_fp32 - log p_bf16| (log_softmax of the logits cast to fp32, T = 1, as the engine records),
the prefix's tokens (the same in every row) counted once. With --profile, per precision: where
the last shape's held-once step goes (torch's profiler, self time per op, grouped into PARTS).

Only the precisions of --precision are timed, their matmul ceilings included. On a CPU without
bf16 units (neither amx_bf16 nor avx512_bf16 among its flags) bf16 is left out, with one line
saying so (`bf16 not timed on this CPU: ...`): torch emulates it there on slow fallback kernels,
so its figures would time the emulation (and a 2048² bf16 matmul takes minutes). The flags are
/proc/cpuinfo's, or the environment variable RLANYTHING_CPU_FLAGS (space-separated) when it is
set: `RLANYTHING_CPU_FLAGS="avx2 avx512f" python -m benchmarks.decode_step` prints what such a
CPU prints (the test suite checks it so).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, DynamicCache

from benchmarks.common import (
    cpu_line,
    fastest_ms,
    header,
    matmul_ceiling,
    params_of,
    profile_parts,
    timed,
    timed_precisions,
)
from benchmarks.cpu_engines import CT2, OpenVino, default_precision, export_openvino, installed
from rlanything.models.engines.decode import Decoder
from rlanything.models.engines.generation import eos_ids_of
from rlanything.models.engines.prefix_attention import SharedPrefix, shared_prefix_attention
from rlanything.models.loading import load_model, load_tokenizer, smollm2_model_dir

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
OV_NAMES = {"f32": "fp32", "bf16": "bf16"}  # OpenVINO's precision names -> ours


def random_rows(vocab: int, rows: int, shared: int, own: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefix ids (1, shared) and each row's own ids, short of `own` by the warm-up and half
    the timed steps, so rows hold `own` own columns at the middle timed step (seed 0)."""
    gen = torch.Generator().manual_seed(0)
    prefix_ids = torch.randint(100, vocab, (1, shared), generator=gen)
    return prefix_ids, torch.randint(100, vocab, (rows, own - 3 - steps // 2), generator=gen)


def step_ms(model, rows: int, shared: int, own: int, held_once: bool, steps: int) -> float:
    """Fastest ms of a decoding step once every row holds shared + own columns."""
    return fastest_ms(warm_decoder(model, rows, shared, own, held_once, steps).step, steps)


# where a step's time goes: aten ops by name (profiler self time); the rest is "other"
PARTS = {
    "Linear layers": {"aten::mm", "aten::addmm", "aten::linear"},
    "attention": {"aten::bmm", "aten::_softmax", "aten::_scaled_dot_product_flash_attention_for_cpu"},
    "copies and casts": {"aten::copy_", "aten::cat", "aten::_to_copy", "aten::contiguous", "aten::clone"},
    "sampling (vocab-wide)": {"aten::cumsum", "aten::_log_softmax", "aten::exp", "aten::div", "aten::argmax"},
    "elementwise (norms/rotary/MLP gate)": {
        "aten::mul",
        "aten::add",
        "aten::silu",
        "aten::pow",
        "aten::mean",
        "aten::rsqrt",
        "aten::neg",
        "aten::masked_fill",
        "aten::add_",
        "aten::sub",
        "aten::div_",
    },
}


def step_profile(model, rows: int, shared: int, own: int, steps: int) -> dict[str, float]:
    """ms per held-once decoding step in each of PARTS (and "other", "total"), from torch's
    profiler over `steps` steps: the profiler's own cost inflates the total a little."""
    decoder = warm_decoder(model, rows, shared, own, True, steps)
    with torch.profiler.profile() as prof:
        for _ in range(steps):
            decoder.step()
    return profile_parts(prof, PARTS, per=steps)


def warm_decoder(model, rows: int, shared: int, own: int, held_once: bool, steps: int) -> Decoder:
    """A Decoder of `rows` rows past its prefill and 3 steps: at the middle of the next `steps`
    steps every row holds shared + own columns (the prefix held once or in every row)."""
    prefix_ids, own_ids = random_rows(model.config.vocab_size, rows, shared, own, steps)
    prefix = None
    if held_once:
        cache = DynamicCache(config=model.config)
        model(input_ids=prefix_ids, cache=cache, use_cache=True)
        prefix = SharedPrefix([x.keys[0] for x in cache.layers], [x.values[0] for x in cache.layers])
        ids = own_ids
    else:
        ids = torch.cat([prefix_ids.expand(rows, -1), own_ids], 1)
    decoder = Decoder(model, [], steps + 8, 1.0, 1.0, 0, prefix=prefix)  # no EOS: every row runs
    decoder.admit(list(range(rows)), ids, torch.ones_like(ids), None)
    for _ in range(3):
        decoder.step()
    return decoder


def ct2_step_ms(
    model_dir: Path, work: Path, rows: int, shapes: list[tuple[int, int]], quantization: str = "float32"
) -> dict:
    """CTranslate2's fastest ms per decoding step of `rows` whole prompts, per (shared, own), on
    the model converted to `quantization` (float32, or int8: int8 weights, float32 elsewhere)."""
    tokenizer = load_tokenizer(model_dir)
    generator = CT2(model_dir, work, quantization, tokenizer, eos_ids_of(model_dir, tokenizer)).generator
    gen = torch.Generator().manual_seed(0)

    def run(prompts, n: int) -> float:
        start = time.perf_counter()
        generator.generate_batch(
            prompts, max_batch_size=rows, max_length=n, min_length=n, sampling_topk=0, sampling_temperature=1.0
        )
        return time.perf_counter() - start

    out = {}
    for shared, own in shapes:
        ids = torch.randint(100, tokenizer.vocab_size, (rows, shared + own - 14), generator=gen)
        prompts = [tokenizer.convert_ids_to_tokens(row) for row in ids.tolist()]
        run(prompts, 2)  # warm-up
        out[(shared, own)] = 1000 * min((run(prompts, 24) - run(prompts, 4)) / 20 for _ in range(3))
    return out


def ov_step_ms(engine: OpenVino, vocab: int, rows: int, shapes: list[tuple[int, int]], steps: int) -> dict:
    """OpenVINO's fastest ms per pipeline step of `rows` whole prompts (our rows), per (shared, own)."""
    out = {}
    for shared, own in shapes:
        prefix_ids, own_ids = random_rows(vocab, rows, shared, own, steps)
        prompts = torch.cat([prefix_ids.expand(rows, -1), own_ids], 1).tolist()
        pipe = engine.pipeline(rows, len(prompts[0]) + steps + 8)
        handles = engine.add(pipe, prompts, steps + 8, 1.0, 0, stop=False)  # a dropped handle drops its request
        for _ in range(4):  # the prefill (every prompt at once) and 3 steps
            pipe.step()
        ms = fastest_ms(pipe.step, steps)
        while pipe.has_non_finished_requests():
            pipe.step()
        assert all(len(h.read_all()[0].generated_ids) == steps + 8 for h in handles), "a request ended early"
        out[(shared, own)] = ms
    return out


def openvino_runs(model_dir: Path, work: Path, args, shapes: list[tuple[int, int]]) -> dict:
    """{label: (our precision name, {shape: ms})} of the --openvino variants (none when it or an IR is missing)."""
    variants = [v for v in args.openvino.split(",") if v and v != "none"]
    if not variants or not installed("openvino_genai"):
        return {}
    ir_dir = export_openvino(model_dir, work / "openvino-fp32", args.openvino_ir)
    if ir_dir is None:
        return {}
    tokenizer = load_tokenizer(model_dir)
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    out = {}
    for variant in variants:
        if variant == "default":
            props = default_precision()
            print(
                f"   openvino at its default precision: inference {props['INFERENCE_PRECISION_HINT']}, "
                f"KV cache {props['KV_CACHE_PRECISION']}, dynamic quantization group "
                f"{props['DYNAMIC_QUANTIZATION_GROUP_SIZE']} (the CPU plugin's defaults; none forced)"
            )
            precision = OV_NAMES.get(props["INFERENCE_PRECISION_HINT"], props["INFERENCE_PRECISION_HINT"])
        else:
            precision = "fp32"
        engine = OpenVino(ir_dir, tokenizer, eos_ids_of(model_dir, tokenizer), config, variant)
        out[f"openvino {variant}"] = (precision, ov_step_ms(engine, config.vocab_size, args.rows, shapes, args.steps))
        del engine
        gc.collect()
        time.sleep(1)  # its threads wind down before the next run
    return out


def weights_read_ms(model) -> float:
    """ms to read every parameter once (a sum over each): the memory floor of a decoding step."""
    params = list(model.parameters())
    return 1000 * timed(lambda: [p.sum() for p in params])


def linear_ms(model, rows: int) -> float:
    """Fastest of 7 passes, in ms, through the model's Linear layers (LM head included) on `rows` rows."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(rows, m.in_features, dtype=m.weight.dtype) for m in linears]

    def one_pass() -> None:
        for x, m in zip(inputs, linears):
            m(x)

    one_pass()  # a warm-up
    return fastest_ms(one_pass, 7)


def teacher_forced_logprobs(model, ids: torch.Tensor, chunk: int = 8) -> torch.Tensor:
    """(rows, L - 1) log p of each next token at T = 1, log_softmax over the logits cast to fp32."""
    out = []
    for part in ids.split(chunk):  # (chunk, L, vocab) fp32 logits at a time, not all rows'
        logprobs = model(input_ids=part).logits[:, :-1].float().log_softmax(-1)
        out.append(logprobs.gather(-1, part[:, 1:, None])[..., 0])
    return torch.cat(out)


def precision_run(model_dir: Path, name: str, args, shapes: list[tuple[int, int]]) -> dict:
    """One precision's model loaded, timed (Linear layers, weights read, both layouts per shape),
    its log-probs on the first shape's rows taken when both precisions run, then freed."""
    model = load_model(model_dir, {"fp32": "float32", "bf16": "bfloat16"}[name])
    out = {"linear": linear_ms(model, args.rows), "read": weights_read_ms(model), "times": {}}
    out["flops"] = 2 * params_of(model) * args.rows
    with shared_prefix_attention(model) as switched:
        assert switched, "the model's attention cannot be switched: no shared prefix to measure"
        for shared, own in shapes:
            out["times"][(shared, own)] = [
                step_ms(model, args.rows, shared, own, held, args.steps) for held in (False, True)
            ]
        if args.profile:
            out["profile"] = step_profile(model, args.rows, *shapes[-1], args.steps)
    if len(args.precisions) > 1:
        prefix_ids, own_ids = random_rows(model.config.vocab_size, args.rows, *shapes[0], args.steps)
        logprobs = teacher_forced_logprobs(model, torch.cat([prefix_ids.expand(args.rows, -1), own_ids], 1))
        shared = shapes[0][0] - 1  # the prefix's predicted tokens: the same in every row, counted once
        out["logprobs"] = torch.cat([logprobs[0, :shared], logprobs[:, shared:].flatten()])
    del model
    gc.collect()
    return out


def ceilings_now(ceilings: dict) -> None:
    """The matmul FLOP/s of each precision in `ceilings` (those timed) timed now, appended to its list."""
    for name, times in ceilings.items():
        times.append(matmul_ceiling(DTYPES[name]))


def report(args, shapes, runs: dict, ceilings: dict, engines: dict) -> None:
    limit = {}
    for name in ceilings:
        best, flops = max(ceilings[name]), next(iter(runs.values()))["flops"]
        limit[name] = 1000 * flops / best
        timed_at = ", ".join(f"{c / 1e9:.0f}" for c in ceilings[name])
        print(
            f"   {name} ceiling {best / 1e9:.0f} GFLOP/s (the best of {timed_at}: before the first precision's "
            f"steps and after each's); {args.rows} rows: {flops / 1e9:.1f} GFLOP, limit {limit[name]:.1f} ms"
        )
    for name, run in runs.items():
        print(
            f"   {name}: the Linear layers alone at {args.rows} rows: {run['linear']:.1f} ms "
            f"({limit[name] / run['linear']:.0%}); reading the weights once: {run['read']:.1f} ms"
        )
    for shape in shapes:
        lead = f"   shared {shape[0]:4d} own {shape[1]:4d} |"
        for name, run in runs.items():
            rows_ms, once_ms = run["times"][shape]
            print(
                f"{lead} {name} | in rows {rows_ms:6.1f} ms ({limit[name] / rows_ms:4.0%}) | held once {once_ms:6.1f} "
                f"ms ({limit[name] / once_ms:4.0%}) | held once / in rows {once_ms / rows_ms:.2f}"
            )
        if "fp32" in runs and "bf16" in runs:
            (f_rows, f_once), (b_rows, b_once) = runs["fp32"]["times"][shape], runs["bf16"]["times"][shape]
            print(
                f"{lead} bf16 speed-up (fp32 ms / bf16 ms) | in rows {f_rows / b_rows:.2f} | held once {f_once / b_once:.2f}"
            )
        for label, (precision, times) in engines.items():
            ms, line = times[shape], f"{lead} {label} ({precision}) {times[shape]:6.1f} ms"
            if precision in limit:
                line += f" ({limit[precision] / ms:4.0%})"
            if precision in runs:
                line += f" | held once {precision} / {label.split()[0]} {runs[precision]['times'][shape][1] / ms:.2f}"
            print(line)
    for name, run in runs.items():
        if "profile" in run:
            parts = ", ".join(f"{part} {ms:.1f}" for part, ms in run["profile"].items())
            print(
                f"   {name}: where a held-once step of shape {shapes[-1][0]}:{shapes[-1][1]} goes (ms, profiled): {parts}"
            )
    if "logprobs" in runs.get("bf16", {}) and "logprobs" in runs.get("fp32", {}):
        diff = (runs["fp32"]["logprobs"] - runs["bf16"]["logprobs"]).abs()
        print(
            f"   |log p fp32 - log p bf16| on shape {shapes[0][0]}:{shapes[0][1]}'s rows teacher-forced "
            f"({diff.numel()} tokens, T = 1): mean {diff.mean():.4f}, p99 {diff.quantile(0.99):.4f}, max {diff.max():.4f}"
        )


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--shapes", default="69:31,92:110", help="SHARED:OWN columns, comma-separated")
    parser.add_argument("--precision", default="fp32,bf16", help="of fp32, bf16: comma-separated, timed in turn")
    parser.add_argument("--no-ct2", action="store_true", help="leave CTranslate2 out")
    parser.add_argument("--openvino", default="default", help="of default, f32 (comma-separated), or none")
    parser.add_argument("--openvino-ir", default=None, help="an fp32 OpenVINO IR folder already exported")
    parser.add_argument("--profile", action="store_true", help="also where the last shape's held-once step goes")
    args = parser.parse_args()
    shapes = [tuple(map(int, shape.split(":"))) for shape in args.shapes.split(",")]
    args.precisions = args.precision.split(",")
    assert args.precisions and set(args.precisions) <= set(DTYPES), args.precision
    header(f"one decoding step against the compute limit, {' and '.join(args.precisions)}")
    print(f"   {cpu_line()}", flush=True)
    args.precisions = timed_precisions(args.precisions)
    if not args.precisions:
        return
    model_dir, engines = smollm2_model_dir(), {}
    with tempfile.TemporaryDirectory() as work:
        if not args.no_ct2 and installed("ctranslate2"):
            engines["ct2"] = ("fp32", ct2_step_ms(model_dir, Path(work) / "ct2", args.rows, shapes))
            time.sleep(1)  # the generator is gone; its OpenMP threads wind down before torch's run
        engines.update(openvino_runs(model_dir, Path(work), args, shapes))
    ceilings, runs = {name: [] for name in args.precisions}, {}
    ceilings_now(ceilings)
    for name in args.precisions:
        runs[name] = precision_run(model_dir, name, args, shapes)
        ceilings_now(ceilings)
    report(args, shapes, runs, ceilings, engines)


if __name__ == "__main__":
    main()
