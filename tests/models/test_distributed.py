"""The update under accelerate (and DeepSpeed ZeRO-2 on 2 CPU processes) equals the plain one."""

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

from rlanything.config import ConfigError, LoraConfig, build_config
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.loading import load_model
from rlanything.models.prompts import policy_messages, render
from rlanything.models.training.distributed import (
    UpdateJob,
    clear_stale_build_locks,
    launch_update,
    read_job,
    run_update,
    write_job,
)
from rlanything.models.training.trainer import Sample

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def samples(tiny_model_path, tiny_tokenizer):
    model = load_model(tiny_model_path)
    prompts = [render(tiny_tokenizer, policy_messages("sys", [f"Calculate {i} - 1."], []))[1] for i in range(6)]
    gens = TransformersEngine(model, tiny_tokenizer).generate(
        prompts, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=1
    )
    advantages = [1.0, -1.0, 0.5, -0.5, 1.0, -1.0]
    return [Sample(p + g.token_ids, len(g.token_ids), g.logprobs, a) for p, g, a in zip(prompts, gens, advantages)]


def job(start, out, lora=False, **kw):
    args = dict(
        start=str(start),
        out=str(out),
        precision="fp32",
        lora=LoraConfig(enabled=lora, r=4).model_dump(),
        lr=1e-3,
        weight_decay=0.0,
        grad_clip=1.0,
        updates=2,
        micro_batch_size=2,
        temperature=1.0,
        clip_eps=0.2,
        kl_beta=0.01,
        seed=0,
    )
    return UpdateJob(**{**args, **kw})


def assert_same_weights(a: Path, b: Path, atol=1e-5, lr=1e-3, updates=2):
    """Equal up to float rounding: the processes' micro-batches pack their samples into other
    prefix trees (models.training.packing) than one process does, so sums run in another order. Adam
    divides each gradient by its own running scale, so a weight whose gradient is itself at
    rounding level can move by up to lr per update in either run: such weights may differ by up
    to 2 · lr · updates, and only a few may (at most 1 in 1,000, checked). All others agree to
    atol. Seen: up to 2.2e-6 everywhere on an AMD EPYC; one tensor past 1e-5 on the CI's CPU.
    A wrong all-reduce (a half batch per process, a sum instead of a mean) moves most weights."""
    left, right = load_model(a).state_dict(), load_model(b).state_dict()
    assert left.keys() == right.keys()
    off = total = 0
    for name in left:
        diff = (left[name] - right[name]).abs()
        assert diff.max() <= 2 * lr * updates + atol, name
        off += int((diff > atol + 1e-5 * right[name].abs()).sum())
        total += diff.numel()
    assert off <= total / 1000, f"{off} of {total} weights differ by more than {atol}"


def assert_same_history(a: list[dict], b: list[dict]):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x["num_samples"] == y["num_samples"] and x["num_tokens"] == y["num_tokens"]
        for key in ("loss", "pg_loss", "kl", "clip_frac", "grad_norm"):
            assert x[key] == pytest.approx(y[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("lora", [False, True])
def test_accelerate_backend_equals_torch_backend(tiny_model_path, samples, tmp_path, lora):
    plain = run_update(job(tiny_model_path, tmp_path / "torch", lora), samples, backend="torch")
    accel = run_update(job(tiny_model_path, tmp_path / "accelerate", lora), samples, backend="accelerate")
    assert_same_history(plain, accel)
    assert_same_weights(tmp_path / "torch", tmp_path / "accelerate")
    assert (tmp_path / "accelerate" / "optimizer.pt").is_file()  # moments resume as with torch


def test_the_weight_check_fails_on_an_update_from_half_the_batch(tiny_model_path, samples, tmp_path):
    """What a broken all-reduce would give (each process stepping on its own half) is caught."""
    run_update(job(tiny_model_path, tmp_path / "full"), samples, backend="torch")
    run_update(job(tiny_model_path, tmp_path / "half"), samples[::2], backend="torch")
    with pytest.raises(AssertionError, match="differ by more than"):
        assert_same_weights(tmp_path / "full", tmp_path / "half")


def test_job_files_round_trip(tiny_model_path, samples, tmp_path):
    original = job(tiny_model_path, tmp_path / "out", extra={"kind": "policy"})
    again, read = read_job(write_job(original, samples, tmp_path / "jobs" / "policy.json"))
    assert again == original
    assert [(s.input_ids, s.response_len, s.advantage) for s in read] == [
        (s.input_ids, s.response_len, s.advantage) for s in samples
    ]
    assert all(r.old_logprobs == pytest.approx(s.old_logprobs, abs=1e-6) for r, s in zip(read, samples))
    assert all(r.trained is None and not r.replayed for r in read)
    trained = [False] * (samples[0].response_len - 1) + [True]
    marked = [Sample(s.input_ids, s.response_len, s.old_logprobs, s.advantage, trained=trained) for s in samples[:1]]
    marked[0].replayed = True  # a judgment of an earlier iteration (rm.replay_iterations)
    marked[0].unit = 7  # one judged step's two verdicts (algo.rm_verdicts expected)
    marked[0].stratum = -1  # paid towards -1 (algo.rm_stratify)
    again = read_job(write_job(original, marked, tmp_path / "jobs" / "rm.json"))[1][0]
    assert again.trained == trained and again.replayed and again.unit == 7 and again.stratum == -1
    assert all(r.unit is None and r.stratum is None for r in read)


def test_train_config():
    config = build_config({"train": {"backend": "accelerate", "launch": ["accelerate", "launch"]}})
    assert config.train.launch == ["accelerate", "launch"]
    assert build_config({}).train.backend == "torch"
    with pytest.raises(ConfigError, match="launch"):
        build_config({"train": {"launch": ["accelerate", "launch"]}})


def test_a_launch_still_running_after_its_timeout_is_stopped_and_raises(samples, tmp_path):
    started = time.monotonic()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(RuntimeError, match="still running after 1 s, stopped"):
        launch_update(job(tmp_path, tmp_path / "out"), samples, sleeper, tmp_path / "j.json", timeout_s=1)
    assert time.monotonic() - started < 30


def test_only_stale_build_locks_are_removed(tmp_path, monkeypatch):
    """A killed torch extension build leaves `<root>/<name>/lock`, on which every later DeepSpeed
    launch waits forever (CI hung so, on a lock from a stopped run); a young one may be live."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    old, young = tmp_path / "deepspeed_shm_comm" / "lock", tmp_path / "cpu_adam" / "lock"
    for lock in (old, young):
        lock.parent.mkdir()
        lock.touch()
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert clear_stale_build_locks() == [old]
    assert not old.exists() and young.exists()
    assert old.parent.is_dir()


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed (pip install '.[deepspeed]')"
)
def test_deepspeed_zero2_on_two_cpu_processes_equals_torch(tiny_model_path, samples, tmp_path):
    """`accelerate launch` of 2 gloo processes under ZeRO-2: each trains on half of every
    mini-batch; the all-reduced update equals the one-process update, and the ZeRO AdamW state
    saved in the checkpoint resumes in the next update like optimizer.pt does (~1.5 min)."""
    launch = ["accelerate", "launch", "--config_file", str(REPO / "configs/accelerate/cpu_deepspeed_zero2.yaml")]
    plain = run_update(job(tiny_model_path, tmp_path / "t1"), samples, backend="torch")
    # A hang (e.g. a torch extension build lock nobody releases) fails here, not at CI's limit.
    ds = launch_update(job(tiny_model_path, tmp_path / "d1"), samples, launch, tmp_path / "jobs" / "d1.json", 900)
    assert "DEEPSPEED on cpu, process 1/2" in (tmp_path / "jobs" / "d1.json.log").read_text()
    assert_same_history(plain, ds)
    assert_same_weights(tmp_path / "t1", tmp_path / "d1")
    assert (tmp_path / "d1" / "deepspeed_state" / "world_2").exists()
    # Second iteration: each continues from its own checkpoint (optimizer.pt vs ZeRO state).
    plain = run_update(job(tmp_path / "t1", tmp_path / "t2", seed=1), samples, backend="torch")
    ds = launch_update(
        job(tmp_path / "d1", tmp_path / "d2", seed=1), samples, launch, tmp_path / "jobs" / "d2.json", 900
    )
    assert_same_history(plain, ds)
    assert_same_weights(tmp_path / "t2", tmp_path / "d2")


def test_example_configs_load():
    import yaml

    from rlanything.config import load_config

    gpu = load_config(REPO / "configs/gpu/qwen2.5-7b-textworld.yaml")
    assert gpu.policy.engine == "vllm" and gpu.policy.lora.enabled and gpu.train.backend == "accelerate"
    launch_file = Path(gpu.train.launch[gpu.train.launch.index("--config_file") + 1])
    assert (REPO / launch_file).is_file()
    for path in (REPO / "configs/accelerate").glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        assert data["distributed_type"] in ("DEEPSPEED", "MULTI_GPU"), path


def _drift(start: Path, out: Path, samples, pad_id: int) -> float:
    """k3 KL of `out` from `start` on the samples' response tokens: each sample's mean, then
    the mean over samples (the loss's reduction)."""
    import contextlib

    import torch

    from rlanything.algo.losses import k3_kl
    from rlanything.models.training.trainer import teacher_forced_logprobs

    def logprobs(path):
        return teacher_forced_logprobs(load_model(path), samples, pad_id, 1.0, 8, contextlib.nullcontext())

    pairs = zip(logprobs(out), logprobs(start))
    return sum(float(k3_kl(torch.tensor(a), torch.tensor(b), torch.ones(len(a))).mean()) for a, b in pairs) / len(
        samples
    )


def test_the_anchor_kl_holds_the_update_near_the_start(tiny_model_path, tiny_tokenizer, samples, tmp_path):
    """optim.anchor_beta: 4 passes at a large lr drift far from the start without the anchor,
    much less with it; its first step reads the start itself (anchor KL 0)."""
    common = dict(epochs=4, lr=3e-2)
    free = run_update(job(tiny_model_path, tmp_path / "free", **common), samples)
    held = run_update(
        job(tiny_model_path, tmp_path / "held", anchor=str(tiny_model_path), anchor_beta=1.0, **common), samples
    )
    assert all(h["anchor_kl"] is None for h in free)
    assert held[0]["anchor_kl"] == pytest.approx(0.0, abs=1e-6) and held[-1]["anchor_kl"] > 1e-3
    pad = tiny_tokenizer.pad_token_id
    free_drift, held_drift = (_drift(tiny_model_path, tmp_path / n, samples, pad) for n in ("free", "held"))
    assert free_drift > 0.05, free_drift
    assert held_drift < free_drift / 2, (held_drift, free_drift)


def test_with_lora_the_anchor_is_the_adapters_base(tiny_model_path, tiny_tokenizer, samples, tmp_path):
    """An update that starts from a trained adapter measures its first anchor KL against the
    base (the adapter switched off), not against its own start: the drift of that start."""
    run_update(job(tiny_model_path, tmp_path / "first", lora=True, epochs=4), samples)
    second = run_update(
        job(
            tmp_path / "first", tmp_path / "second", lora=True, updates=1, anchor=str(tiny_model_path), anchor_beta=1.0
        ),
        samples,
    )
    drift = _drift(tiny_model_path, tmp_path / "first", samples, tiny_tokenizer.pad_token_id)
    assert drift > 1e-3, drift
    assert second[0]["anchor_kl"] == pytest.approx(drift, rel=1e-3, abs=1e-6)


def _bf16_copy(folder: Path) -> dict:
    import torch

    return {name: w.to(torch.bfloat16) for name, w in load_model(folder).state_dict().items()}


def test_a_start_on_bf16_ties_reaches_a_bf16_sampler_as_its_lr_says(tiny_model_path, tiny_tokenizer, samples, tmp_path):
    """Weights exactly halfway between two bf16 values (8.1% of the builtin SmolLM2's): a bf16
    sampler rounds them to even, and after an update, however small, towards its sign. Placed
    within the sampler's values first (`dither_start_to`, models.precision.dither_to_bf16_), a
    step of lr 1e-6 flips each weight's bf16 copy with probability |step| / ulp: the number of
    flips, away from zero and towards it, is the sum of those, as the lr says (~500 each way,
    1.2% of the weights). Left as ties, the same step flips half of them; rounded onto the bf16
    values (the start before the dithering), it flips none."""
    import torch

    from rlanything.models.precision import bf16_spacings, dither_to_bf16_, round_to_bf16_
    from rlanything.models.training.saving import save_checkpoint

    model = load_model(tiny_model_path)
    with torch.no_grad():
        for w in model.parameters():  # each weight's bf16 truncation plus half a bf16 ulp: a tie
            # at least 0.01: a step of 1e-6 stays far under a bf16 ulp (6e-5 there)
            w.copy_(torch.where(w < 0, -1.0, 1.0) * w.abs().clamp(min=0.01))
            w.view(torch.int32).copy_((w.view(torch.int32) & ~0xFFFF) | 0x8000)
    save_checkpoint(model, tiny_tokenizer, None, tmp_path / "ties")
    round_to_bf16_(model)
    save_checkpoint(model, tiny_tokenizer, None, tmp_path / "rounded")
    sampled = _bf16_copy(tmp_path / "ties")
    for start, name, placing in (("ties", "dithered", "bf16"), ("ties", "as_loaded", None), ("rounded", "grid", None)):
        run_update(job(tmp_path / start, tmp_path / name, lr=1e-6, updates=1, dither_start_to=placing), samples)
    flipped = {
        name: {k: int((a != sampled[k]).sum()) for k, a in _bf16_copy(tmp_path / name).items()}
        for name in ("as_loaded", "grid")
    }
    # the layers' weights all have gradients (most embedding rows are tokens no sample holds)
    layers = [k for k in sampled if ".layers." in k]
    weights = sum(sampled[k].numel() for k in layers)
    assert sum(flipped["grid"].values()) == 0, flipped["grid"]
    assert sum(flipped["as_loaded"][k] for k in layers) > 0.2 * weights
    # dithered: a step flips a weight's copy with probability |step| / the bf16 spacing in the
    # step's direction, read from the same start the update drew; counted apart for steps away
    # from zero and towards it (a draw skewed to one half of the interval fails one of them)
    model = load_model(tmp_path / "ties")
    dither_to_bf16_(model, seed=0)  # the job's seed
    start, after = model.state_dict(), load_model(tmp_path / "dithered").state_dict()
    expected, flips, copy = {True: 0.0, False: 0.0}, {True: 0, False: 0}, _bf16_copy(tmp_path / "dithered")
    for k in layers:
        grid, step = sampled[k].float(), after[k] - start[k]
        below, above = bf16_spacings(grid)
        outward = (step > 0) == (grid > 0)
        moved = copy[k] != sampled[k]
        for way in (True, False):
            mine = outward == way
            expected[way] += float((step.abs() / torch.where(outward, above, below))[mine].sum())
            flips[way] += int(moved[mine].sum())
    for way in (True, False):  # a step far under an ulp, yet seen, as often as it says
        assert 25 < expected[way] < 0.03 * weights, (way, expected, weights)
        assert abs(flips[way] - expected[way]) < 5 * expected[way] ** 0.5, (way, flips, expected)
