"""The two cluster defaults of a job's sbatch line (tacc_contract.sbatch), in a module of
their own: the agent's settings (tacc_agent.config) default to them without loading the
task schema and the plug-in registry, so a verb that needs neither starts without."""

from __future__ import annotations

DEFAULT_TIME_LIMIT = "01:00:00"  # a task that sets no time
CHECKPOINT_SIGNAL_SECONDS = 60  # USR1 this long before the limit
