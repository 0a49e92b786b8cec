"""Pipeline planners: placer's ``pipeline`` (cost model, search) and the peers' rows (GPipe, PipeDream, Alpa)."""
