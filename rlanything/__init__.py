"""rlanything: policy, generative reward model and environment trained together in one
completely dynamic RL loop (RLAnything, arXiv 2602.02488).

Importing the package (or any library module) changes no environment variable: the Prefect
defaults are set by `rlanything.tasks` / `rlanything.flows` / the CLI, before Prefect is
imported, and models load offline through `local_files_only=True`.
"""

__version__ = "0.1.0"
