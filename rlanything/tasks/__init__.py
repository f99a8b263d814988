"""One Prefect task per step of an iteration. Each is thin: read Parquet, call library code,
write Parquet atomically, log it to MLflow, return {"paths": [...], "metrics": {...}}.

Importing this package sets rlanything's Prefect defaults (the user's environment wins), since
Prefect reads its settings when it is first imported; `rlanything.flows` and the CLI import it
first for the same reason. Library code never sets environment variables."""

import os

# A fresh ephemeral Prefect server needs ~17 s on a loaded 2-core machine, just under Prefect's
# 20 s default; and no usage analytics leave the machine.
PREFECT_DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}


def use_prefect_defaults() -> None:
    """Set `PREFECT_DEFAULTS` where the environment does not set them already."""
    for key, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(key, value)


use_prefect_defaults()
