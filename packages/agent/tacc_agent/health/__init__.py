"""Node health: checks, the drain/resume cycle, metrics and node facts."""
