"""The contract both sides of a TACC cluster import (and that imports neither): the
task schema, the instruction, the agent protocol, exit codes, the plug-in API."""
