"""tacc_agent."""
