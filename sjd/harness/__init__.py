"""The benchmark harness: the runner, results rows and their provenance, data parallelism, loggers."""
