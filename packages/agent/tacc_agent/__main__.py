"""`python -m tacc_agent`: what Slurm runs on the nodes (see tacc_agent/cli.py)."""

import sys

from tacc_agent.cli import main

sys.exit(main())
