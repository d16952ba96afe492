"""The web dashboard: its per-user server on a login node and the root-side broker it asks."""
