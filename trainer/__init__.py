"""Training (PyTorch): dataset over manifests, model, optimizer, checkpoints. Not built yet (trainer issue)."""
