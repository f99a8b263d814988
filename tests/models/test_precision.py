"""`precision: auto | fp32 | bf16`: how auto resolves, that a run keeps its choice, the old
`dtype` key, and what the trainer does with a sampler in another precision."""

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_distributed import job as update_job  # the distributed tests' UpdateJob

from rlanything.algo.mismatch import mismatch_measures
from rlanything.config import ConfigError, build_config
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.loading import load_model
from rlanything.models.precision import (
    FLAGS_ENV,
    PRECISION_FILE,
    bf16_matmul_speedup,
    cpu_flags,
    precision_of,
    recompute_old_logprobs,
    resolve,
    run_precision,
)
from rlanything.models.training.distributed import run_update
from rlanything.models.training.trainer import Sample, make_optimizer, ppo_update, with_trainer_logprobs


@pytest.mark.parametrize(
    ("flags", "expected"),
    [("avx2 avx512f avx512_bf16", "bf16"), ("avx2 amx_tile amx_bf16", "bf16"), ("avx2 avx512f", "fp32"), ("", "fp32")],
)
def test_auto_picks_bf16_only_where_the_cpu_has_bf16_units(monkeypatch, flags, expected):
    monkeypatch.setenv(FLAGS_ENV, flags)
    assert cpu_flags() == set(flags.split())
    choice = resolve("auto", "cpu", speedup=lambda: 2.0)  # bf16 units that pay: the flags decide
    assert choice.precision == expected and choice.reason.startswith("auto: the CPU has")
    # units that do not pay (a hypervisor hiding AMX): fp32 whatever the flags say
    slow = resolve("auto", "cpu", speedup=lambda: 1.1)
    assert slow.precision == "fp32" and ("below 1.2x" in slow.reason or "no bf16 units" in slow.reason)
    # an explicit setting is never second-guessed
    assert resolve("fp32", "cpu").precision == "fp32" and resolve("bf16", "cpu").precision == "bf16"


def test_the_speedup_is_timed_here():
    ratio = bf16_matmul_speedup(rows=32, k=64, n=64, repeats=2)
    assert 0 < ratio < 1000  # emulated bf16 (no units) is slower than fp32, never 0 or infinite


def test_without_the_variable_the_flags_are_this_machines(monkeypatch):
    monkeypatch.delenv(FLAGS_ENV)
    with open("/proc/cpuinfo") as info:
        line = next(line for line in info if line.startswith("flags"))
    assert cpu_flags() == set(line.split(":", 1)[1].split())


def test_a_run_keeps_the_choice_it_started_with(monkeypatch, tmp_path):
    config = build_config({"policy": {"device": "cpu"}, "rm": {"device": "cpu"}})  # every precision auto
    monkeypatch.setenv(FLAGS_ENV, "avx512_bf16")  # the speed-up is timed for real: either outcome
    first = run_precision(config, tmp_path)
    chosen = {c.precision for uses in first.values() for c in uses.values()}
    assert len(chosen) == 1  # one timing decides every section alike
    saved = json.loads((tmp_path / PRECISION_FILE).read_text())
    assert saved["policy"]["update"]["reason"].startswith("auto: the CPU has avx512_bf16")
    assert saved["policy"]["update"]["precision"] == first["policy"]["update"].precision
    monkeypatch.setenv(FLAGS_ENV, "avx2")  # resumed on a machine without bf16 units
    assert run_precision(config, tmp_path) == first
    assert precision_of(config, "rm", "update", tmp_path) == first["rm"]["update"].precision
    assert precision_of(config, "rm", "update", None) == "fp32"  # outside the run: resolved here
    assert not (tmp_path / "elsewhere").exists()


def test_an_update_whose_accelerate_config_runs_another_precision_is_refused(tiny_model_path, tmp_path):
    job = update_job(tiny_model_path, tmp_path / "out", precision="bf16")  # the Accelerator: "no"
    with pytest.raises(ValueError, match="precision is bf16.*mixed_precision 'no'"):
        run_update(job, [], backend="accelerate")
    assert not (tmp_path / "out").exists()


def _train(launch_config: str | None = None, launch: bool = True) -> dict:
    command = ["accelerate", "launch"] + (["--config_file", launch_config] if launch_config else [])
    return {"train": {"backend": "accelerate", "launch": command if launch else []}}


def test_under_accelerate_auto_follows_its_config_and_a_contradiction_is_refused_at_the_start(monkeypatch, tmp_path):
    """On a CPU where `auto` alone picks bf16, an update under the shipped 2-process DeepSpeed
    config (mixed_precision 'no') resolves fp32 when the run starts, instead of failing at its
    first update; a config saying bf16 is followed; an explicit contradiction is a ConfigError
    naming the file; the in-process Accelerator's precision comes from its environment variable."""
    monkeypatch.setenv(FLAGS_ENV, "avx512_bf16")
    monkeypatch.setattr("rlanything.models.precision.bf16_matmul_speedup", lambda: 2.0)  # units that pay
    shipped = "configs/accelerate/cpu_deepspeed_zero2.yaml"
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # launch paths are the shell's, as accelerate reads them
    assert precision_of(build_config({}), "policy", "update") == "bf16"  # backend torch
    chosen = run_precision(build_config(_train(shipped)), tmp_path)
    for name in ("policy", "rm"):
        assert chosen[name]["update"].precision == "fp32"
        assert chosen[name]["update"].reason == f"auto: the accelerate config ({shipped}) runs mixed_precision 'no'"
        assert chosen[name]["generation"].precision == "bf16"  # generation is not accelerate's
    bf16_file = tmp_path / "bf16.yaml"
    bf16_file.write_text("distributed_type: DEEPSPEED\nmixed_precision: bf16\n")
    assert precision_of(build_config(_train(str(bf16_file))), "rm", "update") == "bf16"
    contradiction = build_config(_train(shipped) | {"policy": {"optim": {"precision": "bf16"}}})
    with pytest.raises(ConfigError, match=f"optim.precision is bf16 but the accelerate config \\({shipped}\\)"):
        precision_of(contradiction, "policy", "update")
    with pytest.raises(ConfigError, match="cannot be read"):
        precision_of(build_config(_train(str(tmp_path / "missing.yaml"))), "policy", "update")
    # launched without --config_file: accelerate's own default decides, unknown here
    assert precision_of(build_config(_train()), "policy", "update") == "bf16"
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    assert precision_of(build_config(_train(launch=False)), "policy", "update") == "fp32"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert precision_of(build_config(_train(launch=False)), "policy", "update") == "bf16"


def test_the_old_dtype_key_reads_as_both_precisions_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        config = build_config({"policy": {"dtype": "bfloat16"}, "rm": {"dtype": "float32"}})
    assert (config.policy.precision, config.policy.optim.precision) == ("bf16", "bf16")
    assert (config.rm.precision, config.rm.optim.precision) == ("fp32", "fp32")
    assert config.env_model.precision == "bf16"  # follows the policy
    assert "policy.dtype -> policy.precision" in caplog.text and "rm.dtype -> rm.optim.precision" in caplog.text


def test_old_logprobs_are_recomputed_unless_both_sides_are_fp32():
    assert not recompute_old_logprobs("auto", "fp32", "fp32")
    assert recompute_old_logprobs("auto", "bf16", "fp32") and recompute_old_logprobs("auto", "fp32", "bf16")
    assert recompute_old_logprobs("trainer", "fp32", "fp32") and not recompute_old_logprobs("sampler", "bf16", "bf16")


def _samples(model_path, tokenizer, dtype: str, n: int = 4) -> list[Sample]:
    """`n` replies sampled by the engine in `dtype`, with the log-probs it recorded."""
    engine = TransformersEngine(load_model(model_path, dtype), tokenizer, batch_size=8)
    prompts = [tokenizer.encode(f"question {i}:") for i in range(n)]
    gens = engine.generate(prompts, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=3)
    return [
        Sample(p + g.token_ids, len(g.token_ids), g.logprobs, 1.0 - 0.5 * i)
        for i, (p, g) in enumerate(zip(prompts, gens))
    ]


def _update(model_path, tokenizer, samples, **kw):
    model = load_model(model_path, "float32")
    optimizer = make_optimizer(model, 1e-3, 0.0)
    args = dict(pad_id=tokenizer.pad_token_id, temperature=1.0, clip_eps=0.2, kl_beta=0.01, grad_clip=1.0)
    return ppo_update(model, optimizer, samples, updates=2, micro_batch_size=2, seed=0, **args, **kw), model


def test_recomputed_old_logprobs_match_an_fp32_sampler_and_differ_from_a_bf16_one(tiny_model_path, tiny_tokenizer):
    model = load_model(tiny_model_path, "float32")
    for dtype, low, high in (("float32", 0.0, 1e-5), ("bfloat16", 5e-4, 10.0)):
        samples = _samples(tiny_model_path, tiny_tokenizer, dtype)
        redone = with_trainer_logprobs(
            model, samples, tiny_tokenizer.pad_token_id, 1.0, 2, torch.autocast("cpu", enabled=False)
        )
        gaps = [abs(a - b) for s, r in zip(samples, redone) for a, b in zip(s.old_logprobs, r.old_logprobs)]
        assert low <= max(gaps) <= high, (dtype, max(gaps))
        assert [r.sampler_logprobs for r in redone] == [s.old_logprobs for s in samples]  # the sampler's kept
        assert [r.input_ids for r in redone] == [s.input_ids for s in samples]  # same samples, same order


def test_a_bf16_sampler_leaves_a_first_step_ratio_off_one_unless_the_trainer_recomputes(
    tiny_model_path, tiny_tokenizer
):
    """At the first optimizer step the weights are the sampler's: against the trainer's own
    log-probs every ratio is exactly 1 (kl 0, pg_loss = -mean advantage of the step's samples);
    against a bf16 sampler's they are not. (The tiny random model is near uniform, so its bf16
    gap is small: ~5e-4 nats a token; SmolLM2's is ~0.05, docs/benchmarks.md.)"""
    samples = _samples(tiny_model_path, tiny_tokenizer, "bfloat16")
    plain, _ = _update(tiny_model_path, tiny_tokenizer, samples)
    redone, _ = _update(tiny_model_path, tiny_tokenizer, samples, recompute_old=True)
    # mini-batches of 2 from 4 samples with advantages 1, .5, 0, -.5: the first step's mean is
    # one of the pairs'; exact ratios make pg_loss exactly minus that mean
    pair_means = {-(a + b) / 2 for a in (1.0, 0.5, 0.0, -0.5) for b in (1.0, 0.5, 0.0, -0.5) if a != b}
    assert redone[0]["kl"] == 0.0 and redone[0]["pg_loss"] in pair_means
    assert plain[0]["kl"] > 0.0 and plain[0]["pg_loss"] not in pair_means
    assert plain[0]["mismatch_abs_mean"] is None
    assert redone[0]["mismatch_abs_mean"] > 1e-4 and redone[0]["mismatch_abs_max"] >= redone[0]["mismatch_abs_mean"]
    # a bf16 update recomputing its own: its first ratios are 1 to bf16's rounding, not the sampler's gap
    bf16, _ = _update(tiny_model_path, tiny_tokenizer, samples, recompute_old=True, precision="bf16")
    assert bf16[0]["kl"] < 1e-6 and abs(bf16[0]["pg_loss"] - redone[0]["pg_loss"]) < 1e-3
    assert 0.0 <= redone[0]["mismatch_outside_cap"] <= 1.0


def test_truncated_importance_sampling_changes_the_update_only_where_it_is_on(tiny_model_path, tiny_tokenizer):
    samples = _samples(tiny_model_path, tiny_tokenizer, "bfloat16")
    _, off = _update(tiny_model_path, tiny_tokenizer, samples, recompute_old=True)
    _, wide = _update(tiny_model_path, tiny_tokenizer, samples, recompute_old=True, tis_cap=1e6)
    _, tight = _update(tiny_model_path, tiny_tokenizer, samples, recompute_old=True, tis_cap=1.0001)
    weights = lambda m: torch.cat([p.detach().flatten() for p in m.parameters()])  # noqa: E731
    assert not torch.equal(weights(off), weights(wide))  # the weights exp(trainer - sampler) act
    assert not torch.equal(weights(wide), weights(tight))  # and the cap bites


def test_a_bf16_update_keeps_fp32_weights_and_trains(tiny_model_path, tiny_tokenizer):
    samples = _samples(tiny_model_path, tiny_tokenizer, "float32")
    fp32, a = _update(tiny_model_path, tiny_tokenizer, samples)
    bf16, b = _update(tiny_model_path, tiny_tokenizer, samples, precision="bf16")
    assert {p.dtype for p in b.parameters()} == {torch.float32}
    start = load_model(tiny_model_path, "float32")
    moved = lambda m: sum(float((p - q).detach().abs().sum()) for p, q in zip(m.parameters(), start.parameters()))  # noqa: E731
    assert moved(b) > 0.5 * moved(a) > 0  # both moved the weights, by a like amount
    # the forward really ran in bf16: against the fp32 sampler's log-probs its first ratio is off 1
    assert fp32[0]["kl"] == 0.0 and bf16[0]["kl"] > 0.0


def test_truncated_importance_sampling_needs_the_trainers_logprobs():
    assert build_config({"algo": {"tis_cap": 2.0}}).algo.tis_cap == 2.0  # auto: trainer where it matters
    with pytest.raises(ConfigError, match="tis_cap .* needs old_logprobs trainer or auto"):
        build_config({"algo": {"tis_cap": 2.0, "old_logprobs": "sampler"}})
    with pytest.raises(ConfigError, match="tis_cap"):
        build_config({"algo": {"tis_cap": 1.0}})  # a cap of 1 would zero every update above the sampler


def test_only_an_update_from_the_runs_first_weights_rounds_them_to_a_bf16_sampler(tmp_path):
    """`dither_start_to` (models.precision.dither_to_bf16_): the policy sampled in bf16 starts
    within its weights as sampled in iteration 0 only (later starts are the trainer's own fp32
    checkpoints, whose sub-ulp progress a new draw would erase); the fp32-sampled RM never."""
    from rlanything.agent.update_data import update_job
    from rlanything.storage.layout import RunLayout

    config = build_config(
        {"policy": {"device": "cpu", "precision": "bf16"}, "rm": {"device": "cpu", "precision": "fp32"}}
    )
    layout = RunLayout(tmp_path)
    rounding = {
        (kind, iteration): update_job(config, layout, iteration, kind, getattr(config, kind), 0).dither_start_to
        for kind in ("policy", "rm")
        for iteration in (0, 1)
    }
    assert rounding == {("policy", 0): "bf16", ("policy", 1): None, ("rm", 0): None, ("rm", 1): None}


def test_a_replayed_sample_starts_its_ratio_at_one_and_stays_out_of_the_gap(tiny_model_path, tiny_tokenizer):
    """rm.replay_iterations: a judgment an older RM drew carries that RM's log-probs, here 1 nat
    off. Recomputed, its first ratio is exactly 1 like the others', and the sampler/trainer gap
    is measured on the freshly drawn samples alone; counted in, the stale log-probs would read
    as a ~1-nat gap."""
    samples = _samples(tiny_model_path, tiny_tokenizer, "bfloat16")
    old = [replace(s, old_logprobs=[lp - 1.0 for lp in s.old_logprobs], replayed=True) for s in samples[2:]]
    mixed = samples[:2] + old
    model = load_model(tiny_model_path, "float32")
    redone = with_trainer_logprobs(
        model, mixed, tiny_tokenizer.pad_token_id, 1.0, 2, torch.autocast("cpu", enabled=False)
    )
    assert [r.sampler_logprobs is None for r in redone] == [False, False, True, True]
    fresh = with_trainer_logprobs(
        model, samples, tiny_tokenizer.pad_token_id, 1.0, 2, torch.autocast("cpu", enabled=False)
    )
    assert [r.old_logprobs for r in redone] == [f.old_logprobs for f in fresh]  # the stale ones replaced
    history, _ = _update(tiny_model_path, tiny_tokenizer, mixed, recompute_old=True)
    assert history[0]["kl"] == 0.0  # every first ratio 1, the replayed ones' too
    gaps = [mismatch_measures(r.old_logprobs, s.old_logprobs)["abs_mean"] for r, s in zip(fresh[:2], samples[:2])]
    steps = [h["mismatch_abs_mean"] for h in history if h["mismatch_abs_mean"] is not None]
    assert steps and max(steps) < 0.01 and max(gaps) < 0.01  # bf16's rounding, not the 1-nat drift
    counted = _update(tiny_model_path, tiny_tokenizer, [replace(s, replayed=False) for s in mixed], recompute_old=True)
    assert max(h["mismatch_abs_max"] for h in counted[0]) > 0.9  # what leaving them in would report


def test_replay_needs_recomputed_logprobs_and_a_judge():
    assert build_config({"rm": {"replay_iterations": 2}}).rm.replay_iterations == 2
    for bad, match in (
        ({"algo": {"old_logprobs": "sampler"}}, "replay_iterations .* algo.old_logprobs auto or trainer"),
        ({"algo": {"tis_cap": 2.0}}, "replay_iterations .* algo.tis_cap null"),
        ({"env": {"kind": "coding"}, "rm": {"role": "unit_tests"}}, "replay_iterations replays judgments"),
    ):
        with pytest.raises(ConfigError, match=match):
            build_config({**bad, "rm": {"replay_iterations": 1, **bad.get("rm", {})}})
