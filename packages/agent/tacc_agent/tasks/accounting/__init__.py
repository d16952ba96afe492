"""What users used: their quota and usage, the ops report, GPU time used."""
