"""Layer 3, scheduling: an instruction checked and submitted, the queue tick's
plug-ins and their Slurm actions."""
