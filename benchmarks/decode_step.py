"""One decoding step of the default engine against the compute limit, with and without the shared prefix.

    python benchmarks/decode_step.py [--rows 64] [--steps 10] [--shapes 69:31,92:110] [--no-ct2]

A step of `rows` sequences runs the model once on one token per row: 2 · params · rows FLOPs,
the compute limit being that over the fp32 matmul FLOP/s timed in this process. Each shape
SHARED:OWN is a decoder state like the shipped run's (configs/smollm2-arith-full.yaml): every
row's context is SHARED tokens all rows have in common (the chat template, system prompt and
instructions: 69 for a rollout, 92 for a judgment) then OWN tokens of its own (the rest of its
prompt and what it generated: ~31 mid-rollout, ~110 mid-judgment). Timed, one after another in
one process on the shipped SmolLM2-135M-Instruct in fp32:
  in rows    the prefix copied into every row's cache (SDPA over SHARED + OWN columns per row)
  held once  the prefix's keys and values held once (models/prefix_attention.py) and OWN columns
             per row: what the engine does when a call's prompts share >= MIN_SHARED tokens
  ct2        CTranslate2 4.x on the model converted to float32 (the `cpu-engines` extra; skipped,
             with how to install it, when missing): every row a whole prompt of SHARED + OWN - 14
             tokens, `generate_batch` run to 4 and to 24 new tokens (no EOS), the step the
             difference over 20, so its middle step holds SHARED + OWN columns like ours. Timed
             before the model is loaded: its OpenMP threads, while alive, slow torch's down.
Printed per shape: ms per step (the fastest of `steps` after warm-up; ct2: the fastest of 3
differences), the fraction of the compute limit, and held-once / in-rows. Best against best:
neighbours on a shared machine only ever slow a step or a matmul down, so the ceiling too is timed
before and after the steps and the better taken (one timed in a slow moment flatters every
fraction). Printed once: the time of the model's Linear layers alone at `rows` rows (nothing else
in a step can beat it) and the time to read the weights once (a step reads them all: a floor set
by memory bandwidth, not by the FLOPs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import header, matmul_ceiling, params_of, timed  # noqa: E402
from cpu_engines import CT2, installed  # noqa: E402

from rlanything.models.decode import Decoder  # noqa: E402
from rlanything.models.generation import eos_ids_of  # noqa: E402
from rlanything.models.loading import load_model, load_tokenizer, smollm2_model_dir  # noqa: E402
from rlanything.models.prefix_attention import SharedPrefix, shared_prefix_attention  # noqa: E402


def step_ms(model, rows: int, shared: int, own: int, held_once: bool, steps: int) -> float:
    """Fastest ms of a decoding step once every row holds shared + own columns."""
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prefix_ids = torch.randint(100, vocab, (1, shared), generator=gen)
    # the warm-up and timed steps add the rest: rows hold `own` columns at the middle timed step
    own_ids = torch.randint(100, vocab, (rows, own - 3 - steps // 2), generator=gen)
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
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        decoder.step()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


def ct2_step_ms(model_dir: Path, work: Path, rows: int, shapes: list[tuple[int, int]]) -> dict:
    """CTranslate2 float32's fastest ms per decoding step of `rows` whole prompts, per (shared, own)."""
    tokenizer = load_tokenizer(model_dir)
    generator = CT2(model_dir, work, "float32", tokenizer, eos_ids_of(model_dir, tokenizer)).generator
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


def weights_read_ms(model) -> float:
    """ms to read every parameter once (a sum over each): the memory floor of a decoding step."""
    params = list(model.parameters())
    return 1000 * timed(lambda: [p.sum() for p in params])


def linear_ms(model, rows: int) -> float:
    """Fastest of 7 passes, in ms, through the model's Linear layers (LM head included) on `rows` rows."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(rows, m.in_features) for m in linears]
    times = []
    for _ in range(8):  # the first a warm-up
        start = time.perf_counter()
        for x, m in zip(inputs, linears):
            m(x)
        times.append(time.perf_counter() - start)
    return 1000 * min(times[1:])


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--shapes", default="69:31,92:110", help="SHARED:OWN columns, comma-separated")
    parser.add_argument("--no-ct2", action="store_true", help="leave CTranslate2 out")
    args = parser.parse_args()
    shapes = [tuple(map(int, shape.split(":"))) for shape in args.shapes.split(",")]
    header("one decoding step against the compute limit")
    ct2 = {}
    if not args.no_ct2 and installed("ctranslate2"):
        with tempfile.TemporaryDirectory() as work:
            ct2 = ct2_step_ms(smollm2_model_dir(), Path(work) / "ct2", args.rows, shapes)
        time.sleep(1)  # the generator is gone; its OpenMP threads wind down before torch's run
    model = load_model(smollm2_model_dir())
    ceilings = [matmul_ceiling()]
    linear, read = linear_ms(model, args.rows), weights_read_ms(model)
    times = {}
    with shared_prefix_attention(model) as switched:
        assert switched, "the model's attention cannot be switched: no shared prefix to measure"
        for shared, own in shapes:
            times[(shared, own)] = [step_ms(model, args.rows, shared, own, held, args.steps) for held in (False, True)]
    ceilings.append(matmul_ceiling())
    flops = 2 * params_of(model) * args.rows
    limit_ms = 1000 * flops / max(ceilings)
    print(
        f"   fp32 ceiling {max(ceilings) / 1e9:.0f} GFLOP/s (the better of {ceilings[0] / 1e9:.0f} before and "
        f"{ceilings[1] / 1e9:.0f} after the steps); {args.rows} rows: {flops / 1e9:.1f} GFLOP, limit {limit_ms:.1f} ms"
    )
    print(
        f"   the Linear layers alone at {args.rows} rows: {linear:.1f} ms ({limit_ms / linear:.0%}); "
        f"reading the weights once: {read:.1f} ms"
    )
    for (shared, own), (rows_ms, once_ms) in times.items():
        line = (
            f"   shared {shared:4d} own {own:4d} | in rows {rows_ms:6.1f} ms ({limit_ms / rows_ms:4.0%}) | "
            f"held once {once_ms:6.1f} ms ({limit_ms / once_ms:4.0%}) | held once / in rows {once_ms / rows_ms:.2f}"
        )
        if (shared, own) in ct2:
            ms = ct2[(shared, own)]
            line += f" | ct2 {ms:6.1f} ms ({limit_ms / ms:4.0%}) | held once / ct2 {once_ms / ms:.2f}"
        print(line)


if __name__ == "__main__":
    main()
