"""Training (PyTorch, no Dagster import): loaders over manifests (GOP-aware and random access), the
world-action model, distributed Muon, sharded async checkpoints, the restartable entry point
(``python -m trainer.train``), evaluations and model releases (docs/training.md)."""
