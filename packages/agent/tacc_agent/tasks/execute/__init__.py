"""Layer 4, execution: the batch step and each node's wrapper, environments, containers."""
