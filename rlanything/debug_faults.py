"""A debugging hook, not a feature: `RLANYTHING_FAULT=ACTION:STEP[@ITERATION][:PHASE]` makes a
step (or a held-out evaluation) fail on purpose, so that the resume and stop tests (and a user
trying resume) can kill a run at a chosen point. A no-op unless the variable is set. The step
tasks call `inject_fault` at their start and end (tasks/common.py: step_task); docs/architecture.md,
"Resume", lists the actions."""

from __future__ import annotations

import os
import signal
import time

from rlanything import stopping
from rlanything.models.engines.ray_engine import kill_a_worker_next
from rlanything.pipeline import STEPS

FAULT_ENV = "RLANYTHING_FAULT"


class InjectedFault(RuntimeError):
    """Raised by `RLANYTHING_FAULT=raise:<step>`."""


FAULT_ACTIONS = ("sigkill", "raise", "sigint", "sigterm", "hold", "sigkill-worker")
HOLD_LIMIT_S = 600  # "hold" gives up after this long and lets the step run
FAULT_POINTS = (*STEPS, "eval")  # the steps, and the held-out evaluation of a checkpoint


def parse_fault(spec: str) -> tuple[str, str, int | None, str]:
    """ "ACTION:STEP[@ITERATION][:PHASE]" -> (action, step, iteration or None, phase).

    >>> parse_fault("sigkill:rm_score@1:end")
    ('sigkill', 'rm_score', 1, 'end')
    """
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"{FAULT_ENV}={spec!r}: expected ACTION:STEP[@ITERATION][:PHASE]")
    action, target, phase = parts[0], parts[1], parts[2] if len(parts) == 3 else "start"
    step, _, at = target.partition("@")
    if action not in FAULT_ACTIONS or step not in FAULT_POINTS or phase not in ("start", "end"):
        raise ValueError(
            f"{FAULT_ENV}={spec!r}: ACTION is {'|'.join(FAULT_ACTIONS)}, STEP one of {', '.join(FAULT_POINTS)}, "
            "PHASE start|end"
        )
    return action, step, int(at) if at else None, phase


def inject_fault(step: str, iteration: int, phase: str) -> None:
    """Testing hook, a no-op unless `RLANYTHING_FAULT` is set: "sigkill:rollout" kills this
    process with SIGKILL at the start of the rollout step (like `kill -9`), "raise:verify@1:end"
    raises `InjectedFault` in iteration 1's verify step after it wrote its files, before the step
    logs them and Prefect records its result. "sigint:rm_score@1" sends SIGINT to this process's
    group as a terminal's Ctrl-C does ("sigterm": SIGTERM, as a process manager does) and lets the
    step run on into its work, where the stop check ends it; only for a process in a group of its
    own (`setsid`, `start_new_session`). "hold:rollout@0" keeps the step in progress until a stop
    request ends it (checked every 0.1 s, at most HOLD_LIMIT_S): a step surely running when a
    test cancels the run from outside. PHASE is `start` (default) or `end`; STEP may also be
    `eval`, the held-out evaluation of ITERATION's checkpoint. "sigkill-worker:rollout@1" (with
    `run.executor: ray`) has the step's first sharded generation call kill its first Ray worker
    with SIGKILL in the middle of its shard (`models.engines.ray_engine.kill_a_worker_next`)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    action, at_step, at_iteration, at_phase = parse_fault(spec)
    if (at_step, at_phase) != (step, phase) or at_iteration not in (None, iteration):
        return
    if action == "sigkill-worker":
        kill_a_worker_next()
        return
    if action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action in ("sigint", "sigterm"):
        print(f"injected fault {spec!r}: {action.upper()} to the process group", flush=True)
        os.killpg(os.getpgrp(), signal.SIGINT if action == "sigint" else signal.SIGTERM)
        return
    if action == "hold":
        print(f"injected fault {spec!r}: holding the step until a stop", flush=True)
        deadline = time.monotonic() + HOLD_LIMIT_S
        while time.monotonic() < deadline:
            stopping.check()
            time.sleep(0.1)
        return
    raise InjectedFault(f"injected fault {spec!r} in step {step} of iteration {iteration}")
