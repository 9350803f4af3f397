"""Write a curated manifest: zstd Parquet (for the store and the warehouse) plus an
uncompressed Arrow IPC copy with fixed-size record batches (what ranks memory-map).

Both are written under temporary names and renamed; the IPC file's SHA-256 is the
manifest's content hash (the ``DataVersion``) and goes into a small JSON sidecar that
loaders verify after a download. DuckDB cannot COPY to Arrow IPC, hence pyarrow here.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

BATCH_ROWS = 64 * 1024


@dataclass(frozen=True)
class ManifestFiles:
    name: str
    parquet: str
    arrow: str
    sidecar: str
    rows: int
    sha256: str  # of the Arrow IPC file
    arrow_bytes: int
    parquet_bytes: int

    def as_dict(self) -> dict:
        return asdict(self)


def write_manifest(table: pa.Table, out_dir: str | Path, name: str, *, batch_rows: int = BATCH_ROWS,
                   extra: dict | None = None) -> ManifestFiles:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # large_string: a >2 GB string column cannot overflow offsets in take()/concat on the reader side
    table = table.cast(pa.schema([pa.field(f.name, pa.large_string() if pa.types.is_string(f.type) else f.type)
                                  for f in table.schema]))
    parquet, arrow, sidecar = out / f"{name}.parquet", out / f"{name}.arrow", out / f"{name}.json"
    tmp = lambda p: p.with_name(f".{p.name}.{os.getpid()}.tmp")  # noqa: E731
    pq.write_table(table, tmp(parquet), compression="zstd", row_group_size=batch_rows * 4)
    with pa.OSFile(str(tmp(arrow)), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
    sha = _sha256(tmp(arrow))
    info = ManifestFiles(name=name, parquet=str(parquet), arrow=str(arrow), sidecar=str(sidecar), rows=table.num_rows,
                         sha256=sha, arrow_bytes=tmp(arrow).stat().st_size, parquet_bytes=tmp(parquet).stat().st_size)
    tmp(sidecar).write_text(json.dumps({**info.as_dict(), **(extra or {})}, indent=2, sort_keys=True))
    for p in (parquet, arrow, sidecar):  # the sidecar last: its presence means the rest is complete
        os.replace(tmp(p), p)
    return info


def _sha256(path: Path, block: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()
