"""Human-readable views of a run and its evaluations: plots and markdown."""
