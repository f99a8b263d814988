"""Prefect flows: one flow per iteration, and the training flow that runs N of them.

`rlanything.tasks` is imported first: it sets rlanything's Prefect defaults before Prefect is."""

import rlanything.tasks  # noqa: F401  (Prefect defaults, before any flow module imports prefect)
