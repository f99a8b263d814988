"""What a forward pass costs in memory, from a model's config: the estimates by which the engines
and the trainer cut their work to the process's memory budget (rlanything/memory.py).

They are upper bounds in the spirit of a planner, not measurements: every activation counted at 4
bytes (fp32; bf16 autocast keeps some in 2), the attention mask as dense floats, no buffer freed
early. The budget test (tests/models/test_memory_budget.py) measures what a process then peaks at.

Per token of a llama-like layer (hidden H, MLP width I): a training forward keeps for its
backward about 8H + 4I values a layer (norm inputs and outputs, q/k/v, the attention output, the
MLP's gate, up, activation and product), all layers together; an inference forward frees each
layer's as it goes, so about 5H + 3I values of one layer at a time. Logits are V floats a kept
position, in several copies: the logits, the rows gathered from them, their log_softmax and, when
training, the gradients. Measured on the tiny model (V 49,152, where the logits are nearly all of
it): 4.0 copies a position in a PPO update, 2.9 in `score`; counted as 5 and 4. On SmolLM2-135M,
one sample of 600 and of 1,200 tokens in a PPO update (bf16 autocast) peaked 465 and 1,094 MiB
above the process, its gradients (515 MiB, `trainer.pending_bytes`) apart: the estimate, 751 and
1,493 MiB, is 1.4-1.6 times that.
"""

from __future__ import annotations

FLOAT = 4  # bytes of an activation, counted as fp32


def kv_bytes_per_token(config, element_size: int) -> int:
    """Bytes of keys and values one token takes in a full-attention cache, all layers together."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * dim * element_size


def activation_bytes_per_token(config, training: bool) -> int:
    """Activations one token holds in a forward: all layers' kept for the backward (training), or
    one layer's at a time (inference). SmolLM2-135M (H 576, I 1536, 30 layers): 1,290,240 bytes
    training, 29,952 inference."""
    h, i = config.hidden_size, config.intermediate_size
    if training:
        return config.num_hidden_layers * (8 * h + 4 * i) * FLOAT
    return (5 * h + 3 * i) * FLOAT


def logits_bytes(config, positions: int, training: bool) -> int:
    """The logits of `positions` kept positions, all copies (module docstring). SmolLM2
    (V 49,152), 1 position: 786,432 bytes inference, 983,040 training."""
    return positions * config.vocab_size * FLOAT * (5 if training else 4)


def forward_bytes(config, rows: int, width: int, kept: int, training: bool) -> int:
    """A forward over `rows` rows of `width` tokens (left-padded batch or packed prefix trees,
    with their (rows, width, width) mask) whose logits are kept at `kept` positions in all."""
    tokens = rows * width
    mask = rows * width * width * FLOAT
    return tokens * activation_bytes_per_token(config, training) + mask + logits_bytes(config, kept, training)
