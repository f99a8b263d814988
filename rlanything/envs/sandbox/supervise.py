"""One sandboxed process from start to end: started under its keeper (keeper.py), fed its stdin,
given its wall clock, and gone with everything it started when the run returns or when our
process dies, however it dies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

KEEPER = Path(__file__).with_name("keeper.py")


def run_until_deadline(
    cmd: list[str],
    stdin: str,
    *,
    cwd: str,
    env: dict[str, str],
    fds: dict[str, int],
    wall_s: float,
    outputs: tuple[Path, Path],
) -> tuple[int | None, bool]:
    """Run `cmd` under a keeper in a new session (stdout and stderr to the `outputs` files, the
    `fds` passed on), feed it `stdin` and wait up to `wall_s`; then close our end of the
    keeper's pipe, upon which it SIGKILLs and reaps whatever still runs below it. -> (returncode
    as `cmd`'s, timed_out). A `cmd` that cannot start exits 127, the reason in stderr."""
    watch, hold = os.pipe()  # the keeper reads `watch`; only we hold `hold` (not inherited)
    try:
        with open(outputs[0], "wb") as out, open(outputs[1], "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(KEEPER), str(watch), *cmd],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=env,
                pass_fds=(watch, *fds.values()),
                start_new_session=True,  # Ctrl-C and group kills aimed at us do not reach it
            )
    except BaseException:
        os.close(hold)
        raise
    finally:
        os.close(watch)
    timed_out = False
    try:
        proc.communicate(stdin.encode(), timeout=wall_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        os.close(hold)
        _reap(proc)
    return proc.returncode, timed_out


def _reap(proc: subprocess.Popen) -> None:
    """Wait for the keeper, which exits once nothing runs below it; SIGKILL it should it hang
    (what runs below it then still has bwrap's --die-with-parent, the weak mode nothing)."""
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
