"""Local UIs and scheduling: the Prefect server, the MLflow UI server, and `serve`.

`rlanything server start` launches both servers on 127.0.0.1 as detached process groups (SQLite
behind each, logs and PIDs in `<root>/.servers/`), waits until they answer, and returns;
`rlanything serve` registers the training flow as a deployment on that Prefect server and
executes its runs (started from the UI, the CLI or a schedule) until stopped; `rlanything
server stop` ends serve first (a runner whose server vanished hangs), then Prefect, then MLflow.
Without a server (no PREFECT_API_URL) the commands that run flows start Prefect's temporary
one themselves, guarded (`guard_prefect_server`).

MLflow runs with `--workers 1` and `MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false`: ~0.5 GB instead
of ~1.8 GB (measured here). Its backend store is the runs root's `mlflow.db`, the default of every
config under that root.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from functools import partial
from pathlib import Path
from types import SimpleNamespace

from rlanything import procs
from rlanything.patching import swapped

STATE_DIR = ".servers"
SERVICES = ("serve", "prefect", "mlflow")  # stop order


class ServerError(RuntimeError):
    """A server did not start, or a port is taken."""


def state_dir(root: str | Path) -> Path:
    return Path(root).resolve() / STATE_DIR


def read_state(root: str | Path) -> dict[str, dict]:
    """service name -> {"pid", "url", "log", "command"} of what `start`/`serve` recorded."""
    folder = state_dir(root)
    out = {}
    for name in SERVICES:
        path = folder / f"{name}.json"
        if path.exists():
            out[name] = json.loads(path.read_text())
    return out


def record(root: str | Path, name: str, entry: dict) -> None:
    folder = state_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.json.tmp"
    tmp.write_text(json.dumps(entry, indent=2))
    tmp.replace(folder / f"{name}.json")


def forget(root: str | Path, name: str) -> None:
    (state_dir(root) / f"{name}.json").unlink(missing_ok=True)


# ---------------------------------------------------------------- processes


def _is_ours(entry: dict) -> bool:
    """The recorded PID still runs the recorded program (PIDs get reused)."""
    pid = entry["pid"]
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return procs.alive(pid)
    return procs.alive(pid) and entry["marker"] in cmdline


def stop_process(entry: dict, signum: int = signal.SIGTERM, grace: float = 30.0) -> bool:
    """Signal a recorded service (its whole process group when it leads one), wait up to
    `grace` seconds, then SIGKILL what is left. -> True if something was running."""
    if not _is_ours(entry):
        return False
    return procs.stop(entry["pid"], group=entry.get("group", False), grace=grace, signum=signum)


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) != 0


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


# ---------------------------------------------------------------- servers


def server_commands(root: Path, host: str, prefect_port: int, mlflow_port: int, mlflow_uri: str) -> dict[str, dict]:
    """What `start` launches: service -> {command, env, url, health, marker}."""
    python = sys.executable
    return {
        "prefect": {
            "command": [python, "-m", "prefect", "server", "start", "--host", host, "--port", str(prefect_port)],
            "env": {
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_UI_API_URL": f"http://{host}:{prefect_port}/api",
            },
            "url": f"http://{host}:{prefect_port}",
            "health": f"http://{host}:{prefect_port}/api/health",
            "marker": "prefect",
        },
        "mlflow": {
            "command": [
                python,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                mlflow_uri,
                "--artifacts-destination",
                (root / "mlartifacts").as_uri(),
                "--host",
                host,
                "--port",
                str(mlflow_port),
                "--workers",
                "1",
            ],
            "env": {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            "url": f"http://{host}:{mlflow_port}",
            "health": f"http://{host}:{mlflow_port}/health",
            "marker": "mlflow",
        },
    }


def start_servers(
    root: str | Path,
    *,
    host: str = "127.0.0.1",
    prefect_port: int = 4200,
    mlflow_port: int = 5000,
    mlflow_uri: str | None = None,
    timeout: float = 180.0,
) -> dict[str, dict]:
    """Start whichever of Prefect and MLflow is not running yet; wait until both answer.
    -> the state of both. Raises ServerError (after stopping what it started) on failure."""
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    uri = mlflow_uri or f"sqlite:///{(root / 'mlflow.db').as_posix()}"
    state = read_state(root)
    started = []
    for name, spec in server_commands(root, host, prefect_port, mlflow_port, uri).items():
        if name in state and _is_ours(state[name]):
            continue
        port = int(spec["url"].rsplit(":", 1)[1])
        if not _port_free(host, port):
            _stop_all(root, started)
            raise ServerError(f"{name}: port {port} on {host} is in use; pick another with --{name}-port")
        log = state_dir(root) / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                spec["command"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **spec["env"]},
                cwd=root,
                start_new_session=True,  # its own group; detached:
                # not guarded by rlanything.procs, it outlives the CLI until `server stop`
            )
        entry = {
            "pid": proc.pid,
            "group": True,
            "url": spec["url"],
            "health": spec["health"],
            "log": str(log),
            "marker": spec["marker"],
            "command": spec["command"],
        }
        record(root, name, entry)
        started.append(name)
    deadline = time.monotonic() + timeout
    for name, entry in read_state(root).items():
        if name == "serve":
            continue
        while not healthy(entry["health"]):
            if not _is_ours(entry) or time.monotonic() > deadline:
                tail = Path(entry["log"]).read_text(errors="replace")[-2000:]
                _stop_all(root, started)
                raise ServerError(f"{name} did not start (log {entry['log']}):\n{tail}")
            time.sleep(0.5)
    return read_state(root)


def _stop_all(root: Path, names: list[str]) -> None:
    state = read_state(root)
    for name in names:
        if name in state:
            stop_process(state[name])
            forget(root, name)


def stop_servers(root: str | Path) -> list[str]:
    """Stop serve, then Prefect, then MLflow. -> names of the services that were running."""
    stopped = []
    for name, entry in sorted(read_state(root).items(), key=lambda kv: SERVICES.index(kv[0])):
        grace = 60.0 if name == "serve" else 30.0  # serve cancels its flow runs on the way out
        if stop_process(entry, signal.SIGTERM, grace):
            stopped.append(name)
        forget(root, name)
    return stopped


def server_status(root: str | Path) -> list[dict]:
    """One row per recorded service: name, pid, running, answering, url, log."""
    return [
        {
            "name": name,
            "pid": entry["pid"],
            "running": _is_ours(entry),
            "answering": healthy(entry["health"]) if entry.get("health") else None,
            "url": entry.get("url", ""),
            "log": entry.get("log", ""),
        }
        for name, entry in sorted(read_state(root).items(), key=lambda kv: SERVICES.index(kv[0]))
    ]


def prefect_api_url(root: str | Path) -> str | None:
    """PREFECT_API_URL of the Prefect server `start` launched under `root`, if it runs."""
    entry = read_state(root).get("prefect")
    return f"{entry['url']}/api" if entry and _is_ours(entry) else None


# ---------------------------------------------------------------- the temporary server


def guard_prefect_server() -> None:
    """Without PREFECT_API_URL, Prefect starts a temporary server (uvicorn, ~200 MB) on first use,
    which would outlive this process when it is killed (it even ignores SIGTERM). Start it here,
    through Prefect's own class, registered with `procs` the moment it is launched; Prefect keeps
    one instance per port, so the flow then finds this one running and uses it.

    It runs in a session of its own: a terminal's Ctrl-C (SIGINT to the foreground process group)
    would stop it too, and the stopping run still has to mark its runs Cancelled there. Prefect's
    launcher takes no Popen options (nor a setting for them), so for the launch its module sees a
    `subprocess` whose Popen starts a new session (`patching.swapped`)."""
    import prefect.server.api.server as prefect_server
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return
    own_session = SimpleNamespace(Popen=partial(subprocess.Popen, start_new_session=True))

    class GuardedServer(SubprocessASGIServer):
        def _run_uvicorn_command(self):
            with swapped(prefect_server, "subprocess", own_session):
                process = super()._run_uvicorn_command()
            procs.guard(process.pid, group=True)  # uvicorn leads its own group
            return process

    GuardedServer().start()
    if not isinstance(SubprocessASGIServer(), GuardedServer):  # a Prefect upgrade changed the singleton
        raise RuntimeError("Prefect's temporary server is not the one started here")


# ---------------------------------------------------------------- serve


def serve_training(
    root: str | Path,
    *,
    config_path: str,
    overrides: list[str],
    iterations: int | None,
    name: str,
    cron: str | None,
    interval: int | None,
) -> None:
    """Register `rlanything-train/<name>` with these default parameters (editable per run in
    the UI's Custom run) and optional schedule, then execute its runs until SIGTERM/Ctrl-C.
    Needs PREFECT_API_URL in the environment before Prefect is imported."""
    from rlanything.flows.training import train_flow

    record(
        root,
        "serve",
        {
            "pid": os.getpid(),
            "group": False,
            "marker": "rlanything",
            "url": f"{os.environ['PREFECT_API_URL'].removesuffix('/api')}/deployments",
            "command": sys.argv,
            "deployment": f"{train_flow.name}/{name}",
        },
    )
    # A shell's background job (`rlanything serve &` in a script, without job control) starts
    # with SIGINT ignored, and Python then installs no KeyboardInterrupt handler: Ctrl-C or
    # `kill -INT` would leave serve running for good. train, resume and eval install their own
    # handlers (stopping.py); serve relies on Prefect's runner ending on KeyboardInterrupt.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        train_flow.serve(
            name=name,
            parameters={
                "config_path": str(Path(config_path).resolve()),
                "overrides": overrides,
                "iterations": iterations,
            },
            cron=cron,
            interval=interval,
            description="RLAnything training: each iteration is a subflow of seven steps. Parameters: a config "
            "file, `section.key=value` overrides and the number of iterations. Re-running with the same config "
            "resumes the run.",
            tags=["rlanything"],
            limit=1,  # one training run at a time in this process; the run lock refuses a second on one run anyway
            entrypoint_type=_module_entrypoint(),
        )
    finally:
        forget(root, "serve")


def _module_entrypoint():
    """Flow runs import `rlanything.flows.training:train_flow` by module path, from any folder."""
    from prefect.deployments.runner import EntrypointType

    return EntrypointType.MODULE_PATH
