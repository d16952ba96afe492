"""tcloud."""
