"""A stop shows as Cancelled in Prefect: a task and the flows around it that a stop left are
marked Cancelled (Prefect's engines record them as Crashed), on the session's real Prefect
server; and the signal handlers: a first signal asks, a second one ends the process at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
from prefect import flow, get_client, task

from rlanything import stopping
from rlanything.tasks.cancellation import api_alive, cancel_noted, stop_signal, stoppable
from rlanything.tasks.common import noting_stops


@task(name="stop-probe")
@noting_stops
def stops_midway() -> None:
    stopping.request(signal.SIGTERM)  # as the signal handler would, during the task's work
    stopping.check()


@flow(name="stop-probe-inner")
@stoppable
def inner() -> None:
    stops_midway()


@flow(name="stop-probe-outer")
@stoppable
def outer() -> None:
    inner()


def states(flow_run_id, timeout: float = 30) -> tuple[str, dict[str, str]]:
    """(flow run state, {task name: state}) once no task of the run is Running any more."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(flow_run_id)
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            found = {t.name.rsplit("-", 1)[0]: t.state.name for t in tasks}
            if "Cancelled" in found.values() or time.monotonic() > deadline:
                return run.state.name, found
            time.sleep(0.3)


def test_a_stopped_task_and_its_flows_end_cancelled_not_crashed(prefect_server):
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    stopping.reset()
    try:
        with pytest.raises(stopping.Stopped) as stopped:
            outer()
        assert stop_signal(stopped.value) == signal.SIGTERM
        assert api_alive()
        assert cancel_noted(signal.SIGTERM)  # what the command line does for the outermost run
    finally:
        stopping.reset()
    with get_client(sync_client=True) as client:
        runs = {
            name: max(
                client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[name]))), key=lambda r: r.created
            )
            for name in ("stop-probe-outer", "stop-probe-inner")
        }
    assert states(runs["stop-probe-outer"].id)[0] == "Cancelled"
    assert states(runs["stop-probe-inner"].id) == ("Cancelled", {"stop-probe": "Cancelled"})
    with get_client(sync_client=True) as client:
        assert "SIGTERM" in client.read_flow_run(runs["stop-probe-inner"].id).state.message


@task(name="unnoted-probe")
def stops_before_its_note() -> None:
    # no noting_stops: a stop that comes while Prefect starts the task, before a noting
    # function runs, leaves the task run without a note (seen once from the UI at rm_score)
    stopping.request(signal.SIGTERM)
    stopping.check()


@flow(name="unnoted-probe-flow")
@stoppable
def unnoted_flow() -> None:
    stops_before_its_note()


def test_a_stopped_task_run_without_its_own_note_ends_cancelled_too(prefect_server):
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    stopping.reset()
    try:
        with pytest.raises(stopping.Stopped):
            unnoted_flow()
        assert cancel_noted(signal.SIGTERM)
    finally:
        stopping.reset()
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["unnoted-probe-flow"])))
    run = max(runs, key=lambda r: r.created)
    assert states(run.id) == ("Cancelled", {"unnoted-probe": "Cancelled"})


@flow(name="heartbeat-probe-child")
def child() -> str:
    from prefect import flow_engine

    return repr(flow_engine._send_heartbeats)


@flow(name="heartbeat-probe-parent")
@stoppable
def parent():
    from prefect import flow_engine

    return flow_engine._send_heartbeats, child(return_state=True)


def test_subflows_of_our_flows_end_without_waiting_for_their_heartbeat_thread(prefect_server):
    """Inside a flow of ours, Prefect's engine starts each subflow's heartbeats with its async
    engine's `join_on_exit=False`; the engine still calls it as it did (the child completes), and
    outside our flows Prefect's own function is back."""
    from prefect import flow_engine

    original = flow_engine._send_heartbeats
    used, state = parent()
    assert used.func is original and used.keywords == {"join_on_exit": False}
    assert state.is_completed() and "join_on_exit=False" in state.result()
    assert flow_engine._send_heartbeats is original


def test_other_exceptions_are_not_stops():
    assert stop_signal(ValueError("x")) is None
    assert stop_signal(KeyboardInterrupt()) == signal.SIGINT
    assert stop_signal(stopping.Stopped(signal.SIGTERM)) == signal.SIGTERM


HANDLERS = textwrap.dedent("""
    import os, signal, sys, time
    from rlanything import stopping
    stopping.install(on_first=lambda s: print("first", s, flush=True), on_second=lambda s: print("second", s, flush=True))
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    time.sleep(0.2)
    print("asked", stopping.requested(), flush=True)
    try:
        stopping.check()
    except stopping.Stopped as stopped:
        print("raised", stopped.signum, flush=True)
    os.kill(os.getpid(), signal.SIGINT)  # the user insists
    time.sleep(30)
    print("still here", flush=True)
""")


@pytest.mark.parametrize("first", ["SIGINT", "SIGTERM"])
def test_the_first_signal_asks_and_the_second_ends_the_process_at_once(first):
    signum = int(getattr(signal, first))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", HANDLERS, first], capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n") == [f"first {signum}", f"asked {signum}", f"raised {signum}", "second 2", ""]
    assert done.returncode == 128 + signal.SIGINT  # the exit code names the signal that ended it
    assert time.monotonic() - started < 20  # not the 30 s sleep
