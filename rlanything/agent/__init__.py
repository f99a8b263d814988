"""The agent: the multi-turn loop that joins a generation engine (models) and an environment
(envs). Library code: no Prefect, no Parquet; the rollout task calls `rollout.play`."""
