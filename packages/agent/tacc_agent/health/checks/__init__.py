"""Node health checks (issue [6]), one module per subject, each bounded in time and
reading from configurable sysfs/procfs roots so tests run them on fixture trees. A check
declares itself in its module as a registry.Check (name, `run(ctx) -> Result`, default-on
flag, metric families); health/catalog.py lists them. This package imports nothing, so
registry.py may use checks.base without a cycle."""
