"""What a researcher does with jobs on the cluster: the agent's job verbs, a shell or exec
in a running job, port forwarding, `tcloud dev`, usage."""
