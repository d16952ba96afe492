"""Scripts tcloud runs on the cluster's login node with `python3 -c` (stdlib only)."""
