"""How the agent starts itself (srun steps, `enter`, a job's owner's halt and resume):
the same interpreter, isolated (-I) from the job's directory and PYTHON* variables."""

from __future__ import annotations

import sys

AGENT = [sys.executable, "-I", "-m", "tacc_agent"]
