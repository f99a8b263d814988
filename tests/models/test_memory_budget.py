"""The memory budget (`run.memory_gb`, rlanything/memory.py) holds: a PPO update and a scoring
call on a tiny model whose single micro-batch would peak far above a small budget stay under it
once it is set, compute the same numbers, and work that cannot fit alone fails before it starts
with an error naming the setting.

The cases run in one fresh process, each measuring its own peak resident memory (VmHWM reset). The
tiny model's 49,152-token vocabulary makes the logits the large part: 16 samples of 160 response
tokens keep 2,560 positions, 0.47 GiB of fp32 logits per copy.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlanything import memory

BUDGET_GB = 1.0
MARGIN_GB = 0.25  # what a process may pass its budget by (docs/scaling.md, "Memory")

CASES = r"""
import json, sys, torch
from rlanything import memory
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.loading import load_model, load_tokenizer, resolve_model_path
from rlanything.models.training.trainer import Sample, make_optimizer, ppo_update

path = resolve_model_path("builtin:tiny-random")
tokenizer = load_tokenizer(path)
g = torch.Generator().manual_seed(0)
seqs = [torch.randint(5, 4000, (16 + 160,), generator=g).tolist() for _ in range(16)]
samples = [Sample(s, 160, [-1.0] * 160, (-1.0) ** k) for k, s in enumerate(seqs)]

def decode():
    # KV-heavy (16 KiB a token): 24 rows of 700-900 tokens, three turns that extend the last
    from rlanything.models.engines.generation import PrefixCache
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=8, head_dim=32)
    engine = TransformersEngine(LlamaForCausalLM(config).eval(), tokenizer, batch_size=24,
                                keep_bytes=2**30)  # the engine keeps at most a quarter of the budget
    engine.eos_ids = []  # every row runs its 8 tokens
    cache, prompts, out = PrefixCache(), [s * 5 for s in seqs] + [s * 4 for s in seqs[:8]], []
    for turn in range(3):
        gens = engine.generate(prompts, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=turn, prefix_cache=cache)
        out.append([g.token_ids for g in gens])
        prompts = [p + g.token_ids + s[:100] for p, g, s in zip(prompts, gens, seqs * 2)]
    return {"peak_gb": memory.peak_gb(), "out": out}

def case(what, budget):
    model = load_model(path)
    memory._budget[0] = float("inf") if budget is None else budget * 2**30
    memory.reset_peak()
    if what == "decode":
        return decode()
    if what == "score":
        engine = TransformersEngine(model, tokenizer, batch_size=16)
        out = engine.score([s[:16] for s in seqs], [s[16:] for s in seqs], temperature=1.0)
        return {"peak_gb": memory.peak_gb(), "out": out}
    opt = make_optimizer(model, lr=1e-3, weight_decay=0.0)
    try:
        ppo_update(model, opt, samples, pad_id=tokenizer.pad_token_id, temperature=1.0, clip_eps=0.2,
                   kl_beta=0.01, grad_clip=1.0, updates=1, micro_batch_size=16, seed=0)
    except memory.MemoryBudgetError as e:
        return {"error": str(e), "unchanged": torch.equal(model.lm_head.weight, load_model(path).lm_head.weight)}
    return {"peak_gb": memory.peak_gb(), "out": [p.detach().flatten()[:256].tolist() for p in model.parameters()]}

# bounded first: memory an unbounded case freed may stay in the process (the allocator keeps it)
order = [("update", BUDGET), ("score", BUDGET), ("decode", BUDGET), ("update", None), ("score", None), ("decode", None),
         ("update", 0.3)]
print(json.dumps({f"{what} {budget}": case(what, budget) for what, budget in order}))
"""


@pytest.fixture(scope="module")
def cases() -> dict:
    """Every case in one fresh process (one start of Python and torch): "update 1.0", "score
    1.0", "update None", "score None", "update 0.3" -> their peaks and outputs, or the error."""
    code = CASES.replace("BUDGET", repr(BUDGET_GB))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("what", ["update", "score", "decode"])
def test_a_small_budget_holds_and_changes_no_number(cases, what):
    """Decoding: three turns of 24 long rows, each extending the last turn's prompts and reusing
    its kept KV; under the budget fewer rows decode at once and fewer are kept, and every row
    samples the same tokens (the seed rule)."""
    free, bounded = cases[f"{what} None"], cases[f"{what} {BUDGET_GB}"]
    print(f"{what}: peak {free['peak_gb']:.2f} GiB unbounded, {bounded['peak_gb']:.2f} GiB under {BUDGET_GB}")
    assert free["peak_gb"] > BUDGET_GB + MARGIN_GB  # the case would break the budget: the test can fail
    assert bounded["peak_gb"] <= BUDGET_GB + MARGIN_GB
    if what == "decode":
        assert bounded["out"] == free["out"]
        return
    for mine, theirs in zip(bounded["out"], free["out"]):  # the same update or scores, summed in more parts
        assert mine == pytest.approx(theirs, abs=1e-5)


def test_work_that_cannot_fit_alone_fails_before_it_starts_and_names_the_setting(cases):
    result = cases["update 0.3"]  # less than the process already holds
    assert "run.memory_gb" in result["error"] and "training on a sample of 176 tokens" in result["error"]
    assert result["unchanged"]  # no step was taken


def test_the_budget_is_the_setting_or_half_the_machine():
    try:
        assert memory.set_budget(2.0) == 2 * 2**30
        assert memory.headroom_bytes() == pytest.approx(2 * 2**30 - memory.rss_bytes(), abs=2**26)
        import psutil

        assert memory.set_budget(None) == psutil.virtual_memory().total / 2
    finally:
        memory._budget[0] = float("inf")  # this process (the suite's) runs unbounded, as before
    assert memory.headroom_bytes() == float("inf")


def test_decoding_takes_the_rows_the_budget_leaves_and_fails_where_none_fits(tiny_model_path, tiny_tokenizer):
    """`rows_at_once`: a row of 4,000 tokens costs its KV twice (a rebuild copies it), its
    admission forward and its logits (models/footprint.py); the budget left for 3.5 such rows
    decodes 3 together, and a budget that leaves less than one fails the call before any
    decoding, naming the setting."""
    from rlanything.models.engines.transformers_engine import TransformersEngine
    from rlanything.models.footprint import forward_bytes, kv_bytes_per_token
    from rlanything.models.loading import load_model

    model = load_model(tiny_model_path)
    engine, config = TransformersEngine(model, tiny_tokenizer, batch_size=64), model.config
    row = 2 * kv_bytes_per_token(config, 4) * 4000 + forward_bytes(config, 1, 4000, 1, False)
    assert engine.row_bytes(4000) == row
    try:
        memory._budget[0] = memory.rss_bytes() + 3.5 * row
        assert engine.rows_at_once(4000) == 3
        memory._budget[0] = memory.rss_bytes() + 0.5 * row
        with pytest.raises(memory.MemoryBudgetError, match=r"decoding one row of 4000 tokens.*run\.memory_gb"):
            engine.rows_at_once(4000)
        with pytest.raises(memory.MemoryBudgetError, match="run.memory_gb"):
            engine.generate([[5] * 3999, [6] * 3999], max_new_tokens=1, temperature=1.0, top_p=1.0, seed=0)
        with pytest.raises(memory.MemoryBudgetError, match="the 3998 tokens every prompt shares.*run.memory_gb"):
            engine.generate([[5] * 3999, [5] * 3999], max_new_tokens=1, temperature=1.0, top_p=1.0, seed=0)
    finally:
        memory._budget[0] = float("inf")


def test_an_update_reserves_the_gradients_and_the_moments_it_has_yet_to_allocate(tiny_model_path):
    """Before a fresh optimizer's first step: gradients (4 bytes a weight) and AdamW's two fp32
    moments (8 more); once stepped, the gradients only, while `zero_grad` has set them to None."""
    import torch

    from rlanything.models.loading import load_model
    from rlanything.models.training.trainer import make_optimizer, pending_bytes

    model = load_model(tiny_model_path)
    weights = sum(p.numel() for p in model.parameters())
    optimizer = make_optimizer(model, lr=1e-3, weight_decay=0.0)
    assert pending_bytes(model, optimizer) == 12 * weights
    model(input_ids=torch.tensor([[5, 6, 7]])).logits.sum().backward()
    assert pending_bytes(model, optimizer) == 8 * weights  # gradients there, moments not yet
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    assert pending_bytes(model, optimizer) == 4 * weights


ESTIMATE = r"""
import contextlib, json, sys, torch
from rlanything import memory
from rlanything.models.training import tree_attention
from rlanything.models.training.packing import pack, packed_response_logprobs
from rlanything.models.training.trainer import Sample, _forward_need, checkpoint_layers
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(vocab_size=4096, hidden_size=128, intermediate_size=512, num_hidden_layers=32,
                     num_attention_heads=4, num_key_value_heads=4)
model = LlamaForCausalLM(config).train()
g = torch.Generator().manual_seed(0)
bf16 = sys.argv[1] == "bf16"
torch.set_num_threads(1)  # the precisions' processes run side by side, a thread each

def micro_batch(training, rows, prompt, response, checkpointed=False, shared=False):
    if checkpointed:
        checkpoint_layers(model)
    else:
        model.activation_checkpointing_disable()
    first = torch.randint(5, 4000, (prompt,), generator=g).tolist()
    seqs = [(first if shared else torch.randint(5, 4000, (prompt,), generator=g).tolist())
            + torch.randint(5, 4000, (response,), generator=g).tolist() for _ in range(rows)]
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
        # the planner's own estimate (the trainer's, as it cuts micro-batches), before the work
        samples = [Sample(seq, response, [0.0] * response, 1.0) for seq in seqs]
        estimate = _forward_need(model, samples, training)(list(range(rows)))
        memory.release()
        before = memory.rss_bytes()
        memory.reset_peak()
        with contextlib.nullcontext() if training else torch.no_grad():
            logprobs, mask = packed_response_logprobs(model, seqs, [response] * rows, 0, 1.0)
        if training:
            (logprobs * mask).sum().backward()
    width = max(len(tree.tokens) for tree in pack(seqs)[0])
    return estimate, memory.peak_gb() - before / 2**30, tree_attention.attends_by_tree(model, width)

micro_batch(True, 1, 8, 8)  # code mapped, gradients allocated: what a later micro-batch finds
# the update's micro-batches (8 or 16 short sequences packed in one row: tree attention); the
# scoring of its old log-probs (one long row: where a KV cache nobody reads, 32 KiB a token here,
# would dwarf the activations); branches of one long prompt (each call gathers the prompt's keys);
# the layers recomputed in the backward (optim.gradient_checkpointing: the mask path)
cases = [(True, (8, 200, 100), {}), (True, (16, 50, 150), {}), (False, (1, 4000, 100), {}),
         (True, (8, 1000, 150), {"shared": True}), (True, (8, 200, 100), {"checkpointed": True}),
         (True, (2, 1000, 100), {"checkpointed": True})]
out = []
for index in map(int, sys.argv[2].split(",")):  # this process's share of the cases
    training, shape, flags = cases[index]
    estimate, measured, tree = micro_batch(training, *shape, **flags)
    out.append({"bf16": bf16, "index": index, "training": training, "shape": shape, "tree": tree,
                "checkpointed": flags.get("checkpointed", False), "estimate": estimate / 2**30, "measured": measured})
print(json.dumps(out))
"""


def test_a_training_micro_batch_is_estimated_from_above_within_the_margin():
    """What the update cuts its micro-batches by (the trainer's `_forward_need`,
    `footprint.forward_bytes`), against what one micro-batch's forward and backward add to the
    process, on a deep narrow model where the kept activations are most of it (32 layers, H 128),
    in fp32 and under bf16 autocast (one process each, side by side), and what the scoring of one
    long row adds: the estimate may fall short by at most half the budget's margin (0.125 GiB),
    and is not wasteful (< 1.5x; < 2x with the layers checkpointed,
    `optim.gradient_checkpointing`). The count before (8H + 4I values a layer kept in fp32) was
    0.65 of today's and fell short by ~0.4 GiB here; the scoring forward, while it built a KV
    cache nobody read, measured 0.28 GiB in fp32 against its 0.10 estimate; rows through tree
    attention were estimated as if they built the (N, N) mask, without the keys each call
    gathers, and fell short by up to 1 GiB on SmolLM2's text-game updates."""
    # bf16 matmuls on a CPU without bf16 units (AVX2) take ~10x fp32's: its cases are split over two
    # processes (measured on a 2-core AVX2 EPYC: fp32's six 33 s, bf16's 38, 56, 15, ... s each)
    shares = (("fp32", "0,1,2,3,4,5"), ("bf16", "0,1,2"), ("bf16", "3,4,5"))
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", ESTIMATE, *share], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for share in shares
    ]
    cases = []
    for run in runs:
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-3000:]
        cases += json.loads(out.strip().splitlines()[-1])
    cases.sort(key=lambda c: (c["bf16"], c["index"]))
    print(*cases, sep="\n")
    assert [c["tree"] for c in cases] == [True, True, True, True, False, False] * 2  # each path is measured
    for case in cases:
        assert case["estimate"] >= case["measured"] - MARGIN_GB / 2, case
        # a checkpointed backward's holding varied most between runs: 0.37-0.60 GiB for one (2, 2000,
        # 100) case, whose bf16 estimate was 0.73 (it cost ~30 s a precision; (2, 1000, 100) ~10 s)
        assert case["estimate"] < (2.0 if case["checkpointed"] else 1.5) * case["measured"], case


def test_a_micro_batch_is_cut_again_from_what_the_process_holds_when_its_turn_comes(tiny_model_path, monkeypatch):
    """The update's plan is made from the memory held at a mini-batch's start; memory held since
    (what a backward freed but the allocator kept) must cut the micro-batches still to come. Here
    ballast touched after the first micro-batch stands for it: the plan made at the start has 4
    samples in its second part, the fitted one fewer, each part fits beside what is held when it
    comes, and every sample comes once, the last part marked last."""
    import torch

    from rlanything.models.loading import load_model
    from rlanything.models.training.trainer import Sample, _forward_need, fitted_micro_batches, micro_batches

    model = load_model(tiny_model_path)
    g = torch.Generator().manual_seed(0)
    samples = [Sample(torch.randint(5, 4000, (120,), generator=g).tolist(), 100, [0.0] * 100, 1.0) for _ in range(8)]
    need = _forward_need(model, samples, True)
    one = need([0])  # ~0.1 GB: the tiny model's logits of 100 kept positions
    memory.release()
    monkeypatch.setattr(memory, "_budget", [memory.rss_bytes() + 4.5 * one])
    order = list(range(8))
    assert [len(p) for p in micro_batches(model, samples, order, 8, True)] == [4, 4]
    seen, ballast = [], None
    for part, last in fitted_micro_batches(model, samples, order, 8, True):
        assert memory.rss_bytes() + need(part) <= memory.budget_bytes()
        seen.append((part, last))
        if ballast is None:
            ballast = torch.ones(int(2 * one) // 4)  # touched: resident
    assert [len(p) for p, _ in seen][:2] == [4, 2]
    assert sorted(i for p, _ in seen for i in p) == order
    assert [last for _, last in seen] == [False] * (len(seen) - 1) + [True]
