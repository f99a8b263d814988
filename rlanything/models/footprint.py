"""What a forward pass costs in memory, from a model's config: the estimates by which the engines
and the trainer cut their work to the process's memory budget (rlanything/memory.py).

They are upper bounds in the spirit of a planner, not measurements: every activation counted at 4
bytes (fp32; bf16 autocast keeps some in 2), the attention mask as dense floats, no buffer freed
early. The budget test (tests/models/test_memory_budget.py) measures what a process then peaks at.

Per token of a llama-like layer (hidden H, MLP width I): a training forward keeps for its
backward the layer's inputs and intermediates (norm inputs and outputs, q/k/v, the attention
output, the MLP's gate, up, activation and product), all layers together; an inference forward
frees each layer's as it goes, so about 5H + 3I values of one layer at a time. Measured on
SmolLM2-135M (fresh optimizer state aside, peak above the RSS before a micro-batch, 6 shapes of
320-1,630 tokens, November 2026): in fp32 13H + 6I values a layer kept, 4 bytes each (8H + 4I,
the count before, was 1.4-1.6x short); under bf16 autocast 8H + 4I at 4 bytes, plus a further
0.43 GiB a micro-batch whatever its size, counted as 3.2 bytes a parameter
(`AUTOCAST_BYTES_PER_PARAM`; we take it to be the autocast cache's bf16 copy of every weight and
the weights' bf16 gradients before they join the fp32 ones: not traced). With these the estimate
came within -0.05 to +0.28 GiB of the measured micro-batches in bf16 and -0.20 to +0.11 GiB in
fp32 (estimate minus measured). Scoring without gradient under autocast (the update's old log-probs) holds the bf16 copies
too: measured on SmolLM2, 0.28-0.31 GiB above the activations at widths 832-3,232, counted as 2.5
bytes a parameter (`AUTOCAST_SCORING_BYTES_PER_PARAM`; 2 would be one bf16 copy). Those packed
forwards pass `use_cache=False`: transformers otherwise builds a KV cache of every layer that
nothing reads, which tripled a scoring forward's memory (fp32, one row of 3,232 tokens: 0.46 GiB
against 0.14, December 2026). A fresh process's first forward and backward also map ~0.3-0.5 GiB of library code and
allocator arenas once; that is part of the budget's margin. Logits are V floats a kept
position, in several copies: the logits, the rows gathered from them, their log_softmax and, when
training, the gradients. Measured on the tiny model (V 49,152, where the logits are nearly all of
it): 4.0 copies a position in a PPO update, 2.9 in `score`; counted as 5 and 4.
"""

from __future__ import annotations

FLOAT = 4  # bytes of an activation, counted as fp32
AUTOCAST_BYTES_PER_PARAM = 3.2  # a bf16 training forward's weight copies and gradients (module docstring)
AUTOCAST_SCORING_BYTES_PER_PARAM = 2.5  # a bf16 forward without gradient: the weights' bf16 copies
CHECKPOINT_LAYERS_HELD = 8  # layers' intermediates a checkpointed backward holds at once (measured 5-7)


def kv_bytes_per_token(config, element_size: int) -> int:
    """Bytes of keys and values one token takes in a full-attention cache, all layers together."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * dim * element_size


def activation_bytes_per_token(config, training: bool, autocast: bool = False, checkpointed: bool = False) -> int:
    """Activations one token holds in a forward: all layers' kept for the backward (training, in
    fp32 or under bf16 `autocast`), or one layer's at a time (inference). With the layers
    `checkpointed` (`optim.gradient_checkpointing`) a training token keeps each layer's input (H
    floats) and what the backward holds while it recomputes, counted as `CHECKPOINT_LAYERS_HELD`
    layers' fp32 intermediates (measured on the budget test's 32-layer model, H 128: 5-7 layers'
    worth in fp32, more under autocast). SmolLM2-135M (H 576, I 1536, 30 layers): 2,004,480
    bytes training in fp32, 1,290,240 under autocast, 603,648 checkpointed, 29,952 inference."""
    h, i = config.hidden_size, config.intermediate_size
    if training:
        kept = 8 * h + 4 * i if autocast else 13 * h + 6 * i
        every_layer = config.num_hidden_layers * kept * FLOAT
        if checkpointed:  # fp32's count whatever the autocast: the recompute held more under it
            held = CHECKPOINT_LAYERS_HELD * (13 * h + 6 * i)
            return min(every_layer, (config.num_hidden_layers * h + held) * FLOAT)
        return every_layer
    return (5 * h + 3 * i) * FLOAT


def logits_bytes(config, positions: int, training: bool) -> int:
    """The logits of `positions` kept positions, all copies (module docstring). SmolLM2
    (V 49,152), 1 position: 786,432 bytes inference, 983,040 training."""
    return positions * config.vocab_size * FLOAT * (5 if training else 4)


def tree_attention_bytes(config, nodes: int, keys: int) -> int:
    """What a training forward through tree attention (`training.tree_attention`) keeps beyond
    the activations: its calls' keys and values (`keys`, `tree_attention.gathered_keys`: under
    bf16 autocast every key a call reads, cast into a copy; in fp32 those of calls that gather,
    the others read a view) and their queries and outputs (`nodes`), every layer, counted at
    FLOAT bytes. Measured on SmolLM2 under bf16 autocast, 9 micro-batches of a text-game policy
    update (one row each, 757-2,857 nodes, 2,300-17,900 keys read, December 2026): without this
    term the estimate fell short by 0.05-1.00 GiB, the most on the widest rows; with it, short by
    at most 0.05 and over by at most 0.66. In fp32 measured only on the budget test's model
    (tests/models/test_memory_budget.py: 8 branches of a 1,000-token prompt, short by 0.09).
    SmolLM2 (H 576, 3 KV heads of 64): 46,080 bytes a key, 138,240 a node."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_layer = keys * 2 * heads * dim + nodes * 2 * config.num_attention_heads * dim
    return config.num_hidden_layers * per_layer * FLOAT


def forward_bytes(
    config,
    rows: int,
    width: int,
    kept: int,
    training: bool,
    autocast_params: int = 0,
    checkpointed: bool = False,
    tree: tuple[int, int] | None = None,
) -> int:
    """A forward over `rows` rows of `width` tokens (left-padded batch or packed prefix trees,
    with their (rows, width, width) mask) whose logits are kept at `kept` positions in all;
    `autocast_params`: the model's parameters when it runs under bf16 autocast (its weight
    copies, `AUTOCAST_BYTES_PER_PARAM` training, `AUTOCAST_SCORING_BYTES_PER_PARAM` scoring), 0 in
    fp32 or in an engine (whose weights are already in the precision it runs); `checkpointed`:
    the layers recompute in the backward (`activation_bytes_per_token`); `tree`: (nodes, gathered
    keys) of rows that go through tree attention, which builds no (rows, width, width) mask and
    keeps `tree_attention_bytes` when training (one layer's of it in inference)."""
    tokens = rows * width
    if tree is None:
        attention = rows * width * width * FLOAT  # the (rows, width, width) mask
    else:  # an inference forward frees each layer's gathered keys as it goes
        attention = tree_attention_bytes(config, *tree) // (1 if training else config.num_hidden_layers)
    activations = tokens * activation_bytes_per_token(config, training, autocast_params > 0, checkpointed)
    per_param = AUTOCAST_BYTES_PER_PARAM if training else AUTOCAST_SCORING_BYTES_PER_PARAM
    copies = int(per_param * autocast_params)
    return activations + attention + logits_bytes(config, kept, training) + copies
