"""How tcloud reaches the cluster: verified SSH, the connection master that shares it, and
the agent calls that ride on it."""
