"""`python -m tacc_agent`: what Slurm runs on the nodes (see tacc_agent/cli.py).

`enter` (the step `tcloud shell` and `exec` start on a node) tries its quick way first,
which imports nothing of the full agent (tasks/interactive/quick_enter.py); it execs the
command, or leaves everything to the full agent."""

import sys

from tacc_agent.tasks.interactive.quick_enter import enter_quickly

if not enter_quickly(sys.argv[1:]):
    from tacc_agent.cli import main  # the full agent: every verb, and what enter_quickly left

    sys.exit(main())
