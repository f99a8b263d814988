r"""Free verdict mode end to end: the RM writes its own \boxed{±1}, and sometimes none.

A random-init RM almost never boxes a verdict, so the module's RM is the tiny-random model
(`builtin:tiny-random?seed=1`'s architecture, tokenizer and start weights) taught in a few
seconds of plain torch to answer any judge prompt with one of VERDICTS, about equally often:
its attention output projections are zeroed first, which makes every next-token distribution
depend on the current token alone, so training on the assistant header (whatever precedes it)
carries over to every real judge prompt of the run. Its generations are then sampled by the
real engine in a real Prefect flow; nothing is mocked.
"""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from rlanything.storage import schemas
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import read_table

REPO = Path(__file__).resolve().parents[2]
M = 4  # judgments per step
LAM = 1.0  # algo.lam (the default; tiny.yaml leaves it)
# what the RM learns to write: a positive and a negative verdict, a box that is no verdict,
# and no box at all
VERDICTS = ["\\boxed{1}", "\\boxed{-1}", "\\boxed{2}", "hmm"]


@pytest.fixture(scope="module")
def free_rm(tmp_path_factory) -> Path:
    """A local HF model folder whose model answers every judge prompt with one of VERDICTS."""
    from transformers import AutoModelForCausalLM

    from rlanything.models.loading import load_tokenizer, tiny_model_dir
    from rlanything.models.prompts import judge_messages, render

    base = tiny_model_dir(seed=1)  # what builtin:tiny-random?seed=1 resolves to
    tokenizer = load_tokenizer(base)
    header = render(tokenizer, judge_messages("task", [], "response", "observation"))[1][-3:]
    assert tokenizer.convert_ids_to_tokens(header) == ["ass", "istant", "Ċ"]  # "assistant\n" opens the reply
    seqs = [header + tokenizer.encode(v, add_special_tokens=False) + [tokenizer.eos_token_id] for v in VERDICTS]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    labels = torch.full_like(ids, -100)  # the loss covers the reply and its EOS, not the header
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq)
        labels[row, len(header) : len(seq)] = torch.tensor(seq[len(header) :])
    targets = labels[:, 1:] != -100

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True, dtype=torch.float32)
        for layer in model.model.layers:  # no attention: the next token depends on the current one only
            layer.self_attn.o_proj.weight.data.zero_()
            layer.self_attn.o_proj.weight.requires_grad_(False)
        optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        model.train()
        for _ in range(60):
            hidden = model.model(input_ids=ids).last_hidden_state
            logits = model.lm_head(hidden[:, :-1][targets])
            loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:][targets])
            optim.zero_grad()
            loss.backward()
            optim.step()
    # the best mean loss: the first token is "\\" 3 times in 4 (else "h"), the one after "{" is
    # 1, - or 2 a third of the time each, every other token is certain
    best = (3 * math.log(4 / 3) + math.log(4) + 3 * math.log(3)) / int(targets.sum())
    assert loss.item() < best + 0.02, f"the RM did not learn its replies (loss {loss.item():.3f}, best {best:.3f})"
    out = tmp_path_factory.mktemp("free-rm")
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def _verdict(text: str) -> int | None:
    r"""The reply's verdict read by hand: the last top-level \boxed{...} must hold 1, +1 or -1,
    and no other box may hold the opposite verdict."""
    boxes, pos = [], 0
    while (start := text.find("\\boxed{", pos)) >= 0:
        depth, i = 1, start + len("\\boxed{")
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:
            return None  # the last box never closes
        boxes.append(text[start + len("\\boxed{") : i - 1].strip())
        pos = i
    values = {"1": 1, "+1": 1, "-1": -1}
    if not boxes or boxes[-1] not in values or len({values[b] for b in boxes if b in values}) > 1:
        return None
    return values[boxes[-1]]


def test_unparseable_free_verdicts_score_zero_cost_minus_two_and_train_the_rm(
    prefect_server, tmp_path, small_overrides, free_rm
):
    from rlanything.flows.training import train_flow

    overrides = [
        f"run.root={tmp_path}",
        "run.name=free",
        *small_overrides,
        f"rm.model={free_rm}",
        "rm.verdict=free",
        f"rm.judgments_per_step={M}",
        "rm.max_new_tokens=12",
    ]
    result = train_flow(str(REPO / "configs" / "tiny.yaml"), overrides, 1)
    layout = RunLayout(Path(result["run_dir"]))
    outcomes = read_table(layout.artifact(0, "outcomes"), schemas.OUTCOMES)
    judgments = read_table(layout.artifact(0, "judgments"), schemas.JUDGMENTS)
    adv = read_table(layout.artifact(0, "advantages"), schemas.ADVANTAGES)
    summary = json.loads((layout.iter_dir(0) / "summary.json").read_text())

    # the judgments: m of every step, our RM's free replies, each parsed as its last box says
    steps = read_table(layout.artifact(0, "rollouts"), schemas.ROLLOUTS)
    judged = judgments.groupby(["traj_id", "step_idx"]).judge_idx.apply(sorted)
    assert len(steps) > 0 and set(judged.index) == set(zip(steps.traj_id, steps.step_idx))
    assert all(idx == list(range(M)) for idx in judged)
    assert (judgments.verdict_mode == "free").all()
    assert (judgments.weights == str(free_rm.resolve())).all()
    assert set(judgments.reasoning) <= set(VERDICTS)  # the replies it was taught, cut at EOS
    for row in judgments.itertuples(index=False):
        assert row.parsed == (_verdict(row.reasoning) is not None), row.reasoning
        if row.parsed:
            assert row.step_score == _verdict(row.reasoning) and row.raw_box.strip() == str(row.step_score)
        else:
            assert row.step_score == 0 and (pd.isna(row.raw_box) or row.raw_box.strip() not in ("1", "+1", "-1"))
    parsed, unparsed = judgments[judgments.parsed], judgments[~judgments.parsed]
    # the iteration holds both verdicts and both kinds of unparseable reply (no box; a box not ±1)
    assert set(parsed.step_score) == {1, -1}
    assert unparsed.raw_box.isna().any() and unparsed.raw_box.notna().any()

    # policy reward R = O + λ · (sum of the m scores) / m, an unparseable one counting as 0 in m
    outcome = dict(zip(outcomes.traj_id, outcomes.outcome))
    policy = adv[adv.kind == "policy"].set_index(["traj_id", "step_idx"])
    assert summary["rm_guard/lam"] == LAM
    expected_r = {}
    for (traj_id, step_idx), rows in judgments.groupby(["traj_id", "step_idx"]):
        total = 0
        for row in rows.itertuples(index=False):
            total += row.step_score if row.parsed else 0
        expected_r[traj_id, step_idx] = outcome[traj_id] + LAM * total / M
        assert policy.reward[traj_id, step_idx] == pytest.approx(expected_r[traj_id, step_idx], abs=1e-6)
    assert len(policy) == len(expected_r)

    # RM reward: R·S for a parsed judgment, exactly −2 for an unparseable one
    rm = adv[adv.kind == "rm"].merge(
        judgments[["traj_id", "step_idx", "judge_idx", "parsed", "step_score", "response_ids"]],
        on=["traj_id", "step_idx", "judge_idx"],
        how="inner",
        validate="one_to_one",
    )
    assert len(rm) == len(judgments)
    for row in rm.itertuples(index=False):
        if row.parsed:
            r = policy.reward[row.traj_id, row.step_idx]
            assert row.reward == pytest.approx(r * row.step_score, abs=1e-6)
        else:
            assert row.reward == -2.0

    # the RM update trained on unparseable judgments too
    kept = rm[rm.kept]
    assert (~kept.parsed).any() and kept.parsed.any()
    update = read_table(layout.artifact(0, "rm_update"), schemas.UPDATE)
    assert update.num_samples.sum() == len(kept) == summary["samples/rm_kept"]
    assert update.num_tokens.sum() == kept.response_ids.map(len).sum()  # the replies' tokens, EOS included
    start = load_file(free_rm / "model.safetensors")
    trained = load_file(layout.checkpoint("rm", 0) / "model.safetensors")
    assert start.keys() == trained.keys()
    assert any(not torch.equal(start[k], trained[k]) for k in start)

    # the parse rate the iteration reports
    rate = len(parsed) / len(judgments)
    assert 0 < rate < 1
    assert summary["rm/parse_rate"] == pytest.approx(rate) == result["last_metrics"]["rm/parse_rate"]
