"""A stop request (`rlanything.stopping`) ends generation within one decoding step and training
after the micro-batch in progress, before any checkpoint is written; the progress callback the
steps pass down is the check."""

from __future__ import annotations

import signal

import pytest
from test_distributed import job, samples  # noqa: F401  (samples: the fixture)

from rlanything import stopping
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.loading import load_model
from rlanything.models.prompts import policy_messages, render
from rlanything.models.training.distributed import run_update
from rlanything.progress import progress


@pytest.fixture(autouse=True)
def no_stop_left():
    stopping.reset()
    yield
    stopping.reset()


def test_a_progress_advance_is_a_stop_check():
    with progress("work", 3) as advance:
        advance(1)  # no stop asked: nothing happens
        assert stopping.request(signal.SIGTERM) and not stopping.request(signal.SIGINT)  # the first one counts
        with pytest.raises(stopping.Stopped) as stopped:
            advance(1)
    assert stopped.value.signum == signal.SIGTERM and stopping.exit_code(stopped.value.signum) == 143
    assert stopping.exit_code(signal.SIGINT) == 130


def test_generation_stops_within_one_decoding_step(tiny_model_path, tiny_tokenizer):
    model = load_model(tiny_model_path)
    engine = TransformersEngine(model, tiny_tokenizer, batch_size=4)
    prompts = [render(tiny_tokenizer, policy_messages("sys", [f"Calculate {i} + 2."], []))[1] for i in range(4)]
    forwards = []

    def count(module, args, kwargs):
        forwards.append(1)
        if len(forwards) == 3:  # the prefill and two decoding steps in: Ctrl-C
            stopping.request(signal.SIGINT)

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        with pytest.raises(stopping.Stopped):
            engine.generate(prompts, max_new_tokens=64, temperature=1.0, top_p=1.0, seed=0)
    finally:
        hook.remove()
    assert len(forwards) == 3  # not 64: the step that saw the request was the last
    stopping.reset()
    assert len(engine.generate(prompts, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=0)) == 4  # usable again


def test_training_stops_after_the_micro_batch_in_progress_and_writes_no_checkpoint(
    tiny_model_path,
    samples,  # noqa: F811
    tmp_path,
):
    done = []

    def on_micro_batch(n: int) -> None:
        done.append(n)
        if len(done) == 1:
            stopping.request(signal.SIGINT)
        stopping.check()  # what the update step's progress callback does

    with pytest.raises(stopping.Stopped):
        run_update(job(tiny_model_path, tmp_path / "out", updates=3), samples, "torch", on_micro_batch=on_micro_batch)
    assert done == [2]  # one micro-batch of 2 of the 6 samples, then the stop
    assert list(tmp_path.iterdir()) == []  # no checkpoint, not even a temporary folder
