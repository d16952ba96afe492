"""Layers 1 and 2 on the researcher's machine: task files read into the contract's schema,
checked, and compiled into an instruction; the task's container image."""
