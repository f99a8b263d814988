"""The environment model of task adaptation is built from its own section (`env_model`) by
`make_engine`, like the policy and the RM: its precision, batch size, engine and device, not the
policy's (it used to load on the CPU with the policy's dtype and batch size)."""

import pytest
import torch

from rlanything.agent.adapt_tasks import environment_model as env_model_rewriter
from rlanything.config import build_config
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.loading import resolve_device

POLICY = {"model": "builtin:tiny-random", "precision": "fp32", "batch_size": 32}


def test_env_model_engine_takes_its_own_section():
    config = build_config(
        {
            "policy": POLICY,
            "env_model": {
                "precision": "bf16",
                "batch_size": 3,
                "device": "cpu",
                "max_new_tokens": 12,
                "temperature": 0.5,
            },
        }
    )
    rewriter = env_model_rewriter(
        config, config.env_model.precision
    )  # what adapt_tasks calls (through adapt_tasks.rewrite)
    engine = rewriter.engine
    assert isinstance(engine, TransformersEngine)
    assert engine.model.dtype == torch.bfloat16 and engine.batch_size == 3
    assert next(engine.model.parameters()).device == torch.device("cpu")
    assert rewriter.kw == {"max_new_tokens": 12, "temperature": 0.5, "top_p": 1.0}
    texts = rewriter.propose(
        [{"task": "1 + 1", "instructions": "Make it harder.", "direction": "harder", "critic_summary": "none"}],
        2,
        seed=0,
    )
    assert len(texts) == 1 and len(texts[0]) == 2  # it generates, in bfloat16, on the CPU


def test_env_model_left_out_follows_the_policy():
    config = build_config({"policy": {**POLICY, "precision": "bf16", "batch_size": 5, "device": "cpu"}})
    engine = env_model_rewriter(config, config.env_model.precision).engine
    assert engine.model.dtype == torch.bfloat16 and engine.batch_size == 5


def test_devices_that_do_not_exist_are_refused():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match=r"'cuda:64'.*CUDA GPU\(s\)"):
        resolve_device("cuda:64")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_env_model_goes_to_the_configured_gpu():
    last = f"cuda:{torch.cuda.device_count() - 1}"
    config = build_config({"policy": {**POLICY, "device": "cpu"}, "env_model": {"device": last}})
    engine = env_model_rewriter(config, config.env_model.precision).engine
    assert next(engine.model.parameters()).device == torch.device(last)
    texts = env_model_rewriter(config, config.env_model.precision).propose(
        [{"task": "1 + 1", "instructions": "Harder.", "direction": "harder", "critic_summary": "none"}], 1, seed=0
    )
    assert len(texts[0]) == 1
