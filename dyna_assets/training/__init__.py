"""Training as a downstream asset: checkpoints per curation spec."""
