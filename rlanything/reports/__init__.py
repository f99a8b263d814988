"""Human-readable views of a run and its evaluations: plots (matplotlib, Agg) and markdown,
written into the run's folders and logged to MLflow. `iteration.write_reports` writes one
iteration's, `eval` an evaluation's."""
