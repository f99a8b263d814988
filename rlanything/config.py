"""Typed run configuration, loaded strictly from YAML.

Every default lives here, once (those of each environment kind's `env.options`: environment.py).
A YAML file (see `configs/`) only says what differs;
`--set section.key=value` overrides apply on top. Unknown keys and bad values raise
`ConfigError` naming the dotted key. The resolved config is saved as `config.yaml` in the
run folder and logged to MLflow as params.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Literal

import fsspec.core
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rlanything.environment import ENV_KINDS, NoOptions, runs_code
from rlanything.pipeline import STEPS

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config file or override is invalid; the message names every bad key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class RunConfig(_Section):
    name: str = "tiny"
    """Run name; artifacts go to `<root>/<name>/`. Re-using a name resumes that run."""
    root: str = "runs"
    """Folder holding all runs (and, by default, the MLflow SQLite store `mlflow.db`): a path, or
    the fsspec URL of a filesystem mounted here (`file:///mnt/shared/runs`)."""
    seed: int = 0
    """Master seed; every step's randomness derives from (seed, iteration, step)."""
    iterations: int = Field(2, ge=1)
    """Number of training iterations (one Prefect flow run each)."""
    keep_checkpoints: int | None = Field(None, ge=1)
    """Keep the weights of the newest K finished iterations, and AdamW state only in the newest
    (what the next iteration and a resume read); older checkpoints are deleted once an iteration
    is done. None keeps every checkpoint with its optimizer state. Not in the run's digest: it
    changes no file a step writes."""
    memory_gb: float | None = Field(None, gt=0)
    """GiB of resident memory each process of the run may hold (rlanything/memory.py); None: half
    the machine's, which leaves room for a second run. The engines and the update size their work
    to what it leaves: rows decoded or scored together, the update's micro-batches (cut by tokens
    below `optim.micro_batch_size`), and the KV kept between calls (`kv_reuse_gb`, at most a
    quarter of it). A sequence too long to fit alone fails at once with an error naming this
    setting. Not in the run's digest: where it binds it moves log-probs in their last bits (other
    batch mates), as `shards` does."""
    mmap_threshold_mb: float | None = Field(None, gt=0)
    """Allocations of this many MiB or more get a mapping of their own, handed back to the system
    when freed (glibc's M_MMAP_THRESHOLD; rlanything/memory.py `map_large_blocks`); None: glibc's
    default, which raises the threshold up to 32 MiB as it goes. Freed activations then no longer
    stay resident between micro-batches. Measured on a stage-2 text-game policy update under
    `memory_gb` 8 (docs/benchmarks.md): at 2, peak 6.63 GiB against 7.96, at +12% of its time.
    Not in the run's digest: it changes no number."""
    plots: bool = True
    """Draw curves.png, tasks.png and iteration.png into every iteration's folder and MLflow
    (rlanything/reports/iteration_report.py): about 1.2 s an iteration on 2 CPU cores, a third of
    a tiny one. Off: only the markdown views (summary.md, samples.md). Not in the run's digest: no
    step writes them."""
    mlflow_uri: str | None = None
    """MLflow tracking URI; default `sqlite:///<root>/mlflow.db`."""
    experiment: str = "rlanything"
    """MLflow experiment name."""
    step_deployments: dict[Literal[STEPS], str] = {}
    """Steps that run on a Prefect work pool instead of in the iteration's process: step name ->
    deployment of the step flow, "flow/deployment", e.g. {rollout: rlanything-step/inference,
    policy_update: rlanything-step/training} (README "Scheduling"). The run folder must then be
    at the same path on a filesystem every worker sees. Not in the run's digest: where a step
    runs changes none of its files."""
    executor: Literal["local", "ray"] = "local"
    """Where the rollout and rm_score steps generate. `local`: in the step's own process. `ray`:
    their generation calls are cut into `shards` (contiguous rows, so whole task groups and a
    trajectory's steps stay together) played by `ray_workers` Ray actors that keep their engines
    loaded across iterations and reload only when a step names new weights, read from the run
    folder (models/engines/ray_engine.py; docs/scaling.md). Transformers engines only. Not in the run's
    digest: a run resumes on the other executor."""
    ray_address: str = "auto"
    """The Ray cluster of `executor: ray`: `auto` (the cluster `ray start` started on this
    machine, or RAY_ADDRESS), `host:port` (its head's GCS) or `ray://host:port` (Ray Client).
    Run folder and checkpoints must be at the same path on every machine of the cluster."""
    ray_workers: int = Field(2, ge=1)
    """`executor: ray`: engine actors (one CPU each), each holding a policy and an RM engine;
    shard k of a call runs on worker k mod ray_workers."""
    shards: int | None = Field(None, ge=1)
    """The slices a rollout or rm_score generation call is cut into (models/engines/shards.py); null:
    `ray_workers` with `executor: ray`, 1 locally. A row's logits depend on its batch mates
    (~1e-6: they change the kernels' summation order), so the shard layout, not the executor,
    decides the samples bit for bit: a local run and a Ray run with the same `shards` write the
    same files (tested on configs/tiny.yaml), whatever the worker count, and a Ray worker that
    dies is replaced without a changed bit (unless a process is so short of memory that it
    decodes fewer rows at once: models/engines/shards.py). Locally each shard keeps its own KV cache
    (the engine's budget each); a local run pays 3–18% for 2 shards on SmolLM2 (docs/scaling.md).
    Transformers engines only. Not in the run's digest: other shards move log-probs in their last
    bits and, rarely, a sampled token (measured: none on configs/tiny.yaml, 2 of 96 SmolLM2
    judgments)."""

    @property
    def shard_count(self) -> int:
        """`shards`, or its default: `ray_workers` with `executor: ray`, else 1."""
        return self.shards or (self.ray_workers if self.executor == "ray" else 1)

    @field_validator("ray_address")
    @classmethod
    def _ray_address(cls, address: str) -> str:
        host, _, port = address.removeprefix("ray://").rpartition(":")
        if address == "auto" or (host and port.isdigit()):
            return address
        raise ValueError(f"{address!r} is not a Ray address: auto, host:port or ray://host:port")

    @field_validator("root")
    @classmethod
    def _mounted_root(cls, root: str) -> str:
        # Workers on other machines reach the run folder at the same path (NFS or alike). Object
        # stores (s3://, gs://, …) are refused: transformers, vLLM and DeepSpeed load checkpoints
        # from folders, and Prefect's result records and the run lock need a filesystem.
        protocol, path = fsspec.core.split_protocol(root)
        if protocol in (None, "file", "local"):
            return path
        raise ValueError(
            f"{root!r} is on {protocol}://, which rlanything cannot train in: use a local path or a "
            "shared filesystem mounted at the same path on every machine (file:// URLs are accepted)"
        )


class OptimConfig(_Section):
    lr: float = Field(1e-5, gt=0)
    """AdamW learning rate (1e-5 moves a 135M model; 1e-6 barely does)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    grad_clip: float = Field(1.0, gt=0)
    """Max global grad norm."""
    updates_per_iteration: int = Field(1, ge=1)
    """Optimizer steps per pass over the iteration's samples; the samples are split evenly across
    them (mini-batches), a judged step's two verdicts together under algo.rm_verdicts expected."""
    epochs: int = Field(1, ge=1)
    """Passes over the iteration's samples (PPO epochs), each reshuffled into new mini-batches:
    epochs × updates_per_iteration optimizer steps. From the second step on the weights differ from
    the generating model's, and the clip (algo.clip_eps) and the KL term start to act. The
    paper takes one pass."""
    warmup_steps: int = Field(0, ge=0)
    """Optimizer steps, counted over the whole run, whose lr rises linearly from lr/warmup_steps to
    lr (algo/schedule.py). 0: no warmup."""
    schedule: Literal["constant", "cosine"] = "constant"
    """lr after warmup: `constant`, or `cosine` decay to lr × min_lr_ratio at step total_steps."""
    total_steps: int | None = Field(None, ge=1)
    """Optimizer steps the cosine schedule spans, warmup included; None: run.iterations × epochs ×
    updates_per_iteration (iterations added later by `resume -n` then run at the final lr)."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """Cosine schedule: the final lr as a fraction of lr."""
    micro_batch_size: int = Field(4, ge=1)
    """Sequences per forward/backward; gradient accumulation fills each optimizer step."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Arithmetic of the update. `bf16`: forward and backward under bf16 autocast over fp32
    master weights and fp32 AdamW state (checkpoints stay fp32); `fp32`: all fp32; `auto`: bf16
    where the hardware has bf16 matrix units (CPU amx_bf16 or avx512_bf16, a bf16-capable GPU),
    else fp32 (models/precision.py). Resolved once per run, kept in its precision.json."""
    anchor_beta: float = Field(0.0, ge=0)
    """Weight of a k3 KL penalty towards the run's starting weights (the policy's `model`; the
    RM's `rm.model`, else the policy's; with LoRA the adapter's base), on
    top of the paper's KL towards the pre-update weights (`algo.kl_beta`), which a single pass
    leaves at ~0 and which never sees the drift summed over iterations. Each update then runs
    one more forward (the start's log-probs, no gradient). 0: off (the paper; our departure,
    GRPO's reference-model KL: docs/method.md)."""
    gradient_checkpointing: bool = False
    """Keep only each decoder layer's input for the backward and recompute the rest of the layer
    there (transformers' activation checkpointing, non-reentrant): a training token is counted at
    ~1/2 of the activations under bf16 autocast (SmolLM2: 604 KB against 1.29 MB;
    `footprint.activation_bytes_per_token`), at the cost of a second forward of every layer. The
    same gradients (to float rounding); the micro-batch planner counts the smaller activations,
    so more fits under `run.memory_gb`."""
    train_top_layers: int | None = Field(None, ge=1)
    """Train only the last N decoder layers and the final norm (and an LM head not tied to the
    embeddings); the embeddings and the layers below stay frozen, so the backward stops at layer
    L−N and AdamW holds moments for those weights only (`training.lora.train_top_layers`). A
    judge's verdict is a readout of its last layers' states (a linear probe of SmolLM2's last
    layer ranks held-out text-game steps at 0.97), but at the shipped lr its last 4 layers
    alone learned far slower than the whole judge: 0.57 against 0.92 after 22 offline steps, at
    2.2× less time a step (docs/judge.md). None: every weight (the paper; our departure, off by
    default: docs/method.md). Not with LoRA."""
    frozen: bool = False
    """Skip the update: the step trains on no sample and writes the unchanged weights as the
    iteration's checkpoint (the learning test's control run, e.g. `rm.optim.frozen: true`)."""


class LoraConfig(_Section):
    enabled: bool = False
    """Train LoRA adapters (peft) instead of all weights; the base weights stay frozen."""
    r: int = Field(16, ge=1)
    """Adapter rank."""
    alpha: float = Field(32.0, gt=0)
    """LoRA scaling numerator (the update is scaled by alpha / r)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter input during training (0 keeps PPO's first ratio exactly 1)."""
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    """Module names that get adapters (Llama/Qwen names); ["all-linear"] means every linear
    layer but the LM head."""
    save: Literal["merged", "adapter"] = "merged"
    """Checkpoint format. `merged`: full HF weights (base + adapter merged, a plain folder any
    loader or vLLM reads) plus the adapter in `adapter/` to continue training; `adapter`: only
    `adapter/` (its adapter_config.json names the base folder) + config and tokenizer: small on
    disk, merged in memory when loaded; not servable by the vLLM engine."""


class VllmConfig(_Section):
    url: str | None = None
    """Base URL of a vLLM OpenAI-compatible server you started yourself (e.g.
    http://127.0.0.1:8000); then rlanything never restarts it and cannot swap weights, so use it
    only for evaluation or with a server you reload yourself. None: rlanything launches one."""
    python: str = "python"
    """Python of the separate venv where vLLM is installed (it never shares our venv: its
    pinned torch and transformers differ); the server runs as `<python> -m vllm.entrypoints.openai.api_server`."""
    host: str = "127.0.0.1"
    """Interface the launched server binds to."""
    port: int = Field(0, ge=0, le=65535)
    """Port of the launched server; 0 picks a free one."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs one server shards the model across."""
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    """Fraction of each GPU's memory vLLM may take (weights + KV cache). Lower it when training
    shares the GPUs with the server."""
    max_model_len: int = Field(4096, ge=16)
    """Longest prompt + response the server accepts (sets the KV cache size per sequence)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Server weights dtype; `auto` follows the owning section's precision."""
    extra_args: list[str] = []
    """More `vllm serve` flags, e.g. ["--enforce-eager", "--max-num-seqs", "256"]."""
    env: dict[str, str] = {}
    """Extra environment of the server process, e.g. {VLLM_CPU_KVCACHE_SPACE: "1"} on CPU."""
    startup_timeout_s: float = Field(600.0, gt=0)
    """How long to wait for a launched server to answer /health."""
    request_timeout_s: float = Field(600.0, gt=0)
    """HTTP timeout of one generation request."""
    concurrency: int = Field(64, ge=1)
    """Requests in flight at once (vLLM batches them itself)."""
    reload: Literal["restart", "inplace"] = "restart"
    """How a launched server takes new weights after an update. `restart`: a new server on the
    checkpoint folder (always right; costs a server start per iteration). `inplace`: vLLM's
    `reload_weights` through /collective_rpc, no restart; verified on GPU only by the `gpu` test
    in tests/models/test_vllm_engine.py — on vllm-cpu 0.32 it updates the weights only partly."""


class ModelConfig(_Section):
    """A language model and how it generates: the section type of the policy (`policy`), the
    reward model (`rm`) and the environment model (`env_model`)."""

    model: str | None = None
    """Local HF model folder, or `builtin:smollm2-135m-instruct` / `builtin:tiny-random`; None (RM
    and environment model): the policy's base model."""
    engine: Literal["transformers", "vllm"] = "transformers"
    """Generation engine: in-process transformers, or a vLLM server (see `vllm`)."""
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    """Where the transformers engine (and, for the policy and RM, an update with train.backend
    torch) puts the model: `auto` (the first GPU if there is one, else the CPU), `cpu`, `cuda`,
    `cuda:N`. A vLLM server picks its GPUs itself (`vllm.env: {CUDA_VISIBLE_DEVICES: ...}`)."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Arithmetic of generation: the engine's weights in fp32 or bf16; `auto`: bf16 where the
    hardware has bf16 matrix units (CPU amx_bf16 or avx512_bf16, a bf16-capable GPU), else fp32
    (models/precision.py). Resolved once per run, kept in its precision.json. The update's own
    is `optim.precision`; where they differ, the PPO ratio uses the trainer's log-probs
    (`algo.old_logprobs`)."""
    batch_size: int = Field(128, ge=1)
    """Transformers engine: most sequences decoded together. Decoding batches continuously: a
    sequence that ends leaves the batch and the next prompt takes its place. Fewer when their
    KV cache and logits would take more than a quarter of the device's free memory."""
    kv_reuse_gb: float = Field(2.0, ge=0)
    """Transformers engine: GiB of KV cache (on the model's device) kept from one call to the
    next of a caller that extends its prompts: a rollout's next turn (history + reply + new
    observation) prefills only its new tokens; the RM's constrained verdict scores only the
    appended verdict tokens, and judgments of later steps reuse the history of earlier ones.
    Prompts past the budget are prefilled whole (while a call replaces the last call's rows
    both are held: up to twice this). 0: off."""
    max_new_tokens: int = Field(64, ge=1)
    """Token budget of one generation: a policy step, the RM's reasoning (constrained mode appends
    the verdict after it), a rewrite or critic summary."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature (log-probs use the same temperature)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling (the vLLM engine needs 1)."""
    vllm: VllmConfig = VllmConfig()
    """vLLM server settings when engine is `vllm`."""


class PolicyConfig(ModelConfig):
    model: str = "builtin:smollm2-135m-instruct"
    """Local HF model folder, or `builtin:smollm2-135m-instruct` / `builtin:tiny-random`."""
    group_size: int = Field(8, ge=1)
    """G: rollouts per task per iteration."""
    tasks_per_iteration: int = Field(8, ge=1)
    """Tasks sampled from the buffer's active versions each iteration."""
    lora: LoraConfig = LoraConfig()
    """LoRA adapters instead of full fine-tuning."""
    optim: OptimConfig = OptimConfig()
    """Policy optimizer."""


class RewardModelConfig(ModelConfig):
    temperature: float = Field(0.8, gt=0)
    """Sampling temperature of judgments."""
    judgments_per_step: int = Field(3, ge=0)
    """m: independent judgments of every step. 0: the RM is out of the loop (the policy-only
    arm: needs algo.lam 0, rm.optim.frozen and adapt.enabled false); rm_score judges nothing and
    writes an empty judgments artifact, evaluations skip the RM, and an iteration costs the
    rollouts and the policy update alone."""
    verdict: Literal["free", "constrained"] = "free"
    """`free`: the RM writes its own \\boxed{±1}; `constrained`: the verdict token is sampled
    from the model restricted to 1/-1 (for small models that rarely box a verdict themselves)."""
    train_forced_tokens: bool = True
    """With verdict constrained, whether the RM update also trains the tokens appended around
    its decision ("\\n\\boxed{", the "1" of "-1", "}": 6-7 of a direct verdict's 7-8 tokens),
    which the model did not choose. True: every response token (as the free verdict's). False:
    only the reasoning and the verdict's first token, the one token drawn from the model (our
    departure, off by default: docs/method.md). Needs verdict constrained and role judge."""
    max_new_tokens: int = Field(64, ge=0)
    """Token budget of the RM's reasoning (verdict free: reasoning and verdict; role unit_tests:
    one test). 0, with verdict constrained only: a direct verdict, sampled right after the
    prompt from the RM's probabilities of "1" and "-1" with no reasoning (our departure: the
    paper's RM reasons first). The RM is then trained on its verdict alone (its decision and,
    unless `train_forced_tokens` is false, the appended tokens around it), and a judgment costs
    one scoring pass instead of a decode per reasoning token."""
    history_steps: int | None = Field(None, ge=0)
    """How many of the steps before the judged one the RM's prompt shows, the latest ones (the
    task and the judged step with what happened next are always shown). None: all of them (the
    paper). A text game's observations are long, so a late step's full history is most of the
    judging cost; what decides a step's verdict is mostly in the step and its answer (our
    departure, off by default: docs/method.md)."""
    compact_observations: bool = False
    """The RM reads each observation (the task, earlier steps, what happened next) through the
    environment's `judge_view`: a text game's without the list of valid commands and the answer
    line written for the policy: with `history_steps: 0`, a two-room TextWorld judge prompt of
    ~460-500 tokens loses 24-29% of them (measured: docs/judge.md), and the RM's judging and
    update cost with them. False: as the policy read it (the paper); environments without a
    view are unchanged either way (our departure, off by default: docs/method.md)."""
    judge_trainable_only: bool = False
    """Judge only the steps of tasks whose accuracy lies in `algo.band` or `algo.policy_band`:
    step 4 drops every other task's samples (out of band), so their verdicts train neither model
    and the same samples are kept, with the same advantages for the same verdicts (the verdicts
    are fresh draws: a judgment's sampling noise follows its row in the call). What changes: the
    RM's training metrics (parse rate, outcome and process accuracy, verdict shares) and the
    reward-hacking guard read the judged tasks only, and a task that left the band has no verdict
    for task adaptation's critic (so adaptation needs `adapt.rewriter: rule` and `adapt.critic:
    extractive`). On text games most tasks sit outside the band (all won or all lost): judging
    their steps too took 73 s of an iteration instead of 11 s (one measured iteration on one core,
    docs/judge.md). False: every step is judged (the paper; our departure, off by default:
    docs/method.md)."""
    role: Literal["judge", "unit_tests"] = "judge"
    """`judge`: the RM judges every step ±1 (m judgments); `unit_tests` (env.kind coding only,
    the paper's coding setting): the RM writes unit tests for each problem, run in the sandbox
    against the policy's solutions (docs/method.md, "Coding: the RM writes unit tests")."""
    tests_per_task: int = Field(4, ge=1)
    """K: unit tests the RM writes for each problem per iteration (role unit_tests)."""
    replay_iterations: int = Field(0, ge=0)
    """K: the RM update also trains on the kept judgments of the K iterations before this one,
    with the advantages they were given then, beside this iteration's (role judge). An
    iteration keeps only 3-16 distinct judged prompts on a text game, and one pass over them
    moves the judge too little to rank steps (docs/judge.md); a replayed judgment is seen again
    by later updates, each time against the weights that update starts from (its old log-probs
    are recomputed by the trainer: `algo.old_logprobs` must not be `sampler`, nor `algo.tis_cap`
    set), so the PPO clip bounds each pass, not their sum. The samples grow up to (K+1)-fold:
    raise `rm.optim.updates_per_iteration` to keep the mini-batches' size. 0: this iteration's
    judgments only (the paper; our departure, off by default: docs/method.md)."""
    lora: LoraConfig = LoraConfig()
    """LoRA adapters instead of full fine-tuning."""
    optim: OptimConfig = OptimConfig()
    """RM optimizer."""


class EnvModelConfig(ModelConfig):
    """The environment model of task adaptation (rewrites and critic summaries). Never trained.
    Fields left out take the policy's value: model (its base model), engine, device, precision,
    batch_size, kv_reuse_gb, vllm."""

    max_new_tokens: int = Field(160, ge=1)
    """Token budget of one rewrite or critic summary."""
    temperature: float = Field(0.7, gt=0)
    """Sampling temperature of rewrites and summaries."""


ENV_MODEL_INHERITS = ("model", "engine", "device", "precision", "batch_size", "kv_reuse_gb", "vllm")
"""Fields of `env_model` that default to the policy's value."""


# ------------------------------------------------------------------ environment options by kind
# Every environment kind has one options model; `env.options` is validated by the model of
# `env.kind` only. The built-in kinds and their models: `ENV_KINDS` (environment.py). A plug-in
# kind ("package.module:ClassName") brings its own (`Options`).


def env_options_model(kind: str) -> type[BaseModel]:
    """The options model of an environment kind: a built-in's (`ENV_KINDS`), or a plug-in class's
    `Options` (NoOptions for a plug-in without one)."""
    if kind in ENV_KINDS:
        return ENV_KINDS[kind].options
    from rlanything.plugins import environment_class  # imports the plug-in's module; only plug-ins need it

    options = getattr(environment_class(kind), "Options", NoOptions)
    if not (isinstance(options, type) and issubclass(options, BaseModel)):
        raise ValueError(f"{kind}.Options must be a pydantic BaseModel subclass, got {options!r}")
    return options


class EnvConfig(_Section):
    kind: str = "reasoning_gym"
    """Environment: a built-in kind (`ENV_KINDS` in rlanything/environment.py: reasoning_gym, miniwob,
    osworld, textworld, textworld_express, alfworld, coding, first_letter) or a plug-in class
    "package.module:ClassName" implementing rlanything.envs.base.Environment (its module must be
    importable)."""
    num_problems: int = Field(8, ge=1)
    """Size of the initial task buffer (one slot per problem)."""
    max_steps: int = Field(1, ge=1)
    """Step cap of an episode; reaching it ends the episode as a failure."""
    answer_fallback: Literal["none", "last_number", "first_word", "code_block"] = "none"
    """How a response without a \\boxed{} is read: `none` (no action, the usual failure),
    `last_number` (its last number, action_status `last_number`), for small models that compute
    but do not box yet (reasoning-gym arithmetic with SmolLM2-135M), `first_word` (its first
    word: one-word answers, e.g. kind first_letter with random-init models), or `code_block`
    (its last ```python block: coding with models that fence code but do not box it)."""
    screenshots: bool = True
    """Keep a PNG of the screen after every step (environments with a screen: MiniWoB++,
    OSWorld) in iter_NNNN/screenshots/ and MLflow; the `screenshot` column of rollouts.parquet
    names each step's file."""
    options: SerializeAsAny[BaseModel] = Field(default_factory=dict, validate_default=True)
    """Options of `kind`, validated by that kind's model only: a built-in kind's model is named in
    `ENV_KINDS` (rlanything/environment.py: ReasoningGymOptions, MiniWoBOptions, OSWorldOptions,
    TextWorldOptions, TextWorldExpressOptions, AlfWorldOptions, CodingOptions,
    FirstLetterOptions), a plug-in's is its class's own pydantic `Options` (none: NoOptions)."""

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        env_options_model(kind)  # an unknown kind, or a plug-in that cannot be imported, fails here, under env.kind
        return kind

    @field_validator("options", mode="before")
    @classmethod
    def _options_of_kind(cls, value: Any, info: ValidationInfo) -> Any:
        if "kind" not in info.data:  # the kind failed: its error says why
            return value
        model = env_options_model(info.data["kind"])
        if isinstance(value, model):
            return value
        if isinstance(value, BaseModel):  # another kind's options (model_copy of a config)
            value = value.model_dump()
        if isinstance(value, dict) and model.model_config.get("extra") not in ("forbid", "allow"):
            unknown = sorted(set(value) - set(model.model_fields))  # strict even if the plug-in is not
            if unknown:
                raise ValueError(
                    f"unknown option(s) {unknown} of {info.data['kind']}; its options: {sorted(model.model_fields)}"
                )
        return model.model_validate(value)


class RMGuardConfig(_Section):
    """The reward-hacking alarm (algo/rm_accuracy.py): per iteration, the RM is flagged when its
    judgments stop predicting outcomes. A flag is a warning in the log, `rm_guard/alarm` in
    MLflow and a line in the iteration's summary.md."""

    max_score_gap: float = 1.0
    """Flag when the mean trajectory step score exceeds the mean outcome by more than this
    (both in [-1, 1]): the RM is pleased while the verifier is not."""
    min_outcome_accuracy: float = Field(0.5, ge=0, le=1)
    """Flag when fewer than this fraction of trajectories get the sign of their outcome from the
    sign of their mean step score."""
    min_outcome_auroc: float = Field(0.6, ge=0, le=1)
    """Flag when the AUROC of the trajectories' mean step scores for success falls below this
    (0.5: chance). Unlike accuracy it does not reward calling every step good when most
    episodes succeed. Not decided when only one outcome occurred."""
    min_trajectories: int = Field(8, ge=1)
    """Decide only from at least this many judged trajectories; fewer never flag."""
    outcome_only_when_flagged: bool = False
    """A flagged iteration uses R = O (λ = 0) for the policy's reward and for the RM's
    consistency reward R·S_j (`rm_guard/lam` records the λ used); the next unflagged one uses
    `algo.lam` again."""


class AlgoConfig(_Section):
    lam: float = 1.0
    """λ in R = O + λ·mean_j S; 0 gives the outcome-only baseline."""
    outcome_weight: float = Field(1.0, ge=0)
    """w in the *policy's* reward R = w·O + λ·mean_j S (coding: w·tests passed + λ·generated
    tests passed); 0 with λ > 0 is the paper's RM-signal-only arm. The RM's consistency reward
    always uses R = O + λ·mean_j S, so the RM keeps learning from outcomes."""
    clip_eps: float = Field(0.2, gt=0)
    """PPO clip ε."""
    kl_beta: float = Field(0.01, ge=0)
    """β of the k3 KL penalty against the generating model."""
    band: tuple[float, float] = (0.2, 0.8)
    """[α_low, α_high]: tasks whose accuracy is inside train the RM; outside, they are adapted."""
    policy_band: tuple[float, float] = (0.125, 0.875)
    """Accuracy band of tasks whose samples train the policy."""
    rm_balance: bool = False
    """Reweight the RM's advantages so that the judgments of solved and of unsolved episodes
    (with rm_target progress: of steps of positive and of negative progress) carry equal total
    weight in its update (our departure; `algo.advantages.class_balanced`): with most episodes
    failed, the paper's consistency reward O·S_j mostly pays "−1" and a small judge learns the
    class prior instead of the difference. With rm_target progress an iteration whose kept
    judgments are all of one class does not train the RM (`one_class`). Needs rm.role judge."""
    rm_advantage: Literal["zscore", "reward"] = "zscore"
    """A judgment's advantage in the RM's update. `zscore`: its reward's z-score over the m
    judgments of its step (the paper): a step whose m verdicts agree earns equal rewards and
    does not train (`zero_std`), so a judge that says −1 unanimously cannot be corrected.
    `reward` (our departure, docs/method.md): the reward itself (R·S_j, or sign(progress)·S_j;
    −2 unparseable), every judged step trains."""
    rm_verdicts: Literal["drawn", "expected"] = "drawn"
    """Which verdicts of a judged step train the RM. `drawn`: its m sampled judgments (the paper).
    `expected` (our departure, docs/method.md): both verdicts, +1 and −1, weighted by the judge's
    own probabilities of them (`algo.advantages.expected_verdict_advantages`), so that an update's
    first step follows the exact gradient of the paid reward in expectation, without the noise
    of m draws. Needs a direct constrained verdict (rm.max_new_tokens 0), rm.train_forced_tokens
    false, rm_advantage reward and no rm.replay_iterations. A step's two verdicts cancel the
    softmax's normaliser only together, so they share every mini-batch (`Sample.unit`); the m
    judgments still give the policy's step scores."""
    rm_stratify: bool = False
    """With algo.rm_verdicts expected and several RM mini-batches (rm.optim.updates_per_iteration):
    deal the judged steps so that every mini-batch holds the steps paid towards +1 and those paid
    towards −1 in the pass's proportions, to within one step, in a drawn order (our departure;
    `trainer.epoch_mini_batches`). Built against the judge's drift towards −1 over ten
    mini-batches, where nearly every judged step belonged to a lost episode; measured offline,
    it was not the cause: the deal's luck moved the judge's prior as much (docs/judge.md)."""
    rm_target: Literal["outcome", "progress"] = "outcome"
    """What a judgment of the RM is paid for. `outcome`: R·S_j, its episode's outcome and the
    step scores (the paper). `progress` (our departure, docs/method.md): sign(V(s_t+1) −
    V(s_t))·S_j, where V(s) is the mean outcome when the current policy plays on from state s
    (`progress_source`; `agent.branching`, `algo.mc_progress`): what the step changed, not how
    its episode ended. Only the valued steps train the RM. Needs rm.role judge and, with
    continuations, a deterministic game (text games); with no RM in the loop (m = 0) nothing is
    valued."""
    progress_source: Literal["continuations", "siblings"] = "continuations"
    """With rm_target progress, where V(s) comes from. `continuations`: `progress_k` fresh games
    of the current policy from s, on `progress_steps` sampled steps (costs play). `siblings` (our
    departure, docs/method.md): the mean outcome of this iteration's episodes of the task that
    passed through s (the same actions and observations), on every step whose judgments can train
    the RM, at no cost (`algo.mc_progress.sibling_values`); only steps where an episode parts
    from its siblings get a target other than 0."""
    progress_steps: int = Field(16, ge=1)
    """With rm_target progress and progress_source continuations: steps valued an iteration,
    drawn from the judged steps before an episode's last in tasks inside `band` whose m verdicts
    are not all alike (the only ones whose judgments can train the RM)."""
    progress_k: int = Field(4, ge=1)
    """With rm_target progress and progress_source continuations: continuations played from each
    state (before and after a step)."""
    old_logprobs: Literal["auto", "sampler", "trainer"] = "auto"
    """Log-probs the PPO ratio and the KL take as the pre-update model's. `sampler`: the ones the
    engine recorded while generating (the paper); `trainer`: recomputed by the update itself,
    teacher-forced over the kept samples before its first step, in its own precision (as verl
    does): a sampler in another precision (or another code path) gives each token a slightly
    different log-prob, and a ratio against those is not 1 at the first step. Costs one
    forward pass over the samples. `auto`: trainer unless generation and update are both fp32
    (where the two agree to float rounding). Either way, with `trainer` the per-token gap is
    logged (`mismatch/*`)."""
    tis_cap: float | None = Field(None, gt=1)
    """Truncated importance sampling on the sampler/trainer ratio: each token's PPO term is
    weighed by min(exp(trainer − sampler), tis_cap) (`algo.mismatch.tis_weights`; needs the
    trainer's log-probs, so it is used only where `old_logprobs` resolves to trainer). None:
    off (the paper has none). `mismatch/outside_cap` counts tokens outside [1/C, C] with this
    C, or 2 when off."""
    rm_guard: RMGuardConfig = RMGuardConfig()
    """The reward-hacking alarm, and whether a flag switches the policy to outcome-only."""

    @model_validator(mode="after")
    def _ordered(self) -> AlgoConfig:
        if self.tis_cap is not None and self.old_logprobs == "sampler":
            raise ValueError("tis_cap weighs by the trainer/sampler ratio: it needs old_logprobs trainer or auto")
        for name in ("band", "policy_band"):
            low, high = getattr(self, name)
            if not 0.0 <= low <= high <= 1.0:
                raise ValueError(f"{name} must satisfy 0 <= low <= high <= 1, got {(low, high)}")
        return self


class AdaptConfig(_Section):
    enabled: bool = True
    """Rewrite tasks whose accuracy leaves the band; off: only record accuracies."""
    rewriter: Literal["model", "rule"] = "model"
    """`model`: the environment model (`env_model`) rewrites the task (the paper); `rule`: the environment's own
    deterministic difficulty step, through the same parse/validate/accept path (small-model runs)."""
    critic: Literal["model", "extractive"] = "model"
    """Critic summary of the RM's reasoning on failed steps: written by the environment model
    (`env_model`), or
    extracted verbatim."""
    attempts: int = Field(3, ge=1)
    """Rewrite attempts per task; the first valid one becomes the pending version."""
    critic_steps: int = Field(4, ge=1)
    """At most this many failed steps (with the RM's reasoning) feed one critic summary."""


class TrainConfig(_Section):
    backend: Literal["torch", "accelerate"] = "torch"
    """`torch`: the plain loop in this process (one CPU or GPU). `accelerate`: the same loop and
    loss under an `accelerate.Accelerator` (DDP, DeepSpeed ZeRO, mixed precision)."""
    launch: list[str] = []
    """With backend `accelerate`: the command prefix that runs each update in its own processes,
    e.g. [accelerate, launch, --config_file, configs/accelerate/deepspeed_zero2.yaml]; the task
    appends `-m rlanything.models.training.distributed <job.json>` and waits. Empty: one in-process
    Accelerator (whatever `accelerate config` set as default, e.g. CPU)."""

    @model_validator(mode="after")
    def _launch_needs_accelerate(self) -> TrainConfig:
        if self.launch and self.backend != "accelerate":
            raise ValueError("launch is only used with backend: accelerate")
        return self


class EvalConfig(_Section):
    every: int = Field(0, ge=0)
    """Evaluate the newest policy checkpoint on held-out problems (`rlanything eval`) after every
    N training iterations; 0: never during training."""
    problems: int = Field(64, ge=1)
    """Held-out problems per split, one greedy episode each."""
    splits: list[Literal["in_domain", "ood"]] = ["in_domain", "ood"]
    """Splits evaluated: in_domain (the training generator, unseen seeds) and/or ood (harder
    knobs, bigger worlds or other task kinds)."""
    max_new_tokens: int | None = Field(None, ge=1)
    """Token budget of one greedy step; default policy.max_new_tokens."""
    rm: bool = True
    """Judge the held-out episodes with the RM of the same checkpoint (rm.judgments_per_step
    verdicts per step, as in training) and report how well it predicts their outcomes
    (rm_outcome_accuracy, rm_outcome_auroc, ...); false: the policy alone. An RM that writes unit
    tests (rm.role unit_tests) judges no step either way."""


class Config(_Section):
    run: RunConfig = RunConfig()
    """Run identity, seed and tracking."""
    policy: PolicyConfig = PolicyConfig()
    """The policy model, its rollouts and optimizer."""
    rm: RewardModelConfig = RewardModelConfig()
    """The generative reward model."""
    env_model: EnvModelConfig = EnvModelConfig()
    """The environment model of task adaptation; what it leaves out is the policy's (see
    EnvModelConfig)."""
    env: EnvConfig = EnvConfig()
    """The environment and the initial task buffer."""
    algo: AlgoConfig = AlgoConfig()
    """Rewards, advantages and loss."""
    adapt: AdaptConfig = AdaptConfig()
    """Task adaptation."""
    train: TrainConfig = TrainConfig()
    """Where and how the policy and RM updates run (plain torch, accelerate, DeepSpeed)."""
    eval: EvalConfig = EvalConfig()
    """Held-out evaluation (`rlanything eval`) and how often training runs it."""

    @model_validator(mode="before")
    @classmethod
    def _env_model_defaults_to_policy(cls, data: Any) -> Any:
        # Filled in before validation, so the saved config.yaml names the env model's settings.
        if not isinstance(data, dict):
            return data
        policy, own = data.get("policy", {}), data.get("env_model", {})
        if isinstance(policy, BaseModel):
            policy = dict(policy)
        if isinstance(own, BaseModel):
            own = {key: getattr(own, key) for key in own.model_fields_set}
        if not isinstance(policy, dict) or not isinstance(own, dict):
            return data  # the field's own validation names the error
        merged = {**{key: policy[key] for key in ENV_MODEL_INHERITS if key in policy}, **own}
        if merged.get("model") is None:
            merged["model"] = policy.get("model", PolicyConfig.model_fields["model"].default)
        return {**data, "env_model": merged}

    @model_validator(mode="after")
    def _vllm_needs_plain_folders(self) -> Config:
        for name, section in (("policy", self.policy), ("rm", self.rm)):  # the trained ones
            if section.engine == "vllm" and section.lora.enabled and section.lora.save == "adapter":
                raise ValueError(f"{name}.engine vllm serves plain weight folders: set {name}.lora.save: merged")
        for name, section in (("policy", self.policy), ("rm", self.rm), ("env_model", self.env_model)):
            if section.engine == "vllm" and section.top_p < 1:
                raise ValueError(f"{name}.engine vllm records untruncated log-probs only with {name}.top_p: 1")
        for name, section in (("policy", self.policy), ("rm", self.rm)):
            if section.optim.train_top_layers and section.lora.enabled:
                raise ValueError(f"{name}.optim.train_top_layers trains whole layers: not with {name}.lora.enabled")
        sharded = self.run.executor == "ray" or self.run.shard_count > 1
        for name, section in (("policy", self.policy), ("rm", self.rm)):  # the sampling steps' engines
            if sharded and section.engine != "transformers":
                raise ValueError(
                    f"run.executor ray and run.shards > 1 cut transformers engines' calls only ({name}.engine)"
                )
        if self.rm.role == "unit_tests" and not runs_code(self.env.kind):
            kinds = " or ".join(kind for kind in ENV_KINDS if runs_code(kind))
            raise ValueError(
                f"rm.role unit_tests needs env.kind {kinds} (got {self.env.kind!r}): tests need code to run"
            )
        if self.rm.judgments_per_step == 0:
            self._check_no_rm()
        if self.rm.judge_trainable_only and self.adapt.enabled:
            if self.adapt.rewriter != "rule" or self.adapt.critic != "extractive":
                raise ValueError(
                    "rm.judge_trainable_only leaves the tasks that left the band unjudged, so no RM "
                    "reasoning reaches a critic or a model rewriter: with adapt.enabled set "
                    "adapt.rewriter: rule and adapt.critic: extractive (or adapt.enabled: false)"
                )
        if self.rm.replay_iterations:
            self._check_replay()
        if self.algo.rm_verdicts == "expected":
            self._check_expected_verdicts()
        elif self.algo.rm_stratify:
            raise ValueError(
                "algo.rm_stratify deals the steps by their payoff's sign: it needs algo.rm_verdicts expected"
            )
        if self.algo.rm_balance and self.rm.role != "judge":
            raise ValueError("algo.rm_balance reweights judgments: it needs rm.role judge")
        if self.algo.rm_advantage != "zscore" and self.rm.role != "judge":
            raise ValueError("algo.rm_advantage reward pays judgments: it needs rm.role judge")
        if self.algo.rm_target == "progress" and self.rm.role != "judge":  # with m = 0: nothing to pay
            raise ValueError("algo.rm_target progress pays judgments of steps: it needs rm.role judge")
        if self.rm.max_new_tokens == 0 and (self.rm.verdict != "constrained" or self.rm.role != "judge"):
            raise ValueError(
                "rm.max_new_tokens 0 (a direct verdict, no reasoning) needs rm.verdict constrained "
                "and rm.role judge: a free verdict or a unit test has to be written"
            )
        if not self.rm.train_forced_tokens and (self.rm.verdict != "constrained" or self.rm.role != "judge"):
            raise ValueError(
                "rm.train_forced_tokens false leaves out the constrained verdict's appended tokens: "
                "it needs rm.verdict constrained and rm.role judge (a free verdict writes every token)"
            )
        if self.rm.engine == "vllm" and self.rm.verdict == "constrained" and self.rm.temperature != 1:
            raise ValueError(
                "rm.engine vllm scores verdicts at temperature 1 only (its prompt log-probs ignore "
                "temperature): use rm.verdict free, rm.temperature 1, or rm.engine transformers"
            )
        return self

    def _check_replay(self) -> None:
        # A replayed judgment's sampler log-probs are an older RM's: the ratio and any weighing by
        # them would measure the drift since, not this update's move.
        if self.rm.role != "judge":
            raise ValueError("rm.replay_iterations replays judgments: it needs rm.role judge")
        if self.algo.old_logprobs == "sampler" or self.algo.tis_cap is not None:
            raise ValueError(
                "rm.replay_iterations trains on judgments an older RM drew, against log-probs the "
                "update recomputes: set algo.old_logprobs auto or trainer, and algo.tis_cap null"
            )

    def _check_expected_verdicts(self) -> None:
        # Both verdicts of a step train with the probabilities the judge gave them when it judged:
        # a verdict with no reasoning before it, the decision token alone, paid per unit of S.
        rm = self.rm
        needs = {
            "rm.verdict: constrained and rm.max_new_tokens: 0 (a direct verdict)": rm.verdict == "constrained"
            and rm.max_new_tokens == 0,
            "rm.train_forced_tokens: false (the decision token alone)": not rm.train_forced_tokens,
            "algo.rm_advantage: reward (the payoff times S)": self.algo.rm_advantage == "reward",
            "rm.replay_iterations: 0 (an older judge's probabilities)": rm.replay_iterations == 0,
        }
        missing = [need for need, ok in needs.items() if not ok]
        if missing:
            raise ValueError("algo.rm_verdicts expected needs " + "; ".join(missing))

    def _check_no_rm(self) -> None:
        # Without judgments nothing may need them: the policy's reward, the RM's samples, the critic.
        needs = {
            "algo.lam: 0 (the policy's reward uses the verdicts)": self.algo.lam == 0,
            "rm.optim.frozen: true (the RM trains on its judgments)": self.rm.optim.frozen,
            "adapt.enabled: false (the critic summarises the RM's reasoning)": not self.adapt.enabled,
            "rm.role: judge (unit tests are written, not judged)": self.rm.role == "judge",
        }
        missing = [need for need, ok in needs.items() if not ok]
        if missing:
            raise ValueError("rm.judgments_per_step 0 (no RM in the loop) needs " + "; ".join(missing))

    @property
    def rm_model(self) -> str:
        return self.rm.model or self.policy.model

    @property
    def mlflow_uri(self) -> str:
        if self.run.mlflow_uri:
            return self.run.mlflow_uri
        return f"sqlite:///{(Path(self.run.root).resolve() / 'mlflow.db').as_posix()}"

    @property
    def run_dir(self) -> Path:
        return Path(self.run.root).resolve() / self.run.name

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def digest(self) -> str:
        """Stable hash of what determines a run's artifacts (part of every step's cache key).
        `run.iterations` is left out: extending a run must not invalidate finished steps; so are
        `run.step_deployments`, `run.keep_checkpoints`, `run.memory_gb`, `run.mmap_threshold_mb`, `run.plots`, `run.executor` (and its Ray settings) and
        `eval`: where a step runs, how many old
        checkpoints stay and how checkpoints are evaluated change none of its files."""
        data = self.to_dict()
        del data["run"]["iterations"], data["run"]["step_deployments"], data["run"]["keep_checkpoints"]
        del data["run"]["memory_gb"], data["run"]["mmap_threshold_mb"]  # how much is taken at once, and how
        del data["run"]["plots"]  # the figures
        for key in ("executor", "ray_address", "ray_workers", "shards"):  # where and in what slices it generates
            del data["run"][key]
        data.pop("eval")  # evaluation reads checkpoints; it changes none of training's files
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply `a.b.c=value` (value parsed as YAML) to a nested dict in place."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like section.key=value")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part!r} is not a section")
        node = child
    node[parts[-1]] = yaml.safe_load(raw)


# Keys of the layout before environment options were keyed on env.kind and the environment
# model got its own section: (old section, old key) -> (new section, new key, the one kind that
# read it, or None: every kind).
_MOVED = {
    ("env", "dataset"): ("env.options", "dataset", "reasoning_gym"),
    ("env", "dataset_config"): ("env.options", "dataset_config", "reasoning_gym"),
    ("adapt", "model"): ("env_model", "model", None),
    ("adapt", "max_new_tokens"): ("env_model", "max_new_tokens", None),
    ("adapt", "temperature"): ("env_model", "temperature", None),
}
_RENAMED_OPTIONS = {("textworld", "options"): "tw_make"}
_DTYPE_TO_PRECISION = {"float32": "fp32", "bfloat16": "bf16"}


def _move(data: dict[str, Any], old: str, new: str, value: Any, moved: list[str]) -> None:
    node = data
    *sections, key = new.split(".")
    for part in sections:
        node = node.setdefault(part, {})
    if key in node:
        raise ConfigError(f"{old} moved to {new}; the config sets both: keep only {new}")
    node[key] = value
    moved.append(f"{old} -> {new}")


def migrate(data: dict[str, Any]) -> list[str]:
    """Rewrite the keys of the old layout in place (env.dataset, env.<kind>.*, adapt.model, ...)
    -> what changed, one line each (empty for a config in the current layout)."""
    moved: list[str] = []
    env = data.get("env")
    kind = env.get("kind", EnvConfig.model_fields["kind"].default) if isinstance(env, dict) else None
    for (section, key), (new_section, new_key, reader) in _MOVED.items():
        node = data.get(section)
        if not isinstance(node, dict) or key not in node:
            continue
        value = node.pop(key)
        if reader is not None and kind != reader:
            moved.append(f"{section}.{key} dropped (read only by kind {reader}, now {new_section}.{new_key})")
        else:
            _move(data, f"{section}.{key}", f"{new_section}.{new_key}", value, moved)
    for name in ENV_KINDS if isinstance(env, dict) else ():
        section = env.get(name)
        if not isinstance(section, dict):
            continue
        del env[name]
        if name != kind:
            moved.append(f"env.{name} dropped (options of kind {name}; env.kind is {kind})")
            continue
        for key, value in section.items():
            new_key = _RENAMED_OPTIONS.get((name, key), key)
            _move(data, f"env.{name}.{key}", f"env.options.{new_key}", value, moved)
    _migrate_dtype(data, moved)
    return moved


def _migrate_dtype(data: dict[str, Any], moved: list[str]) -> None:
    """`<section>.dtype: float32 | bfloat16` (weights for generation and training) ->
    `<section>.precision` and, for the trained policy and RM, `<section>.optim.precision`."""
    for name in ("policy", "rm", "env_model"):
        section = data.get(name)
        if not isinstance(section, dict) or "dtype" not in section:
            continue
        value = section.pop("dtype")
        new = _DTYPE_TO_PRECISION.get(value, value)  # anything else: the field names the error
        _move(data, f"{name}.dtype", f"{name}.precision", new, moved)
        if name != "env_model":
            _move(data, f"{name}.dtype", f"{name}.optim.precision", new, moved)


def build_config(data: dict[str, Any], overrides: list[str] = ()) -> Config:
    """Validate plain config data with `section.key=value` overrides on top; keys of the old
    layout are migrated with a logged warning that says what to change."""
    data = json.loads(json.dumps(data))  # deep copy of plain data
    for override in overrides:
        apply_override(data, override)
    moved = migrate(data)
    if moved:
        log.warning(
            "the config uses the old layout; read as the new one (update the file or overrides):\n  %s",
            "\n  ".join(moved),
        )
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        lines = [
            f"  {'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
            + (f" (got {e['input']!r})" if e["type"] != "extra_forbidden" else "")
            for e in err.errors()
        ]
        raise ConfigError("invalid config:\n" + "\n".join(lines)) from None


def read_yaml(text: str) -> Any:
    """`yaml.safe_load` by libyaml's loader where PyYAML was built with it: the same safe subset,
    faster. Every step reads its run's saved config again: 8.0 ms with the pure-Python loader,
    1.7 ms with libyaml's (measured on a 2-core EPYC), ~55 reads in a tiny two-iteration run."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_config(path: str | Path, overrides: list[str] = ()) -> Config:
    """Read a YAML config strictly; `overrides` are `section.key=value` strings."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    data = read_yaml(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return build_config(data, overrides)


def save_config(config: Config, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    tmp.replace(path)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; used for MLflow params."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out
