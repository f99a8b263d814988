"""Generation sharded over a Ray cluster (`run.executor: ray`): a `GenerationEngine` whose calls
are cut into shards played by engine actors on other processes or machines.

Why actors called from inside the step, not prefect-ray's task runner: a task runner starts a
fresh task per shard, so every shard would load its model again (SmolLM2: ~1 s from a warm page
cache, far more from shared storage, per shard and per turn of a multi-turn rollout). An
`EngineWorker` actor instead keeps its engines (one per role: policy, RM) loaded for the whole
run and reloads only when a step names other weights. The step stays one Prefect task with its
states, Parquet files and MLflow logging unchanged; only its engine is remote.

Weights move through the run folder, not the object store: every update already writes its
checkpoint there atomically (resume reads it), the folder must be shared anyway (checkpoints,
`run.step_deployments`), and a worker reads it straight from disk, where the object store would
add a copy of every tensor through the driver, which does not even hold them (the update may run
under `accelerate launch`). A worker reloads when the step's `model_dir` differs from the one it
holds: once per iteration and role.

Shards: contiguous slices of a call's rows (`run.shards`, models/engines/shards.py). The rollout's rows
are its episodes in task-group order and the judge's are steps in trajectory order, so a shard
holds whole task groups (and consecutive steps that share a judge prompt's history) up to the
cut, and each shard keeps its own `PrefixCache` on its worker from turn to turn. Each row keeps
its index in the whole call (`row_ids`), which picks its noise stream (models/engines/decode.py's seed
rule), so a shard draws the uniforms one process would. A row's batch mates (the padding and KV
layout of its decode batch) change the attention's summation order by ~1e-6, so the logits
depend on the shard layout: a local run that plays the same shards in turn (`ShardedEngine`)
writes these files bit for bit, while a local run in one piece differs in the log-probs' last
bits and, where a uniform falls within that of a boundary of the inverse CDF over the
vocabulary, in a sampled token (measured: none on configs/tiny.yaml's two iterations; 2 of 96
SmolLM2 judgments of 32 tokens, none of 32 rollouts; the same shards without `row_ids` change
half the rollouts).

A worker that dies fails its shard: `RayActorError` (a killed process, a lost machine) or
`OutOfMemoryError` (Ray's memory monitor killed it, the machine past 95% of its memory); the
shard is played again on a new worker that replaces it, with the same rows and row ids. The new
worker first plays the step's earlier calls of each shard the dead one held (their results
dropped), so their KV caches are rebuilt as they were and the step's files are those it would
have written, bit for bit; the log says which worker died.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlanything import stopping
from rlanything.config import ConfigError
from rlanything.models.engines.decode import full_attention
from rlanything.models.engines.generation import Generation, PrefixCache, eos_ids_of
from rlanything.models.engines.shards import shard_bounds
from rlanything.models.loading import load_tokenizer

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10  # a head that does not accept a connection in this long counts as unreachable
CLIENT_INIT_TRIES = 3  # a Ray Client server's failed session start, asked again (see connect)
CLIENT_RETRY_S = 5.0
MAX_RERUNS = 2  # a shard whose worker died this many times in a row fails the step
_state: dict[str, Any] = {"workers": [], "kill_next": False}  # this process's actors and fault flag


class ClusterUnreachable(ConfigError):
    """`run.ray_address` names no cluster this process can join."""


def connect(address: str) -> None:
    """Join the Ray cluster at `address` once per process -> ClusterUnreachable, one line naming
    the address, when there is none (Ray's own error is a long traceback).

    A Ray Client server (`ray://`) that answers but fails to start this driver's session is asked
    again, CLIENT_INIT_TRIES times in all, each failure logged with the server's reason. It forks
    a server process per driver, which now and then dies at start (a gRPC fork race in Ray's
    proxy, ray-project/ray#63202: seen here on 1 of 4 connects, and once in CI), or misses the
    30 s it is given to answer on a loaded head."""
    import ray

    if ray.is_initialized():
        return
    for attempt in range(1, CLIENT_INIT_TRIES + 1):
        try:
            _probe(address)  # ray.init retries an absent head for minutes before it raises
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            return
        except ConnectionAbortedError as err:  # Ray Client: "Initialization failure from server:\n<why>"
            reason = _server_reason(err)
            if attempt < CLIENT_INIT_TRIES:
                log.warning(
                    "the Ray Client server at %s failed to start a session for this process (try %d of %d): "
                    "%s; asking again in %.0f s",
                    address,
                    attempt,
                    CLIENT_INIT_TRIES,
                    reason,
                    CLIENT_RETRY_S,
                )
                time.sleep(CLIENT_RETRY_S)
                continue
            reason = f"its Ray Client server failed {attempt} times to start a session: {reason}"
        except Exception as err:  # ConnectionError, OSError, a timeout, depending on the address's form
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ClusterUnreachable(
            f"no Ray cluster reachable at run.ray_address={address!r} ({reason[:300]}); start one "
            "with `ray start --head` or fix the address (docs/scaling.md)"
        ) from None


def _server_reason(err: Exception) -> str:
    """The last line of a Ray Client server's answer (its traceback's exception), or the first."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if len(lines) > 1 else (lines[0] if lines else type(err).__name__)


def _probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise OSError unless the head's port accepts a TCP connection. `auto`: the cluster
    `ray start` last started here (or RAY_ADDRESS), ConnectionError when there is none."""
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address_or_die

        address = canonicalize_bootstrap_address_or_die("auto")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s):
        pass


def kill_a_worker_next() -> None:
    """Testing hook (`RLANYTHING_FAULT=sigkill-worker:STEP`): the next sharded call's first
    worker kills itself with SIGKILL after its first decoded batch, in the middle of its shard."""
    _state["kill_next"] = True


class EngineWorker:
    """A Ray actor holding one engine per role, loaded on first use and kept until a call names
    other weights; each shard's `PrefixCache` stays here between the calls of one caller."""

    def __init__(self):
        # as the CLI sets it (rlanything/cli.py): a worker's matmuls on its 1 thread then match a
        # local run's on N; `ray start`'s environment, which workers inherit, may lack it
        os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
        self.engines: dict[str, tuple[tuple, Any]] = {}
        self.caches: dict[tuple[str, int], PrefixCache] = {}
        self.cache_key: dict[str, str] = {}  # role -> the caller's cache the kept ones belong to

    def pid(self) -> int:
        return os.getpid()

    def _engine(self, role: str, spec: tuple):
        from rlanything.models.engines.make import make_engine

        if role not in self.engines or self.engines[role][0] != spec:
            self.engines.pop(role, None)  # free the old weights before loading the new
            self.caches = {k: v for k, v in self.caches.items() if k[0] != role}  # KV of old weights
            section, model_dir, precision = spec
            self.engines[role] = (spec, make_engine(section, role, model_dir, precision)[0])
        return self.engines[role][1]

    def _cache(self, role: str, key: str | None, shard: int) -> PrefixCache | None:
        if key is None:
            return None
        if self.cache_key.get(role) != key:  # a new caller: the last one's KV is not needed again
            self.caches = {k: v for k, v in self.caches.items() if k[0] != role}
            self.cache_key[role] = key
        return self.caches.setdefault((role, shard), PrefixCache())

    def generate(self, role: str, spec: tuple, cache_key, shard: int, prompts, row_ids, kwargs, die: bool = False):
        """-> (generations, prompt tokens, reused prompt tokens) of one shard."""
        engine = self._engine(role, spec)
        cache = self._cache(role, cache_key, shard)
        before = (cache.prompt_tokens, cache.reused_tokens) if cache is not None else (0, 0)
        if die:  # the fault hook: dies with rows in flight
            engine.on_batch = lambda n: os.kill(os.getpid(), signal.SIGKILL)
        gens = engine.generate(prompts, prefix_cache=cache, row_ids=row_ids, **kwargs)
        if cache is None:
            return gens, 0, 0
        return gens, cache.prompt_tokens - before[0], cache.reused_tokens - before[1]

    def score(self, role: str, spec: tuple, cache_key, shard: int, prompts, continuations, temperature):
        return self._engine(role, spec).score(
            prompts, continuations, temperature=temperature, prefix_cache=self._cache(role, cache_key, shard)
        )


def _start_worker():
    import ray

    actor = ray.remote(num_cpus=1, max_restarts=0)(EngineWorker).remote()
    return actor, ray.get(actor.pid.remote())


def workers(count: int) -> list:
    """This process's `count` engine actors (started on first use, kept across steps and
    iterations: their engines stay loaded) -> [(actor, pid)]."""
    while len(_state["workers"]) < count:
        _state["workers"].append(_start_worker())
    return _state["workers"][:count]


def shutdown() -> None:
    """End this process's actors and leave the cluster (tests; a process leaving does the same)."""
    import ray

    _state["workers"].clear()
    if ray.is_initialized():
        ray.shutdown()


class RayEngine:
    """A `GenerationEngine` over this process's engine actors: each call is cut into `shards`
    `shard_bounds` slices, shard k played by worker k mod `count`, gathered in order (see the
    module docstring).

    A shard's `PrefixCache` lives on its worker. Every call made with the caller's cache is kept
    here, per shard, until the caller changes: a new worker that replaces a dead one first plays
    them again (their results dropped) to rebuild its shards' caches as they were, so what it
    generates next is what the dead one would have generated, bit for bit."""

    def __init__(
        self, count: int, shards: int, section, role: str, model_dir, precision: str, tokenizer, on_batch=None
    ):
        from transformers import AutoConfig  # a transformers engine's model: the config checks it

        self.count, self.shards, self.role, self.tokenizer = count, shards, role, tokenizer
        self.spec = (section, str(model_dir), precision)
        self.weights = str(model_dir)
        self.eos_ids = eos_ids_of(model_dir, tokenizer)
        self.decodes_choices = full_attention(AutoConfig.from_pretrained(model_dir, local_files_only=True))
        self.on_batch = on_batch or (lambda n: None)
        self._keys: dict[int, tuple[PrefixCache, str]] = {}  # the caller's caches (kept alive: ids stay theirs)
        # the calls made with the current caller's cache, per shard, and the worker (its entry in
        # the pool, (actor, pid): a new one replaces a dead one) that holds each shard's cache:
        # (method, args) to play again on a new worker
        self._calls: tuple[str | None, dict[int, list], dict[int, tuple]] = (None, {}, {})

    def _key(self, cache: PrefixCache | None) -> str | None:
        if cache is None:
            return None
        if id(cache) not in self._keys:
            self._keys[id(cache)] = (cache, uuid.uuid4().hex)
        return self._keys[id(cache)][1]

    def generate(
        self, prompts, *, max_new_tokens, temperature, top_p, seed, prefix_cache=None, choice=None, row_ids=None
    ) -> list[Generation]:
        kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, choice=choice)
        ids = list(row_ids) if row_ids is not None else list(range(len(prompts)))
        key = self._key(prefix_cache)
        die, _state["kill_next"] = _state["kill_next"], False

        def args(shard: int, lo: int, hi: int) -> tuple:
            return (self.role, self.spec, key, shard, prompts[lo:hi], ids[lo:hi], kwargs)

        parts = self._gather(len(prompts), key, "generate", args, die)
        if prefix_cache is not None:
            prefix_cache.prompt_tokens += sum(p[1] for p in parts)
            prefix_cache.reused_tokens += sum(p[2] for p in parts)
        return [gen for part in parts for gen in part[0]]

    def score(self, prompts, continuations, *, temperature, prefix_cache=None) -> list[list[float]]:
        key = self._key(prefix_cache)

        def args(shard: int, lo: int, hi: int) -> tuple:
            return (self.role, self.spec, key, shard, prompts[lo:hi], continuations[lo:hi], temperature)

        return [row for part in self._gather(len(prompts), key, "score", args) for row in part]

    def _submit(self, key: str | None, shard: int, method: str, args: tuple, die: bool = False) -> tuple:
        """Shard `shard`'s call on its worker -> (ObjectRef, the worker, the refs of the replayed
        calls); a worker that does not hold the shard's cache (it replaced the one that did) first
        plays the shard's earlier calls. A worker is its pool entry, compared by identity: pids
        repeat across machines."""
        worker = _state["workers"][shard % self.count]
        actor = worker[0]
        replays = []
        if key is not None:
            if self._calls[0] != key:  # a new caller: the last one's calls are not needed again
                self._calls = (key, {}, {})
            _, calls, holder = self._calls
            if holder.setdefault(shard, worker) is not worker:
                for earlier_method, earlier_args in calls.get(shard, []):  # an actor runs one caller's calls in order
                    replays.append(getattr(actor, earlier_method).remote(*earlier_args))
                holder[shard] = worker
            calls.setdefault(shard, []).append((method, args))
        if method == "generate":
            return actor.generate.remote(*args, die=die), worker, replays
        return getattr(actor, method).remote(*args), worker, replays

    def _gather(self, n: int, key: str | None, method: str, args: Callable, die: bool = False) -> list:
        """Run every shard's call (`args(shard, lo, hi)`) and return the results in shard order;
        a shard whose worker died runs again on a new worker that replaces it. Checks for a stop
        twice a second while shards run."""
        import ray

        workers(self.count)
        bounds = shard_bounds(n, self.shards)
        results: list[Any] = [None] * len(bounds)
        pending = {}  # ref -> (shard, reruns, worker, replayed calls' refs)
        for k, (lo, hi) in enumerate(bounds):
            ref, worker, replays = self._submit(key, k, method, args(k, lo, hi), die=die and k == 0)
            pending[ref] = (k, 0, worker, replays)
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                stopping.check()
                for ref in done:
                    shard, reruns, worker, replays = pending.pop(ref)
                    try:  # the replays ran before the call (done): one that failed fails the step
                        results[shard] = ray.get([*replays, ref])[-1]
                    except (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError) as err:
                        self._replace(shard, reruns, err, bounds, worker)
                        if key is not None:  # the call is played again, after the earlier ones
                            self._calls[1][shard].pop()
                        ref, worker, replays = self._submit(key, shard, method, args(shard, *bounds[shard]))
                        pending[ref] = (shard, reruns + 1, worker, replays)
                        continue
                    self.on_batch(bounds[shard][1] - bounds[shard][0])
        except BaseException:
            for ref in pending:  # a stop or a failure: the other shards' work is not wanted
                ray.cancel(ref)
            raise
        return results

    def _replace(self, shard: int, reruns: int, err: Exception, bounds, worker: tuple) -> None:
        """A new worker in place of the dead one that ran shard `shard` (its pool entry), unless
        a shard it also ran replaced it already."""
        lo, hi = bounds[shard]
        slot = shard % self.count
        what = f"{self.role} shard {shard} (rows {lo}-{hi - 1} of {bounds[-1][1]})"
        if reruns >= MAX_RERUNS:
            raise RuntimeError(f"Ray workers died {reruns + 1} times running {what}: {err}") from err
        if _state["workers"][slot] is not worker:
            return
        pid = worker[1]
        _state["workers"][slot] = _start_worker()
        log.warning(
            "Ray worker %d (pid %d) died running %s: %s; the shard runs again on a new worker (pid %d), "
            "the same rows with the same seeds, after its earlier calls of this step",
            slot,
            pid,
            what,
            type(err).__name__,
            _state["workers"][slot][1],
        )


def make_ray_engine(run, section, role: str, model_dir, precision: str, on_batch=None):
    """The sharded engine of `run.executor: ray` for a model section (as `make_engine` builds a
    local one) -> (engine, tokenizer); joins `run.ray_address` first."""
    connect(run.ray_address)
    tokenizer = load_tokenizer(model_dir)
    engine = RayEngine(run.ray_workers, run.shard_count, section, role, Path(model_dir), precision, tokenizer, on_batch)
    return engine, tokenizer
