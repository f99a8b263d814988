"""`run.executor: ray` on a real local Ray cluster (2 worker CPUs, started by the fixture with
`ray start --head --block` in a session of its own, stopped after the module even when a test
fails, no other Ray process touched): the sharded rollout and rm_score write a local run's files
bit for bit when the local run cuts its calls into the same shards (`run.shards: 2`), also with
a Ray worker killed by SIGKILL in the middle of a rollout, or driven through Ray Client; a worker
replaced between two turns rebuilds its shards' KV caches; a cluster that is not there is one
line of error.

What "the same files" means: every column of rollouts.parquet, judgments.parquet (the engine's
log-probs included) and advantages.parquet equal, and the checkpoints byte for byte. Against a
local run in one piece the log-probs differ in their last bits (a row's batch mates change the
attention's summation order: ~1e-6), and the comparison fails.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_resume import cli, finish  # helpers of the resume tests

pytest.importorskip("ray")

from ray._raylet import Config  # noqa: E402

from rlanything.models.engines import ray_engine  # noqa: E402
from rlanything.storage.layout import RunLayout  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny.yaml")
# the local run plays the 2 shards a 2-worker Ray run plays (models/engines/shards.py)
SHARDS = ["run.shards=2"]
COMPARED = ("rollouts", "judgments", "advantages")
CLIENT: dict[str, str] = {}  # a cluster's address -> its Ray Client address (`ray://host:port`)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray cluster of 2 one-CPU workers, small object store -> its address; stopped
    afterwards, whatever happened, without touching any other Ray on the machine: `ray start
    --head --block` runs in a session of its own, and the teardown ends that session's processes
    (SIGTERM to `ray start`, which shuts its node down, then SIGKILL to whatever is left in the
    session), where `ray stop` would stop every Ray process of the machine. Ray 2.60
    authenticates with a token: a fresh one, given to the cluster and this process through the
    environment (an explicit address never picks up ~/.ray/auth_token, and none is written there)."""
    ray_bin = Path(sys.executable).parent / "ray"
    address, client = f"127.0.0.1:{free_port()}", free_port()
    start = [str(ray_bin), "start", "--head", "--block", f"--port={address.split(':')[1]}", "--num-cpus=2"]
    start += [f"--ray-client-server-port={client}"]  # Ray Client's server, for `ray://` addresses
    start += ["--num-gpus=0", "--object-store-memory=150000000", "--include-dashboard=false", "--disable-usage-stats"]
    cluster_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    # Ray's memory monitor kills workers when the machine passes 95% of its memory, which other
    # processes on a shared test machine can cause (seen: two evaluations beside the suite killed
    # both workers twice): off for this cluster, whose workers hold ~0.4 GB each
    cluster_env["RAY_memory_monitor_refresh_ms"] = "0"
    saved = {key: os.environ.get(key) for key in cluster_env}
    os.environ.update(cluster_env)
    Config.initialize("")  # Ray read its auth mode when imported: read it again (as Ray does when it turns auth on)
    log = tmp_path_factory.mktemp("ray") / "ray-start.log"
    with log.open("wb") as out:
        # without MKL's strict mode, as a user's `ray start` would be: the workers set it themselves
        # (else their 1-thread matmuls differ from a local run's on 2 threads: measured)
        env = {key: value for key, value in os.environ.items() if key != "MKL_CBWR"}
        head = subprocess.Popen(start, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True, env=env)
    try:
        wait_for(lambda: "Ray runtime started" in log.read_text() or head.poll() is not None, 120)
        assert head.poll() is None, log.read_text()[-2000:]
        CLIENT[address] = f"ray://127.0.0.1:{client}"
        yield address
    finally:
        ray_engine.shutdown()
        stop_session(head)
        for key, value in saved.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value
        Config.initialize("")


def wait_for(ready, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not ready within {timeout_s} s")
        time.sleep(0.5)


def stop_session(head: subprocess.Popen) -> None:
    """SIGTERM to `ray start --block` (it shuts its node's processes down), then SIGKILL to every
    process still in its session: only this cluster's."""
    head.terminate()
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(head.pid, signal.SIGKILL)
    except ProcessLookupError:  # the session is empty: nothing left
        pass
    head.wait(timeout=30)


def train(root: Path, name: str, overrides: list[str]) -> RunLayout:
    from rlanything.flows.training import train_flow

    result = train_flow(TINY, [f"run.root={root}", f"run.name={name}", "run.seed=3", "run.plots=false", *overrides], 2)
    return RunLayout(Path(result["run_dir"]))


@pytest.fixture(scope="module")
def local_run(prefect_server, tmp_path_factory) -> RunLayout:
    return train(tmp_path_factory.mktemp("ray-local"), "local", SHARDS)


def assert_same_files(ray_run: RunLayout, local: RunLayout) -> None:
    for iteration in (0, 1):
        for name in COMPARED:
            mine = pd.read_parquet(ray_run.iter_dir(iteration) / f"{name}.parquet")
            theirs = pd.read_parquet(local.iter_dir(iteration) / f"{name}.parquet")
            assert list(mine.columns) == list(theirs.columns) and len(mine) == len(theirs) > 0, (name, iteration)
            for column in mine.columns:  # the engine's log-probs too: bit for bit
                pd.testing.assert_series_equal(
                    mine[column], theirs[column], check_exact=True, obj=f"{name}.{column} iter {iteration}"
                )
    files = sorted(p.relative_to(local.run_dir) for p in (local.run_dir / "checkpoints").rglob("*") if p.is_file())
    assert any(p.suffix == ".safetensors" for p in files)
    for path in files:
        assert (ray_run.run_dir / path).read_bytes() == (local.run_dir / path).read_bytes(), path


def test_sharded_run_writes_the_local_files(local_run, ray_cluster, tmp_path):
    ray_run = train(tmp_path, "ray", ["run.executor=ray", f"run.ray_address={ray_cluster}", "run.ray_workers=2"])
    assert_same_files(ray_run, local_run)
    pids = {pid for _, pid in ray_engine.workers(2)}
    assert len(pids) == 2 and os.getpid() not in pids  # two worker processes, not this one


def test_a_killed_worker_is_survived(local_run, ray_cluster, tmp_path, monkeypatch, caplog):
    ray_engine.connect(ray_cluster)
    before = [pid for _, pid in ray_engine.workers(2)]
    monkeypatch.setenv("RLANYTHING_FAULT", "sigkill-worker:rollout@1")
    with caplog.at_level(logging.WARNING, logger=ray_engine.__name__):
        ray_run = train(tmp_path, "ray-kill", ["run.executor=ray", f"run.ray_address={ray_cluster}"])
    died = [r.getMessage() for r in caplog.records if "died" in r.getMessage()]
    assert len(died) == 1 and f"pid {before[0]}" in died[0] and "policy shard 0" in died[0], died
    after = [pid for _, pid in ray_engine.workers(2)]
    assert after[0] != before[0] and after[1] == before[1]  # a new worker took the dead one's place
    with pytest.raises(ProcessLookupError):
        os.kill(before[0], 0)
    assert_same_files(ray_run, local_run)


def test_a_replaced_worker_rebuilds_its_shards_caches(ray_cluster):
    """Two calls share a prefix cache (turn 2's prompts extend turn 1's rows, as a rollout's do),
    cut into 3 shards on 2 workers: worker 0 holds shards 0 and 2. It is killed between the
    turns; its replacement plays turn 1 of both shards again before turn 2, whose samples then
    equal a local `ShardedEngine`'s bit for bit. The comparison can tell: a fresh cache (what a
    replacement would have without the replay) gives other log-probs."""
    from rlanything.config import load_config
    from rlanything.models.engines.generation import PrefixCache
    from rlanything.models.engines.make import make_engine
    from rlanything.models.engines.shards import ShardedEngine
    from rlanything.models.loading import resolve_model_path

    section = load_config(TINY).policy
    model = resolve_model_path(section.model)
    ray_engine.connect(ray_cluster)
    engine, tokenizer = make_engine(section, "policy", model, "fp32")
    local, fresh = ShardedEngine(engine, 3), ShardedEngine(engine, 3)
    remote = ray_engine.RayEngine(2, 3, section, "policy", model, "fp32", tokenizer)
    rng = np.random.default_rng(0)
    turn1 = [rng.integers(5, 200, size=int(rng.integers(6, 12))).tolist() for _ in range(7)]
    sample = dict(max_new_tokens=8, temperature=1.0, top_p=1.0, seed=11)

    def turns(engine, caches: tuple[PrefixCache, PrefixCache], between=lambda: None):
        first = engine.generate(turn1, prefix_cache=caches[0], **sample)
        between()
        turn2 = [p + g.token_ids + [7, 8, 9] for p, g in zip(turn1, first)]
        return first, engine.generate(turn2, prefix_cache=caches[1], **sample)

    kept = PrefixCache()
    want = turns(local, (kept, kept))
    dead = ray_engine.workers(2)[0][1]
    shared = PrefixCache()
    got = turns(remote, (shared, shared), between=lambda: os.kill(dead, signal.SIGKILL))
    assert ray_engine.workers(2)[0][1] != dead  # replaced
    for w, g in zip(want, got):
        assert [x.token_ids for x in w] == [x.token_ids for x in g]
        assert [x.logprobs for x in w] == [x.logprobs for x in g]
    assert (shared.prompt_tokens, shared.reused_tokens) == (kept.prompt_tokens, kept.reused_tokens)
    assert kept.reused_tokens > 0
    cold = turns(fresh, (PrefixCache(), PrefixCache()))  # turn 2 without turn 1's KV
    assert [x.token_ids for x in cold[0]] == [x.token_ids for x in want[0]]
    assert [x.logprobs for x in cold[1]] != [x.logprobs for x in want[1]]


def test_a_ray_client_address_drives_the_same_workers(local_run, ray_cluster, prefect_api_url, tmp_path):
    """`run.ray_address: ray://host:port` (Ray Client: the driver, here a CLI process, is not a
    node of the cluster, as from a laptop) runs the sharded steps on the cluster's workers and
    writes the local run's files. This process's workers hold the cluster's 2 CPUs: they go first."""
    ray_engine.shutdown()
    args = ["train", "-c", TINY, "-n", "2", "--set", f"run.root={tmp_path}", "--set", "run.name=client"]
    args += [
        a
        for o in ["run.seed=3", "run.plots=false", "run.executor=ray", f"run.ray_address={CLIENT[ray_cluster]}"]
        for a in ("--set", o)
    ]
    proc = cli(args, prefect_api_url, again=False)  # the cluster's token in its environment: no other command's
    out = finish(proc)
    assert proc.returncode == 0 and "Traceback" not in out, out[-3000:]
    assert_same_files(RunLayout(tmp_path / "client"), local_run)


def test_an_unreachable_cluster_is_one_line(tmp_path):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    args = ["train", "-c", TINY, "--set", f"run.root={tmp_path}", "--set", "run.executor=ray"]
    args += ["--set", f"run.ray_address={address}"]
    env = {**os.environ, "COLUMNS": "300", "RLANYTHING_FAULT": ""}
    done = subprocess.run([sys.executable, "-m", "rlanything.cli", *args], capture_output=True, text=True, env=env)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: no Ray cluster reachable") and address in lines[0], lines
    assert not (tmp_path / "tiny").exists()  # refused before anything was written
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_failed_client_session_is_asked_again_and_its_reason_shown(monkeypatch, caplog):
    """A Ray Client server that answers but whose per-driver server dies at start (a gRPC fork
    race in Ray's proxy, ray-project/ray#63202: seen here and in CI, some percent of connects) is
    asked again; when every try fails, the one line gives the server's reason, not Ray's header.
    ray.init is replaced by one failing as Ray Client fails (its exception and text): the race
    cannot be caused on demand. The port answers: a real listening socket."""
    import ray

    server_says = "Initialization failure from server:\nTraceback (most recent call last):\n  ...\n"
    answers = [
        ConnectionAbortedError(server_says + "RuntimeError: Starting Ray client server failed."),
        ConnectionAbortedError(server_says + "RuntimeError: Proxy failed to Connect to backend!"),
        None,
    ]

    def init(**kwargs):
        if (answer := answers.pop(0)) is not None:
            raise answer

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_engine, "CLIENT_RETRY_S", 0.0)
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"ray://127.0.0.1:{head.getsockname()[1]}"
        with caplog.at_level(logging.WARNING, logger=ray_engine.__name__):
            ray_engine.connect(address)  # the third try
        assert answers == []
        assert ["try 1 of 3" in m and "Starting Ray client server failed" in m for m in caplog.messages[:1]] == [True]
        assert len(caplog.messages) == 2 and "Proxy failed to Connect" in caplog.messages[1]

        answers[:] = [ConnectionAbortedError(server_says + f"RuntimeError: failed {k}") for k in range(3)]
        with pytest.raises(ray_engine.ClusterUnreachable) as err:
            ray_engine.connect(address)
    line = str(err.value)
    assert answers == [] and "\n" not in line and address in line
    assert "failed 3 times to start a session: RuntimeError: failed 2" in line, line


def test_the_executor_settings_are_checked_and_left_out_of_the_digest():
    from rlanything.config import ConfigError, load_config

    local = load_config(TINY)
    assert (local.run.executor, local.run.ray_address, local.run.ray_workers) == ("local", "auto", 2)
    ray = load_config(TINY, ["run.executor=ray", "run.ray_address=ray://10.0.0.1:10001", "run.ray_workers=8"])
    assert ray.digest() == local.digest()  # a run started locally resumes on a cluster, and back
    assert (local.run.shards, local.run.shard_count, ray.run.shard_count) == (None, 1, 8)  # one per worker
    sharded = load_config(TINY, ["run.shards=3"])
    assert sharded.run.shard_count == 3 and sharded.digest() == local.digest()
    for sharded in ("run.shards=2", "run.executor=ray"):  # vLLM batches as it likes: no shards
        with pytest.raises(ConfigError, match="transformers engines"):
            load_config(TINY, [sharded, "policy.engine=vllm"])
    for bad in ("run.executor=dask", "run.ray_address=10.0.0.1", "run.ray_workers=0", "run.shards=0"):
        with pytest.raises(ConfigError, match=bad.split("=")[0].split(".")[1]):
            load_config(TINY, [bad])
