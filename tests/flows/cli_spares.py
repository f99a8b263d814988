"""CLI subprocesses started before their command is known, so that a test does not wait for one
to import Python, torch, transformers, Prefect and MLflow (7 s on 2 cores, about 20 times in the
suite's resume, stop and experiment tests).

`start(args, options)` is `subprocess.Popen(cli_command(args), **options)`. When a spare started
with the same options is waiting, the command goes to it: the spare already ran the imports a
command makes, then reads its command (arguments and RLANYTHING_FAULT) from stdin and runs
`rlanything.cli.app()` as `python -m rlanything.cli` does. A new spare is started for the next
command at once, in the time the tests spend waiting on this one.

What a spare changes, and so what these tests no longer show: the CLI's own imports happen before
the command is known. `tests/test_cli.py` and `tests/test_quiet.py` still start `python -m
rlanything.cli` cold, as a user does. Only RLANYTHING_FAULT (read when a step starts) and the
leftover tag of the stop tests (which no code reads) may differ between a spare and its command;
any other difference (another variable, working folder or output) starts the command cold.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import uuid

TAG = "RLANYTHING_TEST_TAG"  # inherited by everything a command starts: the stop tests' leftovers
FAULT = "RLANYTHING_FAULT"
# What a spare imports before it knows its command: what `rlanything train`, `resume`, `eval`
# and `experiment` import.
PRELOAD = ("rlanything.cli", "rlanything.flows.training", "rlanything.flows.evaluation", "rlanything.flows.experiment")
SPARE = f"""
import importlib, json, os, sys
for name in {PRELOAD!r}:
    importlib.import_module(name)
line = sys.stdin.readline()
if not line:  # the tests ended without a command for this spare
    sys.exit(0)
command = json.loads(line)
os.environ.update(command["env"])  # the spare was started without a fault
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
sys.argv = [sys.modules["rlanything.cli"].__file__, *command["args"]]
sys.modules["rlanything.cli"].app()
"""

MAX_SPARES = 2  # each holds ~0.4 GB of imported modules; the oldest goes when a third is made
_spares: dict[str, subprocess.Popen] = {}


def cli_command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "rlanything.cli", *args]


def start(args: list[str], options: dict, again: bool = True) -> subprocess.Popen:
    """`rlanything ARGS` with Popen's `options`, by a waiting spare when one matches; its tag
    (`proc.tag`: the TAG variable it was started with, or None) is the one to look for.
    `again=False`: no later command has these options (a folder or a variable of the test's
    own), so no spare is started for one: it would import for nothing beside the command, on the
    same 2 cores, and push out a spare that a later command takes (MAX_SPARES)."""
    key = _key(options)
    if key is None or not (again or key in _spares):  # not one a spare can take: a cold start, as before
        proc = subprocess.Popen(cli_command(args), **options)
        proc.tag = options.get("env", {}).get(TAG)
        return proc
    proc = _spares.pop(key, None) or _spare(options)
    proc.stdin.write(json.dumps({"args": args, "env": _runtime_env(options)}) + "\n")
    proc.stdin.close()
    proc.stdin = None  # as a cold start's: communicate() must not flush it
    if again:
        if len(_spares) >= MAX_SPARES:
            _kill(_spares.pop(next(iter(_spares))))
        _spares[key] = _spare(options)  # the next command's, started while this one runs
    return proc


def _key(options: dict) -> str | None:
    """The options a spare must have been started with (as text), or None when no spare fits:
    output to a pipe, in its own process group, no preexec_fn, an environment."""
    allowed = {"env", "cwd", "text", "stdout", "stderr", "start_new_session"}
    if set(options) - allowed or options.get("stdout") != subprocess.PIPE or "env" not in options:
        return None
    env = {k: v for k, v in options["env"].items() if k not in (TAG, FAULT)}
    rest = {k: str(v) for k, v in options.items() if k != "env"}
    return json.dumps([sorted(env.items()), sorted(rest.items())])


def _runtime_env(options: dict) -> dict[str, str]:
    """What the command sets on top of its spare's environment: its fault, if any."""
    return {k: v for k, v in options["env"].items() if k == FAULT}


def _spare(options: dict) -> subprocess.Popen:
    env = {k: v for k, v in options["env"].items() if k != FAULT} | {TAG: uuid.uuid4().hex}
    proc = subprocess.Popen([sys.executable, "-c", SPARE], **{**options, "env": env, "stdin": subprocess.PIPE})
    proc.tag = env[TAG]
    return proc


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


@atexit.register
def _stop_spares() -> None:
    while _spares:
        _kill(_spares.popitem()[1])
