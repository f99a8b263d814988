"""One decoding step of the default engine against the compute limit, with and without the shared prefix.

    python benchmarks/decode_step.py [--rows 64] [--steps 10] [--shapes 69:31,92:110]

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
Printed per shape: ms per step (median of `steps` after warm-up), the fraction of the compute
limit, and held-once / in-rows. The matmuls alone reach a fraction of the limit too: printed for
this model's layer shapes at `rows` rows (nothing else in a step can beat it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import header, matmul_ceiling, params_of  # noqa: E402

from rlanything.models.decode import Decoder  # noqa: E402
from rlanything.models.loading import load_model, smollm2_model_dir  # noqa: E402
from rlanything.models.prefix_attention import SharedPrefix, shared_prefix_attention  # noqa: E402


def step_ms(model, rows: int, shared: int, own: int, held_once: bool, steps: int) -> float:
    """Median ms of a decoding step once every row holds shared + own columns."""
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
    return 1000 * statistics.median(times)


def matmul_fraction(model, rows: int, ceiling: float) -> float:
    """FLOP/s of the model's Linear layers (LM head included) on `rows` rows, over the ceiling."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(rows, m.in_features) for m in linears]
    flops = sum(2 * rows * m.in_features * m.out_features for m in linears)
    for x, m in zip(inputs, linears):
        m(x)
    start = time.perf_counter()
    for _ in range(3):
        for x, m in zip(inputs, linears):
            m(x)
    return flops * 3 / (time.perf_counter() - start) / ceiling


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--shapes", default="69:31,92:110", help="SHARED:OWN columns, comma-separated")
    args = parser.parse_args()
    header("one decoding step against the compute limit")
    model = load_model(smollm2_model_dir())
    ceiling = matmul_ceiling()
    flops = 2 * params_of(model) * args.rows
    limit_ms = 1000 * flops / ceiling
    print(
        f"   fp32 ceiling {ceiling / 1e9:.0f} GFLOP/s; {args.rows} rows: {flops / 1e9:.1f} GFLOP, limit {limit_ms:.1f} ms"
    )
    print(
        f"   the Linear layers alone at {args.rows} rows: {matmul_fraction(model, args.rows, ceiling):.0%} of the ceiling"
    )
    with shared_prefix_attention(model) as switched:
        assert switched, "the model's attention cannot be switched: no shared prefix to measure"
        for shape in args.shapes.split(","):
            shared, own = map(int, shape.split(":"))
            rows_ms = step_ms(model, args.rows, shared, own, False, args.steps)
            once_ms = step_ms(model, args.rows, shared, own, True, args.steps)
            print(
                f"   shared {shared:4d} own {own:4d} | in rows {rows_ms:6.1f} ms ({limit_ms / rows_ms:4.0%}) | "
                f"held once {once_ms:6.1f} ms ({limit_ms / once_ms:4.0%}) | held once / in rows {once_ms / rows_ms:.2f}"
            )


if __name__ == "__main__":
    main()
