"""tacc_lab."""
