"""The task backend: instructions, scheduling, execution, jobs, store, records,
environments and sweeps."""
