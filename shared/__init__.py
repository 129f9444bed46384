"""onceflow's engine: everything the thin entry points in `functions/` call into."""
