"""What both sides call a job's parts: the states `job status` and `job ps` answer, how
many jobs `job ps` lists, and the batch script in its job directory. A module of its own
so that the node daemon, which reads job records and re-submits halted jobs, loads
neither the verb table nor the task schema
(tests/unit/agent/tasks/jobs/test_security_serve_logs.py holds it to its memory budget)."""

from __future__ import annotations

# The states `job status` and `job ps` answer; a job in a final state will not change.
JOB_STATES = ("QUEUED", "PROVISIONING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "HALTED")
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED")
# How many jobs `job ps` lists, the newest, when not given --limit.
PS_LIMIT = 50

# The batch script every job's sbatch runs, in its job directory.
SCRIPT = "job.sh"
