"""Dedicated CPU inference engines for `rollout_engine.py --rollouts`, on the same prompt ids, max new
tokens and temperature as `plain` (top-p 1, no top-k), each timed like it (setup not counted).

  ct2        CTranslate2 `Generator` on the HF folder converted with quantization float32 (compute
             type float32); prompts fed as token strings, `generate_batch(max_batch_size=batch)`
             (it sorts the prompts by length and cuts them into batches), `set_random_seed(seed)`.
  ct2-int8   the same converted with quantization int8 (compute type int8_float32): int8 weights
             and matmuls, NOT the fp32 of the other rows.
  openvino   OpenVINO GenAI `ContinuousBatchingPipeline` (continuous batching: every prompt queued
             at once, at most `batch` sequences running, a finished one replaced by a waiting one)
             on an fp32 OpenVINO IR, compiled with f32 inference precision, an f32 KV cache and no
             dynamic quantization; a distinct `rng_seed` per request, log-probs recorded (at T=1).
             The IR comes from `optimum-cli export openvino --weight-format fp32`, run with the
             python named by RLANYTHING_OPTIMUM_PYTHON (a venv of its own: optimum-intel needs an
             older transformers than ours), or is given as --openvino-ir DIR. Without either the
             row is skipped: the GGUF shipped with the model is 4-bit, not the same precision.
             That venv: `python -m venv V && V/bin/pip install torch==2.13.0 openvino==2026.4.1
             openvino-tokenizers==2026.4.1.0 optimum-intel && V/bin/pip uninstall -y torchvision`
             (the torchvision it pulls breaks `import transformers` with this torch).
             `OpenVino(..., precision="default")` (decode_step.py's `openvino` column, not a
             rollout row): the same IR compiled with none of those three forced, i.e. at
             OpenVINO's own CPU defaults (`default_precision()`: bf16 inference on a CPU with
             bf16 units, a u8 KV cache).

Checked by hand on SmolLM2-135M: `ct2` (float32) decodes greedily the same tokens as HF fp32
(4 of 4 prompts), `ct2-int8` does not (0 of 4); OpenVINO's log-probs match HF fp32's teacher-forced
ones at temperature 1 within 2e-4, i.e. they are NOT at temperature T (nor are CTranslate2's, so
none are taken from it: `ct2` rows record no log-probs, like `plain`). `effective` is against the
fp32 ceiling, so `ct2-int8` can pass 100%. Conversions and exports are timed and printed. A missing
package prints how to install it (the `cpu-engines` extra) and the run goes on.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from rlanything.models.engines.generation import finish
from rlanything.models.footprint import kv_bytes_per_token

INSTALL = {"ctranslate2": "pip install ctranslate2", "openvino_genai": "pip install openvino-genai"}
OV_PROPERTIES = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}


def installed(module: str) -> bool:
    """Whether `module` imports; if not, says how to install it."""
    if importlib.util.find_spec(module) is not None:
        return True
    print(f"   {module} not installed: {INSTALL[module]}")
    return False


def setup(label: str, fn):
    """fn(), its wall time printed (a conversion or an export: not counted in the rows)."""
    start = time.perf_counter()
    out = fn()
    print(f"   {label}: {time.perf_counter() - start:.1f} s (not counted)", flush=True)
    return out


class CT2:
    """CTranslate2's Generator on a converted copy of the model folder."""

    def __init__(self, model_dir: Path, out_dir: Path, quantization: str, tokenizer, eos: list[int]):
        import ctranslate2

        converter = ctranslate2.converters.TransformersConverter(str(model_dir))
        setup(
            f"ctranslate2 conversion to {quantization}",
            lambda: converter.convert(str(out_dir), quantization=quantization),
        )
        compute = "float32" if quantization == "float32" else "int8_float32"
        self.ct2, self.tokenizer, self.eos = ctranslate2, tokenizer, eos
        self.generator = ctranslate2.Generator(
            str(out_dir), device="cpu", compute_type=compute, intra_threads=torch.get_num_threads()
        )
        self.generate([tokenizer.encode("Hello")], 1, 2, 1.0, 0)  # warm-up: allocations

    def generate(self, prompts: list[list[int]], batch: int, new_tokens: int, temperature: float, seed: int) -> list:
        self.ct2.set_random_seed(seed)
        results = self.generator.generate_batch(
            [self.tokenizer.convert_ids_to_tokens(p) for p in prompts],
            max_batch_size=batch,
            max_length=new_tokens,
            sampling_topk=0,  # the full distribution
            sampling_topp=1.0,
            sampling_temperature=temperature,
            include_prompt_in_result=False,
            end_token=self.eos,
            return_end_token=True,  # counted, as `finish` keeps the EOS
        )
        gens = []
        for r in results:
            ids = r.sequences_ids[0]
            gens.append(finish(ids, [0.0] * len(ids), self.eos, self.tokenizer))
        return gens


def export_openvino(model_dir: Path, out_dir: Path, ir: str | None) -> Path | None:
    """The fp32 OpenVINO IR folder: `ir` if given, else exported with RLANYTHING_OPTIMUM_PYTHON's
    optimum-cli; None (and why) when neither is there."""
    if ir:
        return Path(ir)
    python = os.environ.get("RLANYTHING_OPTIMUM_PYTHON", "")
    cli = Path(python).parent / "optimum-cli"
    if not python or not cli.is_file():
        print(
            "   openvino skipped: no fp32 IR. Set RLANYTHING_OPTIMUM_PYTHON to the python of a venv with "
            "`pip install optimum-intel openvino==<openvino-genai's> torch==<ours>` (its own: optimum-intel "
            "pins an older transformers), or pass --openvino-ir DIR"
        )
        return None
    command = [str(cli), "export", "openvino", "--model", str(model_dir), "--task", "text-generation-with-past"]
    command += ["--weight-format", "fp32", str(out_dir)]
    setup(
        "openvino export to an fp32 IR (optimum-cli)", lambda: subprocess.run(command, check=True, capture_output=True)
    )
    return out_dir


def default_precision() -> dict:
    """OpenVINO's CPU defaults for the properties OV_PROPERTIES forces: what a pipeline compiled
    without them runs at (the pipeline itself does not report its compiled properties)."""
    import openvino as ov

    core = ov.Core()
    out = {key: core.get_property("CPU", key) for key in OV_PROPERTIES}
    return {key: v.get_type_name() if hasattr(v, "get_type_name") else v for key, v in out.items()}


class OpenVino:
    """OpenVINO GenAI's ContinuousBatchingPipeline, one pipeline per batch size (its max_num_seqs);
    precision "f32" (OV_PROPERTIES forced) or "default" (OpenVINO's own, see default_precision)."""

    def __init__(self, ir_dir: Path, tokenizer, eos: list[int], model_config, precision: str = "f32"):
        import openvino as ov
        import openvino_genai as og

        assert precision in ("f32", "default"), precision
        self.ov, self.og, self.ir_dir, self.tokenizer, self.eos = ov, og, ir_dir, tokenizer, eos
        self.kv_bytes = kv_bytes_per_token(model_config, 4)  # fp32: the cache is sized for the widest
        forced = OV_PROPERTIES if precision == "f32" else {}
        self.properties = {**forced, "INFERENCE_NUM_THREADS": torch.get_num_threads()}
        self.batch, self.pipe = None, None  # one pipeline (and its KV cache) at a time

    def pipeline(self, batch: int, width: int):
        """The pipeline for `batch`, compiled and warmed up once (not timed), its KV cache sized
        for `batch` sequences of `width` tokens (none preempted)."""
        if batch != self.batch:
            self.pipe = None  # its KV cache freed before the next one is allocated
            scheduler = self.og.SchedulerConfig()
            scheduler.max_num_seqs = batch
            scheduler.max_num_batched_tokens = max(width, 256) * batch  # no prompt split across steps
            scheduler.dynamic_split_fuse = False
            scheduler.enable_prefix_caching = False  # as plain: every prompt prefilled in full
            scheduler.cache_size = 1 + int(1.25 * batch * width * self.kv_bytes) // 2**30  # GB
            pipe = setup(
                f"openvino pipeline for batch {batch} compiled",
                lambda: self.og.ContinuousBatchingPipeline(str(self.ir_dir), scheduler, "CPU", self.properties),
            )
            self.run(pipe, [self.tokenizer.encode("Hello")], 2, 1.0, 0)  # warm-up
            self.batch, self.pipe = batch, pipe
        return self.pipe

    def generate(self, prompts: list[list[int]], batch: int, new_tokens: int, temperature: float, seed: int) -> list:
        return self.run(
            self.pipeline(batch, max(map(len, prompts)) + new_tokens), prompts, new_tokens, temperature, seed
        )

    def add(self, pipe, prompts: list[list[int]], new_tokens: int, temperature: float, seed: int, stop=True) -> list:
        """Every prompt queued at once (stop=False: no EOS ends one); their handles."""
        handles = []
        for i, ids in enumerate(prompts):
            config = self.og.GenerationConfig()
            config.do_sample, config.temperature, config.top_p, config.top_k = True, temperature, 1.0, 0
            config.max_new_tokens, config.rng_seed, config.logprobs = new_tokens, seed * 100_000 + i, 1
            if stop:
                config.stop_token_ids = set(self.eos)
            else:
                config.ignore_eos = True
            handles.append(pipe.add_request(i, self.ov.Tensor(np.array([ids], dtype=np.int64)), config))
        return handles

    def run(self, pipe, prompts: list[list[int]], new_tokens: int, temperature: float, seed: int) -> list:
        """Every prompt queued at once, then steps until all have finished."""
        handles = self.add(pipe, prompts, new_tokens, temperature, seed)
        while pipe.has_non_finished_requests():
            pipe.step()
        gens = []
        for handle in handles:
            out = handle.read_all()[0]
            gens.append(finish(list(out.generated_ids), list(out.generated_log_probs), self.eos, self.tokenizer))
        return gens


def cpu_engines(model_dir: Path, work: Path, tokenizer, model_config, eos: list[int], ir: str | None = None) -> dict:
    """{name: engine} of the engines installed and set up (converted or exported into `work`);
    ir: an fp32 OpenVINO IR folder already exported."""
    engines = {}
    if installed("ctranslate2"):
        engines["ct2"] = CT2(model_dir, work / "ct2-float32", "float32", tokenizer, eos)
        engines["ct2-int8"] = CT2(model_dir, work / "ct2-int8", "int8", tokenizer, eos)
    if installed("openvino_genai"):
        ir_dir = export_openvino(model_dir, work / "openvino-fp32", ir)
        if ir_dir is not None:
            engines["openvino"] = OpenVino(ir_dir, tokenizer, eos, model_config)
    return engines
