"""Object stores (every byte addressed by an fsspec URL), the node-local page cache and its fsspec
filesystem, prewarm, the second origin and the Alluxio front (docs/storage.md)."""
