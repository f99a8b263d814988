"""A stopped run shows as Cancelled in Prefect, not Crashed.

A run stops on request in two ways: Ctrl-C or SIGTERM to `rlanything` (the command line's
handler records it and the next check raises `stopping.Stopped`), or a cancellation from the
Prefect UI of a deployment's run (Prefect's runner sends SIGTERM; Prefect's engine raises
`TerminationSignal`). Prefect's engines record a task or flow run that a BaseException leaves
as Crashed. Once the exception has left a run, its engine is done with it, so whoever catches
the exception next marks that run Cancelled through the API: a flow marks the task and flow
runs it started (`stoppable`), the command line marks the outermost flow run (`cancel_noted`).

Prefect is asked only when it answers at once (`api_alive`): after a Ctrl-C its server may be
gone as well, and Prefect's client retries a dead server for minutes.
"""

from __future__ import annotations

import functools
import logging
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

import httpx
from prefect import flow_engine, get_client
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import ObjectNotFound, TerminationSignal
from prefect.states import Cancelled

from rlanything import stopping
from rlanything.patching import swapped

F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger(__name__)

# ("flow" | "task", run id) of runs a stop ended, not yet marked Cancelled: the innermost first
_noted: list[tuple[str, UUID]] = []

# Prefect's sync flow engine joins its heartbeat thread when a flow run ends, and the thread
# sleeps in 1 s steps: every subflow (an iteration, an evaluation, an arm) ended 0.6 s late on
# average, a quarter of a tiny iteration (measured). Its async engine does not wait
# (join_on_exit=False); the subflows a flow of ours starts take that choice: the thread ends on
# its own within a second, and sends nothing once the run's state is final.
_NO_HEARTBEAT_WAIT = functools.partial(flow_engine._send_heartbeats, join_on_exit=False)


def stop_signal(exc: BaseException) -> int | None:
    """The signal behind a stop (`Stopped`, Prefect's `TerminationSignal`, a plain
    KeyboardInterrupt where no handler was installed), or None for any other exception."""
    if isinstance(exc, stopping.Stopped):
        return exc.signum
    if isinstance(exc, TerminationSignal):
        return exc.signal
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGINT
    return None


def is_stop(exc: BaseException) -> bool:
    return stop_signal(exc) is not None


def note_task_run() -> None:
    """Inside a task that a stop is leaving: remember its run for `cancel_noted`."""
    context = TaskRunContext.get()
    if context is not None and context.task_run is not None:
        _noted.append(("task", context.task_run.id))


def note_flow_run() -> None:
    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None:
        _noted.append(("flow", context.flow_run.id))


def stoppable(fn: F) -> F:
    """Decorate a flow's function (under `@flow`): a stop that passes through it marks the runs
    it started Cancelled and notes its own run for its caller. It also answers SIGTERM with the
    command line's stop handler again (Prefect's engine swaps in its own for each flow run), and
    the subflows it starts end without waiting for their heartbeat thread (`_NO_HEARTBEAT_WAIT`)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        stopping.reclaim_sigterm()
        try:
            with swapped(flow_engine, "_send_heartbeats", _NO_HEARTBEAT_WAIT):
                return fn(*args, **kwargs)
        except BaseException as exc:
            if is_stop(exc):
                note_unnoted_task_runs()
                cancel_noted(stop_signal(exc))
                note_flow_run()
            raise

    return run  # type: ignore[return-value]


def note_unnoted_task_runs(wait_s: float = 1.0) -> None:
    """Note the task runs of this flow run that a stop left Running, Pending or Crashed without
    their own note: a stop that came while Prefect was starting a task, before its function ran
    (seen with a cancellation from the UI at the start of rm_score). Task states reach the server
    as events, so it looks twice, `wait_s` apart. Never raises."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None or not api_alive():
        return
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    try:
        with get_client(sync_client=True) as client:
            for attempt in range(2):
                if attempt:
                    time.sleep(wait_s)
                runs = client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[context.flow_run.id]))
                )
                noted = {run_id for _, run_id in _noted}
                _noted.extend(("task", r.id) for r in runs if r.id not in noted and _unfinished(r))
    except Exception as err:
        logger.warning("could not read the stopped flow run's task runs: %s: %s", type(err).__name__, err)


def _unfinished(task_run) -> bool:
    return task_run.state is not None and task_run.state.type.value in ("RUNNING", "PENDING", "CRASHED")


def api_url() -> str | None:
    """The Prefect API this process talks to: PREFECT_API_URL, or its temporary server."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return PREFECT_API_URL.value()
    server = SubprocessASGIServer()  # Prefect keeps one per port: the one it started, if any
    return server.api_url if server.running else None


def api_alive(timeout: float = 2.0) -> bool:
    """True if the Prefect API answers its health check within `timeout` seconds."""
    url = api_url()
    if url is None:
        return False
    try:
        return httpx.get(f"{url.rstrip('/')}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def cancel_noted(signum: int | None = None, wait_s: float = 5.0) -> bool:
    """Mark the noted runs Cancelled (forced: a run's engine already left it Crashed) and forget
    them. -> False if Prefect did not answer or refused (the runs keep the state their engines
    gave them; a warning says so). Never raises: it runs while a stop unwinds.

    Task runs reach the server as events, a moment after the fact: a task run the server does
    not know yet is retried for up to `wait_s` seconds. Its Crashed event, if processed later,
    does not override the newer Cancelled state (the server keeps the latest by timestamp)."""
    runs = list(_noted)
    _noted.clear()
    if not runs:
        return True
    if not api_alive():
        logger.warning("Prefect did not answer: %d stopped run(s) keep the state Crashed or Running", len(runs))
        return False
    name = signal.Signals(signum).name if signum else "a stop request"
    message = f"Stopped by {name}; finished steps are kept and resume skips them."
    try:
        with get_client(sync_client=True) as client:
            for kind, run_id in runs:
                _set_cancelled(client, kind, run_id, message, time.monotonic() + wait_s)
    except Exception as err:
        logger.warning("could not mark the stopped runs Cancelled in Prefect: %s: %s", type(err).__name__, err)
        return False
    return True


def _set_cancelled(client, kind: str, run_id: UUID, message: str, deadline: float) -> None:
    if kind == "flow":
        client.set_flow_run_state(run_id, Cancelled(message=message), force=True)
        return
    while True:
        try:
            client.set_task_run_state(run_id, Cancelled(message=message), force=True)
            return
        except ObjectNotFound:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
