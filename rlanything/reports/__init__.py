"""Human-readable views of a run: plots (matplotlib, Agg) and markdown, written into each
iteration's folder and logged to MLflow. `iteration.write_reports` writes one iteration's."""
