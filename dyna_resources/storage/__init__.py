"""Object stores (every byte addressed by an fsspec URL) and, next, the node-local page cache."""
