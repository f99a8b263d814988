"""Run untrusted generated code: bubblewrap, resource limits, a wall clock, nothing to steal.

Every run of model-written code goes through `run_program` (one process, stdin in, stdout out)
or `run_tests` (a list of tests -> one pass/fail per test), with the limits of one
`SandboxConfig` (`env.options.sandbox`). The modules, by job: `probe` (what this machine
allows, once per process), `command` (the command line of a run), `supervise` and `keeper` (the
process, its wall clock, and nothing left behind), `program` (one run: files in, outputs out),
`grading` (tests). The layers:

* **bubblewrap** (`bwrap`, Debian's `bubblewrap`; `make system-deps` installs it) builds the
  code's whole view of the machine from an empty root: `/usr` and the interpreter's prefix
  read-only (the interpreter and its standard library; `-I -S`: no site-packages), a private
  `/proc`, a minimal `/dev`, and three private, size-capped tmpfs: the working folder
  (`/sandbox`, the cwd and HOME), `/tmp` and `/dev/shm`. Everything else (`/` itself, `/dev`)
  is read-only; no home folder, no run folder, no checkout, no host `/tmp` exist in there.
  New user, PID, network, IPC, UTS and cgroup namespaces (`--unshare-all`): no network but a
  downed loopback, no host process visible; `--disable-userns`: the code cannot create user
  namespaces; `--as-pid-1`: the code is the init of its PID namespace, so when it exits or is
  killed the kernel kills everything it forked (`setsid()` or not); `--die-with-parent`: when
  bwrap's parent dies, bwrap and the code are SIGKILLed (once both have started: see the
  keeper); `--new-session`: no terminal to inject keystrokes into. The code runs as uid 65534
  inside; files it writes live only in its tmpfs and vanish with it: nothing one program writes
  is visible to another.
* **An unprivileged user outside too**: when we are root, bwrap itself is started as a
  throw-away uid (one of `UID_SLOTS` per process, in turn: runs at the same time get different
  ones, as RLIMIT_NPROC counts a uid's processes; no groups, no capabilities). The kernel
  does not apply RLIMIT_NPROC to root (nor to a user namespace that maps onto root), so the
  process limit would not hold otherwise. That uid must be able to reach the interpreter: when
  ours lies under a folder others cannot enter (pyenv under /root), the system's python3 runs
  the code instead (`runtime().python` says which).
* **Resource limits** set before bwrap starts, inherited by the code: RLIMIT_CPU, RLIMIT_AS (a
  memory bomb gets MemoryError), RLIMIT_FSIZE (largest file, stdout included: output goes to a
  file outside the sandbox), RLIMIT_NPROC (processes and threads of the uid: a fork bomb stops
  forking), RLIMIT_NOFILE, RLIMIT_CORE = 0 and no_new_privs. The tmpfs sizes cap the total
  the code can store (`SandboxConfig.disk_mb` each). util-linux's `setpriv` (uid,
  no_new_privs) and `prlimit` (the limits) apply them after exec: a preexec_fn is unsafe in our
  threaded process.
* **A keeper per run** (keeper.py), a small process of ours between us and the sandbox: a
  child subreaper that, when the run ends, its wall clock runs out, or our process dies in any
  way (SIGKILL and the OOM killer included: it reads end-of-file on a pipe only we hold),
  SIGKILLs and reaps everything below it, orphans included. At the deadline the code is thus
  SIGKILLed with all it started.
* **An empty environment**: only PATH, LANG, HOME and TMPDIR; no inherited tokens or secrets.

Where bwrap cannot run (missing, or user namespaces forbidden), `SandboxConfig.isolation`
decides: `bubblewrap` (the default) refuses to run the code (`SandboxUnavailable`); `weak` runs
it in a plain child process with the same limits, timeout, keeper, empty environment and (as
root) the throw-away uid, in a throw-away folder, but it can then read world-readable files,
write to world-writable folders and use the network: a warning is logged and every result says
`isolation == "weak"` (`run_tests(..., runs=)` counts them; the coding environment keeps that
count in `sandbox_runs`). docs/sandbox.md lists what was tried against both.
"""

from rlanything.envs.sandbox.command import Runtime
from rlanything.envs.sandbox.grading import outputs_match, run_tests
from rlanything.envs.sandbox.probe import SandboxUnavailable, checked_runtime, runtime
from rlanything.envs.sandbox.program import PRIVATE_PREFIX, ProgramResult, run_program, sweep_orphans

__all__ = [
    "PRIVATE_PREFIX",
    "ProgramResult",
    "Runtime",
    "SandboxUnavailable",
    "checked_runtime",
    "outputs_match",
    "run_program",
    "run_tests",
    "runtime",
    "sweep_orphans",
]
