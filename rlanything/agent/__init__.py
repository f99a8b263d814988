"""The library the steps call, Prefect-free: what joins the config, the engines (models), the
environments (envs) and the run folder (storage). The multi-turn loop (play.py), the RM's
judging and its roles (judging.py, rm_roles.py), the samples and the updates' jobs
(advantage_rows.py, unit_test_scoring.py, update_data.py), task adaptation (adapt_tasks.py),
held-out evaluation (eval_play.py, eval_judge.py) and a run's context (run_context.py). Each
Prefect task in tasks/ reads its inputs, calls one function here, writes and logs."""
