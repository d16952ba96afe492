"""Node health checks (issue [6]), one module per subject, each bounded in time and
reading from configurable sysfs/procfs roots so tests run them on fixture trees."""
