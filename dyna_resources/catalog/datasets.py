"""Dataset registry: named, semantically versioned datasets (``pretrain-mix@2.1.0``).

A dataset version binds a curation spec (name + SHA-256 of its text), the manifest's content
hash (SHA-256 of its Arrow IPC file; the Parquet copy's SHA-256 is recorded beside it) and the
pipeline/schema versions. Training refers to ``name@version``, never to a path. Published
versions are immutable:

- the row (table ``datasets``, in the registry's database) is never updated; publishing the
  same name@version again with identical content is a no-op, with other content an error;
- the manifest files are copied to ``<manifest store>/datasets/<name>/<version>/<sha256>.*``,
  so rebuilding the spec's manifest later cannot change what a published version points to
  (the file name is the hash, so two racing publishers can never overwrite each other's bytes);
- resolving a version hashes both published copies against the hashes recorded at publish and
  refuses a changed or damaged file (:class:`ManifestIntegrityError`), so what a version names is
  what training reads. Versions published before the Parquet hash was recorded check the Arrow
  IPC copy only.

No Dagster here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import fsspec
import yaml
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from dyna_resources.storage.stores import Store
from dyna_resources.versions import PIPELINE_VERSION, SCHEMA_VERSION

from . import schema
from .curation import NAME

# Strict semver 2.0 MAJOR.MINOR.PATCH with an optional pre-release; no build metadata (semver
# ignores it for ordering, so 1.0.0+a and 1.0.0+b would be two "equal" versions).
_IDENT = r"(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)"
SEMVER = re.compile(rf"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-({_IDENT}(?:\.{_IDENT})*))?$")

datasets_table = schema.datasets


class DatasetError(ValueError):
    pass


class ImmutableDatasetError(DatasetError):
    pass


class UnknownDatasetError(DatasetError, LookupError):
    pass


class ManifestIntegrityError(DatasetError):
    """A published manifest file no longer has the SHA-256 recorded when it was published."""


@dataclass(frozen=True)
class DatasetRef:
    name: str
    version: str
    spec_name: str
    spec_sha256: str
    sha256: str  # the manifest's (its Arrow IPC file's)
    arrow_url: str
    parquet_url: str
    pipeline_versions: dict
    schema_version: str
    rows: int
    episodes: int
    segment_hours: float
    published_at: datetime
    notes: str = ""
    parquet_sha256: str | None = None  # None: published before the Parquet copy's hash was recorded

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def as_dict(self) -> dict:
        return {**asdict(self), "published_at": self.published_at.isoformat()}


@dataclass(frozen=True)
class DatasetDiff:
    a: str
    b: str
    episodes_added: list[str]
    episodes_removed: list[str]
    rows_before: int
    rows_after: int
    hours_by_task_before: dict[str, float] = field(default_factory=dict)
    hours_by_task_after: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    def markdown(self, limit: int = 20) -> str:
        tasks = sorted(set(self.hours_by_task_before) | set(self.hours_by_task_after))
        lines = [
            f"**{self.a} → {self.b}**",
            "",
            f"- episodes: +{len(self.episodes_added)} / -{len(self.episodes_removed)}",
            f"- segment rows: {self.rows_before} → {self.rows_after}",
            "",
            "| task | hours before | hours after |",
            "|---|---:|---:|",
        ]
        lines += [
            f"| {t} | {self.hours_by_task_before.get(t, 0.0):.4f} | {self.hours_by_task_after.get(t, 0.0):.4f} |"
            for t in tasks
        ]
        for label, ids in (("added", self.episodes_added), ("removed", self.episodes_removed)):
            if ids:
                more = f" … (+{len(ids) - limit})" if len(ids) > limit else ""
                lines.append(f"\n{label}: {', '.join(ids[:limit])}{more}")
        return "\n".join(lines)


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise DatasetError(f"dataset name {name!r} is invalid: letters, digits, '.', '_', '-' (at most 128)")
    return name


def check_version(version: object) -> str:
    if not isinstance(version, str) or not SEMVER.match(version):
        raise DatasetError(f"dataset version {version!r} is not semver MAJOR.MINOR.PATCH[-prerelease]")
    return version


def semver_key(version: str) -> tuple:
    """Semver precedence: pre-releases sort below their release; numeric identifiers below
    alphanumeric ones, numerically; a shorter identifier list below a longer equal prefix."""
    m = SEMVER.match(version)
    if not m:
        raise DatasetError(f"dataset version {version!r} is not semver MAJOR.MINOR.PATCH[-prerelease]")
    core = tuple(int(x) for x in m.group(1, 2, 3))
    pre = m.group(4)
    if pre is None:
        return (*core, 1, ())
    return (*core, 0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")))


def parse_ref(ref: object) -> tuple[str, str | None]:
    """``name``, ``name@latest`` → (name, None); ``name@1.2.3`` → (name, "1.2.3")."""
    if not isinstance(ref, str) or ref.count("@") > 1:
        raise DatasetError(f"malformed dataset reference {ref!r}: expected name@version or name@latest")
    name, _, version = ref.partition("@")
    if "@" in ref and not version:
        raise DatasetError(f"malformed dataset reference {ref!r}: empty version after '@'")
    check_name(name)
    if version in ("", "latest"):
        return name, None
    return name, check_version(version)


class DatasetRegistry:
    """Dataset versions in the registry's database (``url``), manifest copies under ``store_url``
    (needed to publish only: a published row holds full URLs)."""

    def __init__(self, url: str, store_url: str | None = None):
        self.engine = schema.open_engine(url)
        schema.create_tables(self.engine, [datasets_table])
        self._store_url = store_url

    def close(self) -> None:
        self.engine.dispose()

    @property
    def store(self) -> Store:
        if not self._store_url:
            raise DatasetError("no manifest store given: cannot publish")
        return Store.from_url(self._store_url)

    # ---- publishing ---------------------------------------------------------------------------
    def publish(
        self,
        name: str,
        version: str,
        spec_name: str,
        spec_text: str,
        manifest_sidecar: dict,
        *,
        arrow_url: str,
        parquet_url: str,
        notes: str = "",
    ) -> tuple[DatasetRef, bool]:
        """Publish the manifest at ``arrow_url``/``parquet_url`` (described by its sidecar) as
        name@version. Returns (the version, whether it was new)."""
        check_name(name)
        check_version(version)
        check_name(spec_name)
        sha = manifest_sidecar.get("sha256") if isinstance(manifest_sidecar, dict) else None
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise DatasetError(f"{name}@{version}: manifest sidecar has no valid sha256")
        spec_sha = hashlib.sha256(spec_text.encode()).hexdigest()
        existing = self._get(name, version)
        if existing is not None:
            return self._same_or_refuse(existing, spec_name, spec_sha, sha), False
        stats = manifest_sidecar.get("stats") or {}
        prefix = f"datasets/{name}/{version}/{sha}"
        self._copy_verified(arrow_url, f"{prefix}.arrow", sha, f"{name}@{version}")
        parquet_sha = self._copy_verified(parquet_url, f"{prefix}.parquet", None, f"{name}@{version}")
        sidecar = {
            **manifest_sidecar,
            "dataset": f"{name}@{version}",
            "arrow": self.store.url(f"{prefix}.arrow"),
            "parquet": self.store.url(f"{prefix}.parquet"),
            "parquet_sha256": parquet_sha,
            "sidecar": self.store.url(f"{prefix}.json"),
        }
        self.store.put_bytes(f"{prefix}.json", json.dumps(sidecar, indent=2, sort_keys=True, default=str).encode())
        row = dict(
            name=name,
            version=version,
            spec_name=spec_name,
            spec_sha256=spec_sha,
            manifest_sha256=sha,
            manifest_parquet_sha256=parquet_sha,
            manifest_arrow_url=self.store.url(f"{prefix}.arrow"),
            manifest_parquet_url=self.store.url(f"{prefix}.parquet"),
            pipeline_versions=json.dumps(
                {
                    "code": {"pipeline": PIPELINE_VERSION, "schema": SCHEMA_VERSION},
                    "episodes": {
                        "pipeline": sorted(stats.get("by_pipeline_version", {})),
                        "schema": sorted(stats.get("by_schema_version", {})),
                    },
                },
                sort_keys=True,
            ),
            schema_version=SCHEMA_VERSION,
            rows=int(manifest_sidecar.get("rows", 0)),
            episodes=int(stats.get("episodes", 0)),
            segment_hours=float(stats.get("segment_hours", 0.0)),
            published_at=datetime.now(UTC),
            notes=notes or "",
        )
        try:
            with self.engine.begin() as c:
                c.execute(datasets_table.insert().values(**row))
        except IntegrityError:  # someone published this name@version meanwhile
            existing = self._get(name, version)
            assert existing is not None, "the insert refused: the name@version is there (never deleted)"
            return self._same_or_refuse(existing, spec_name, spec_sha, sha), False
        published = self._get(name, version)
        assert published is not None, "inserted just now (never deleted)"
        return published, True

    def _same_or_refuse(self, existing: DatasetRef, spec_name: str, spec_sha: str, sha: str) -> DatasetRef:
        if (existing.spec_name, existing.spec_sha256, existing.sha256) == (spec_name, spec_sha, sha):
            return existing
        what = [
            w
            for w, a, b in (
                ("spec", existing.spec_name, spec_name),
                ("spec text", existing.spec_sha256, spec_sha),
                ("manifest", existing.sha256, sha),
            )
            if a != b
        ]
        raise ImmutableDatasetError(
            f"dataset {existing.ref} is already published (manifest {existing.sha256[:12]}) and is immutable; "
            f"this publish differs in {', '.join(what)}: publish a new version instead"
        )

    def _copy_verified(self, src_url: str, key: str, sha: str | None, label: str) -> str:
        """Copy ``src_url`` into the store as ``key``, checking its SHA-256 when given (the
        manifest may be rebuilt between reading its sidecar and copying its bytes); returns it."""
        fs, path = fsspec.core.url_to_fs(str(src_url))
        fd, tmp = tempfile.mkstemp(prefix=".dataset-", suffix=Path(key).suffix)
        try:
            digest = hashlib.sha256()
            try:
                with fs.open(path, "rb") as src, os.fdopen(fd, "wb") as dst:
                    while chunk := src.read(8 << 20):
                        digest.update(chunk)
                        dst.write(chunk)
            except FileNotFoundError:
                raise DatasetError(f"{label}: manifest file {src_url} does not exist") from None
            if sha is not None and digest.hexdigest() != sha:
                raise DatasetError(
                    f"{label}: {src_url} has SHA-256 {digest.hexdigest()[:12]}, its sidecar says "
                    f"{sha[:12]} (manifest rebuilt meanwhile?); nothing published"
                )
            self.store.put_file(tmp, key)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return digest.hexdigest()

    # ---- reading ------------------------------------------------------------------------------
    def _get(self, name: str, version: str) -> DatasetRef | None:
        with self.engine.connect() as c:
            row = (
                c.execute(
                    select(datasets_table).where(datasets_table.c.name == name, datasets_table.c.version == version)
                )
                .mappings()
                .first()
            )
        return _ref(row) if row else None

    def versions(self, name: str) -> list[str]:
        """Published versions of ``name``, lowest first (semver order)."""
        check_name(name)
        with self.engine.connect() as c:
            found = c.execute(select(datasets_table.c.version).where(datasets_table.c.name == name)).scalars().all()
        return sorted(found, key=semver_key)

    def names(self) -> list[str]:
        with self.engine.connect() as c:
            return sorted(c.execute(select(datasets_table.c.name).distinct()).scalars().all())

    def resolve(self, ref: str, *, verify: bool = True) -> DatasetRef:
        """The published version ``ref`` names (``name@latest``: the highest). With ``verify``
        (the default), its manifest files are hashed against the hashes recorded at publish:
        :class:`ManifestIntegrityError` names a file that changed."""
        found = self._lookup(ref)
        if verify:
            self.verify(found)
        return found

    def verify(self, ref: DatasetRef) -> None:
        """Hash the published Arrow IPC and Parquet copies of ``ref`` (reading each whole) against
        the SHA-256 recorded at publish; raise :class:`ManifestIntegrityError` naming the file."""
        files = [
            ("Arrow IPC", ref.arrow_url, ref.sha256, "manifest_sha256"),
            ("Parquet", ref.parquet_url, ref.parquet_sha256, "manifest_parquet_sha256"),
        ]
        for kind, url, expected, column in files:
            if expected is None:
                continue
            actual = _sha256_of(url, f"{ref.ref}: {kind} manifest")
            if actual != expected:
                raise ManifestIntegrityError(
                    f"{ref.ref}: {kind} manifest {url} has SHA-256 {actual}, but {expected} was recorded "
                    f"when it was published (datasets.{column}): the published copy was changed or damaged"
                )

    def _lookup(self, ref: str) -> DatasetRef:
        name, version = parse_ref(ref)
        if version is None:
            versions = self.versions(name)
            if not versions:
                raise UnknownDatasetError(f"unknown dataset {name!r}: no version published")
            version = versions[-1]
        found = self._get(name, version)
        if found is None:
            known = self.versions(name)
            if not known:
                raise UnknownDatasetError(f"unknown dataset {name!r}: no version published")
            raise UnknownDatasetError(f"unknown version {name}@{version}; published: {', '.join(known)}")
        return found

    def previous(self, ref: str) -> DatasetRef | None:
        """The highest published version below ``ref``'s, if any (looked up, not verified)."""
        cur = self._lookup(ref)
        lower = [v for v in self.versions(cur.name) if semver_key(v) < semver_key(cur.version)]
        return self._get(cur.name, lower[-1]) if lower else None

    def diff(self, a: str, b: str) -> DatasetDiff:
        """What changed from dataset ``a`` to ``b`` (any two refs, even of different names)."""
        ra, rb = self.resolve(a), self.resolve(b)
        ea, ha, na = _summary(ra.parquet_url)
        eb, hb, nb = _summary(rb.parquet_url)
        return DatasetDiff(
            a=ra.ref,
            b=rb.ref,
            episodes_added=sorted(eb - ea),
            episodes_removed=sorted(ea - eb),
            rows_before=na,
            rows_after=nb,
            hours_by_task_before=ha,
            hours_by_task_after=hb,
        )


def resolve_manifest_url(ref: str, registry_url: str, *, verify: bool = True) -> tuple[str, str]:
    """(immutable Arrow URL, SHA-256) of dataset ``ref``, both of its manifest files verified unless
    ``verify`` is False: a caller that downloads the Arrow file and checks its hash against the one
    returned here (the trainer) need not read it twice."""
    reg = DatasetRegistry(registry_url)
    try:
        found = reg.resolve(ref, verify=verify)
        return found.arrow_url, found.sha256
    finally:
        reg.close()


def _sha256_of(url: str, label: str) -> str:
    fs, path = fsspec.core.url_to_fs(url)
    digest = hashlib.sha256()
    try:
        with fs.open(path, "rb") as f:
            while chunk := f.read(8 << 20):
                digest.update(chunk)
    except FileNotFoundError:
        raise ManifestIntegrityError(f"{label} {url} does not exist (published, then removed?)") from None
    return digest.hexdigest()


def _summary(parquet_url: str) -> tuple[set[str], dict[str, float], int]:
    """Episode ids, segment hours by task, and row count of a manifest."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    fs, path = fsspec.core.url_to_fs(parquet_url)
    with fs.open(path, "rb") as f:
        pf = pq.ParquetFile(f)
        cols = [c for c in ("episode_id", "task", "start_ns", "end_ns") if c in pf.schema_arrow.names]
        table = pf.read(columns=cols)
    episodes = set(pc.unique(table.column("episode_id")).to_pylist()) if "episode_id" in cols else set()
    hours: dict[str, float] = {}
    if {"start_ns", "end_ns"} <= set(cols):
        import pyarrow as pa

        task = (
            table.column("task").cast(pa.large_string())
            if "task" in cols
            else pa.nulls(table.num_rows, pa.large_string())
        )
        dur = pc.subtract(table.column("end_ns"), table.column("start_ns"))
        sums = pa.table({"task": task, "ns": dur}).group_by("task").aggregate([("ns", "sum")])
        hours = {
            str(t): (ns or 0) / 3.6e12
            for t, ns in sorted(
                zip(sums.column("task").to_pylist(), sums.column("ns_sum").to_pylist()), key=lambda kv: str(kv[0])
            )
        }
    return {str(e) for e in episodes}, hours, table.num_rows


def _ref(row) -> DatasetRef:
    published = row["published_at"]
    if published.tzinfo is None:  # SQLite keeps no zone
        published = published.replace(tzinfo=UTC)
    return DatasetRef(
        name=row["name"],
        version=row["version"],
        spec_name=row["spec_name"],
        spec_sha256=row["spec_sha256"],
        sha256=row["manifest_sha256"],
        arrow_url=row["manifest_arrow_url"],
        parquet_url=row["manifest_parquet_url"],
        pipeline_versions=json.loads(row["pipeline_versions"]),
        schema_version=row["schema_version"],
        rows=row["rows"],
        episodes=row["episodes"],
        segment_hours=row["segment_hours"],
        published_at=published,
        notes=row["notes"],
        parquet_sha256=row["manifest_parquet_sha256"],
    )


# ---- declaring and publishing a curation spec's manifest -----------------------------------------
@dataclass(frozen=True)
class DatasetDeclaration:
    """``<curation>/datasets/<spec>.yaml``: the dataset version a spec's current manifest is published as."""

    name: str
    version: str
    notes: str = ""

    @classmethod
    def load(cls, path: Path) -> DatasetDeclaration | None:
        """The declaration at ``path``; None when there is none."""
        if not path.exists():
            return None
        data = yaml.safe_load(path.read_text())
        if (
            not isinstance(data, dict)
            or set(data) - {"name", "version", "notes"}
            or not {"name", "version"} <= set(data)
        ):
            raise DatasetError(f"{path}: expected a mapping with name, version and optional notes")
        return cls(name=str(data["name"]), version=str(data["version"]), notes=str(data.get("notes") or ""))


@dataclass(frozen=True)
class Publication:
    """What publishing a spec's manifest did: the version, whether it was new, and the diff against the
    version before it (None for a dataset's first)."""

    ref: DatasetRef
    new: bool
    previous: DatasetRef | None
    diff: DatasetDiff | None

    def as_metadata(self) -> dict:
        """Plain values; ``diff`` lists at most 100 episodes each way (``n_added``/``n_removed`` count them all)."""
        md: dict = {
            "published": True,
            "new": self.new,
            "dataset": self.ref.ref,
            "sha256": self.ref.sha256,
            "rows": self.ref.rows,
            "episodes": self.ref.episodes,
            "segment_hours": self.ref.segment_hours,
            "arrow": self.ref.arrow_url,
            "pipeline_versions": self.ref.pipeline_versions,
        }
        if self.diff is not None and self.previous is not None:
            d = self.diff.as_dict()
            md["previous"] = self.previous.ref
            md["diff"] = {
                **d,
                "episodes_added": d["episodes_added"][:100],
                "episodes_removed": d["episodes_removed"][:100],
                "n_added": len(self.diff.episodes_added),
                "n_removed": len(self.diff.episodes_removed),
            }
            md["diff_summary"] = self.diff.markdown()
        return md


def publish_manifest(
    registry_url: str, manifests_url: str, spec: str, declared: DatasetDeclaration, spec_text: str
) -> Publication:
    """Publish spec ``spec``'s current manifest (``<manifests_url>/<spec>.arrow``, ``.parquet`` and its
    ``.json`` sidecar) as ``declared``, and diff it against the version before."""
    base = f"{manifests_url.rstrip('/')}/{spec}"
    with fsspec.open(f"{base}.json", "rt") as f:
        sidecar = json.load(f)
    reg = DatasetRegistry(registry_url, manifests_url)
    try:
        ref, new = reg.publish(
            declared.name,
            declared.version,
            spec,
            spec_text,
            sidecar,
            arrow_url=f"{base}.arrow",
            parquet_url=f"{base}.parquet",
            notes=declared.notes,
        )
        previous = reg.previous(ref.ref)
        return Publication(ref, new, previous, reg.diff(previous.ref, ref.ref) if previous else None)
    finally:
        reg.close()
