"""A job once submitted: its record, status and verbs, logs, reruns, sweeps."""
