"""The engine a model section names: `make_engine` builds a `TransformersEngine`
(models/engines/transformers_engine.py) or a `VllmEngine` (models/engines/vllm_engine.py), both `GenerationEngine`s
(models/engines/generation.py). Kept apart from both engines so that neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable

from rlanything.models.engines.generation import eos_ids_of
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.engines.vllm_engine import VllmEngine, shared_server
from rlanything.models.loading import load_model, load_tokenizer
from rlanything.models.precision import TORCH_DTYPE_NAME


def make_engine(
    section, role: str, model_dir, precision: str, on_batch: Callable[[int], None] | None = None, log_path=None
):
    """The engine a model section (policy, rm, env_model: engine, device, batch_size,
    kv_reuse_gb, vllm) names, serving the weights in `model_dir` in `precision` (fp32 or bf16:
    the section's resolved one, `models.precision`) -> (engine, tokenizer). `role` keys the
    process-wide vLLM server ("policy", "rm", "env")."""
    dtype = TORCH_DTYPE_NAME[precision]
    tokenizer = load_tokenizer(model_dir)
    if section.engine == "transformers":
        model = load_model(model_dir, dtype, section.device)
        engine = TransformersEngine(
            model,
            tokenizer,
            section.batch_size,
            on_batch,
            weights=str(model_dir),
            keep_bytes=section.kv_reuse_gb * 2**30,  # at most a quarter of run.memory_gb: the engine's rule
        )
        return engine, tokenizer
    server = shared_server(role, section.vllm, model_dir, dtype, log_path)
    engine = VllmEngine(server, tokenizer, eos_ids_of(model_dir, tokenizer), section.vllm.concurrency, on_batch)
    return engine, tokenizer
