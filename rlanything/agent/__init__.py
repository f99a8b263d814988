"""The agent: the multi-turn loop that joins a generation engine (models) and an environment
(envs), and its greedy evaluation on held-out problems. Library code: no Prefect, no Parquet;
the rollout task calls `rollout.play`, the evaluation tasks `evaluate`."""
