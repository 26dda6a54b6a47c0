"""Training: `DynamicBatching` (the per-step protocol a user's script drives), the two step
strategies (`sync_steps`, `abs_windows`), the loop (`trainer`), elastic glue, the run's
configuration, the models and the metrics files."""
