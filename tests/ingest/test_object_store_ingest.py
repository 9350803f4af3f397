"""Ingest with no shared volume: the landing zone and the MCAPs in an object store (a GCS emulator
and a moto S3 server on 127.0.0.1, started by the tests), through the same tick and partition
engines the Dagster assets run. Episodes are read by staging, MCAPs published with preconditions."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import fsspec
import pytest

from dyna_resources import versions
from dyna_resources.catalog.registry import QUARANTINED, TRANSCODED, Registry
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.ingest.batches import IngestStores
from dyna_resources.ingest.episode_io import QUARANTINE_PREFIX
from dyna_resources.ingest.gates import GateConfig
from dyna_resources.ingest.object_landing import ObjectLandingZone, landing_zone
from dyna_resources.ingest.partitions import UnitJob, ingest_partition
from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick
from dyna_resources.storage.stores import Store
from tests.ingest.test_object_landing import gcs_api  # noqa: F401  (fixture: GCS listing as the service does it)
from tests.storage.test_publish import gcs_preconditions  # noqa: F401  (fixture: GCS preconditions, ditto)

from .conftest import FAST

ALL_IN_ONE = LandingSettings(settle_s=0, target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0)


@dataclass
class Bucket:
    landing: str
    mcap: str
    endpoint: str | None

    def store(self, url: str) -> Store:
        return Store.from_url(url, endpoint_url=self.endpoint)


@pytest.fixture(params=["gs", "s3"])
def bucket(request, monkeypatch) -> Bucket:
    run = f"ingest-{uuid.uuid4().hex[:8]}"
    if request.param == "gs":
        gcs = request.getfixturevalue("gcs")
        request.getfixturevalue("gcs_api")
        request.getfixturevalue("gcs_preconditions")
        return Bucket(gcs.url(f"{run}/raw"), gcs.url(f"{run}/mcap"), None)
    s3 = request.getfixturevalue("s3")
    # what a deployment does: credentials in the environment, never in a URL or a setting
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    return Bucket(s3.url(f"{run}/raw"), s3.url(f"{run}/mcap"), s3.endpoint)


def _ingest(stores: IngestStores, partition: str) -> None:
    gates = GateConfig()
    ingest_partition(partition, UnitJob("pre", stores, gates))
    ingest_partition(partition, UnitJob("post", stores, gates, settings=FAST, workers=2))


def _bag_stores(registry: Registry, zone, bucket: Bucket, tmp_path, topics) -> IngestStores:
    """Stores that read bags from the bucket's landing zone by ``topics`` and publish MCAPs to its bucket."""
    scratch = tmp_path / "scratch"
    return IngestStores(
        registry,
        zone,
        scratch / "mcap",
        scratch / "quarantine",
        mcap_store=bucket.mcap,
        endpoint_url=bucket.endpoint,
        topics=topics,
    )


def test_a_bucket_landing_zone_is_listed_incrementally_and_its_mcaps_published_in_a_bucket(
    bucket, episode_factory, tmp_path
):
    raw = bucket.store(bucket.landing)
    for i in range(2):
        raw.put_file(
            episode_factory(episode_id=f"ep-os{i}", seed=700 + i, duration_s=2.0).path, f"2026-11-29/ep-os{i}.h5"
        )
    raw.put_file(
        episode_factory(fault="truncated", episode_id="ep-os-trunc", seed=709, duration_s=2.0).path,
        "2026-11-29/ep-os-trunc.h5",
    )
    registry = Registry.sqlite(tmp_path / "registry.sqlite")
    zone = landing_zone(bucket.landing, bucket.endpoint)
    assert isinstance(zone, ObjectLandingZone)
    stores = IngestStores(
        registry,
        zone,
        tmp_path / "scratch" / "mcap",
        tmp_path / "scratch" / "quarantine",
        mcap_store=bucket.mcap,
        endpoint_url=bucket.endpoint,
    )
    first = landing_tick(LandingCursor(), zone, registry, ALL_IN_ONE)
    assert (first.listed, first.new_files, len(first.sealed)) == (3, 3, 1)
    _ingest(stores, first.sealed[0].key)
    raw.put_file(episode_factory(episode_id="ep-os2", seed=702, duration_s=2.0).path, "2026-11-30/ep-os2.h5")
    second = landing_tick(first.cursor, zone, registry, ALL_IN_ONE)
    assert (second.listed, second.new_files, len(second.sealed)) == (1, 1, 1)  # only what is new
    _ingest(stores, second.sealed[0].key)

    mcaps = bucket.store(bucket.mcap)
    eps = {e["episode_id"]: e for e in registry.episodes()}
    assert sorted(eps) == ["ep-os0", "ep-os1", "ep-os2"]  # the truncated file never became an episode
    assert [q["source_path"] for q in registry.quarantined()] == ["2026-11-29/ep-os-trunc.h5"]
    for eid, e in eps.items():
        assert e["status"] == TRANSCODED and e["mcap_uri"] == mcaps.url(f"{eid}.mcap") == e["mcap_path"]
        assert e["mcap_version"] == mcaps.info(f"{eid}.mcap").version
        with fsspec.open(e["mcap_uri"], "rb", **_options(bucket)) as f, EpisodeReader(f) as r:
            assert r.metadata()["pipeline_version"] == versions.PIPELINE_VERSION
            assert r.metadata()["source_sha256"] == e["source_sha256"]
    # nothing is left on the node: the MCAPs were published and the staged raw copies removed
    left = [p for p in (tmp_path / "scratch").rglob("*") if p.is_file()]
    assert left == [], left
    # and nothing but the MCAPs is in the bucket (no temporary or partial objects)
    assert sorted(mcaps.ls("")) == sorted(f"{eid}.mcap" for eid in eps)


def test_a_rewrite_never_overwrites_an_mcap_someone_else_replaced(bucket, episode_factory, tmp_path, monkeypatch):
    raw = bucket.store(bucket.landing)
    raw.put_file(episode_factory(episode_id="ep-race", seed=720, duration_s=2.0).path, "2026-11-29/ep-race.h5")
    registry = Registry.sqlite(tmp_path / "registry.sqlite")
    stores = IngestStores(
        registry,
        landing_zone(bucket.landing, bucket.endpoint),
        tmp_path / "s" / "mcap",
        tmp_path / "s" / "quarantine",
        mcap_store=bucket.mcap,
        endpoint_url=bucket.endpoint,
    )
    (partition,) = landing_tick(LandingCursor(), stores.landing, registry, ALL_IN_ONE).sealed
    _ingest(stores, partition.key)
    mcaps = bucket.store(bucket.mcap)
    newer = tmp_path / "newer.mcap"
    newer.write_bytes(b"someone else's newer MCAP")
    mcaps.put_file(newer, "ep-race.mcap")  # another writer replaced it after the registry recorded its version
    foreign = mcaps.info("ep-race.mcap").version
    monkeypatch.setattr(versions, "PIPELINE_VERSION", "9.9-test")  # the episode is stale: it is redone
    report = ingest_partition(partition.key, UnitJob("post", stores, GateConfig(), settings=FAST, workers=1))
    (q,) = report.combined.quarantined
    assert q["episode_id"] == "ep-race" and q["reason"].startswith("not published: ")
    assert mcaps.cat("ep-race.mcap") == b"someone else's newer MCAP" and mcaps.info("ep-race.mcap").version == foreign
    assert q["held_at"] == mcaps.url(f"{QUARANTINE_PREFIX}/ep-race.mcap")  # this run's copy, held in the store
    with fsspec.open(q["held_at"], "rb", **_options(bucket)) as f, EpisodeReader(f) as r:
        assert r.metadata()["pipeline_version"] == "9.9-test"
    assert registry.episode_by_id("ep-race")["status"] == QUARANTINED


def test_an_mcap_published_by_a_killed_attempt_before_its_outcome_is_adopted_not_quarantined(
    bucket, episode_factory, tmp_path
):
    """A worker killed between publishing an episode's MCAP and recording it: the replay writes the same
    bytes (the transcode is deterministic), finds them at the key, checks the content hash and adopts
    the object; an object with other bytes at the key is still held back (the test above)."""
    from dyna_resources.episodes.transcode import transcode_episode
    from dyna_resources.storage.publish import publish_file

    raw = bucket.store(bucket.landing)
    gen = episode_factory(episode_id="ep-adopt", seed=730, duration_s=2.0)
    raw.put_file(gen.path, "2026-12-05/ep-adopt.h5")
    registry = Registry.sqlite(tmp_path / "registry.sqlite")
    stores = IngestStores(
        registry,
        landing_zone(bucket.landing, bucket.endpoint),
        tmp_path / "s" / "mcap",
        tmp_path / "s" / "quarantine",
        mcap_store=bucket.mcap,
        endpoint_url=bucket.endpoint,
    )
    (partition,) = landing_tick(LandingCursor(), stores.landing, registry, ALL_IN_ONE).sealed
    ingest_partition(partition.key, UnitJob("pre", stores, GateConfig()))
    row = registry.episode_by_id("ep-adopt")
    # what the killed attempt did: transcoded with this run's settings and published, nothing recorded
    killed, staged = tmp_path / "killed-attempt.mcap", tmp_path / "killed" / "ep-adopt.h5"
    staged.parent.mkdir()
    staged.write_bytes(gen.path.read_bytes())  # staged under its landed name, as the attempt read it
    transcode_episode(staged, killed, FAST, source_sha256=row["source_sha256"])
    mcaps = bucket.store(bucket.mcap)
    version = publish_file(mcaps, killed, "ep-adopt.mcap", expect="absent").version
    assert registry.episode_by_id("ep-adopt")["status"] == "accepted"
    report = ingest_partition(partition.key, UnitJob("post", stores, GateConfig(), settings=FAST, workers=1))
    assert report.combined.quarantined == [] and report.combined.processed == ["ep-adopt"], [
        q["reason"] for q in report.combined.quarantined
    ]
    row = registry.episode_by_id("ep-adopt")
    assert (row["status"], row["mcap_version"], row["mcap_uri"]) == (TRANSCODED, version, mcaps.url("ep-adopt.mcap"))
    assert mcaps.info("ep-adopt.mcap").version == version  # the object itself, untouched
    assert registry.quarantined() == [] and not list((tmp_path / "s").rglob("*.mcap"))


def _options(bucket: Bucket) -> dict:
    return {"client_kwargs": {"endpoint_url": bucket.endpoint}} if bucket.endpoint else {}


@pytest.fixture(scope="module")
def ray_with_store_env(gcs_emulator, s3_server):
    """A local Ray cluster whose workers see the stores as production's pods do: from the environment
    (the emulator's host, S3 credentials), set before the cluster starts so its workers inherit it."""
    from dyna_resources.ingest.ray_units import ray_cluster

    with pytest.MonkeyPatch.context() as mp:
        for k, v in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            mp.setenv(k, v)
        with ray_cluster("local", num_cpus=2) as cluster:
            yield cluster


def test_the_ingest_assets_run_their_units_on_ray_against_the_buckets(
    ray_with_store_env, bucket, episode_factory, tmp_path
):
    from dagster import DagsterInstance, materialize

    from dyna_assets.definitions import defs
    from dyna_assets.deployment import embedded_ray
    from dyna_resources.resources import GatesResource, HomeResource, IngestResource, TranscodeResource

    raw = bucket.store(bucket.landing)
    for i in range(3):
        raw.put_file(
            episode_factory(episode_id=f"ep-ray{i}", seed=740 + i, duration_s=2.0).path, f"2026-11-29/ep-ray{i}.h5"
        )
    ingest = IngestResource(
        home=HomeResource(root=str(tmp_path / "home")),
        landing_url=bucket.landing,
        mcap_store=bucket.mcap,
        endpoint_url=bucket.endpoint or "",
        scratch_dir=str(tmp_path / "scratch"),
        target_batch_bytes=1,
        partition_bytes=1 << 40,
        max_wait_s=0,
    )  # 3 units, 1 partition
    res = {
        "ingest": ingest,
        "gates": GatesResource(home=ingest.home),
        "ray": embedded_ray(),
        "transcode": TranscodeResource(preset="veryfast", gop_frames=30, unit_memory_gb=0.5),
    }
    stores = ingest.stores()
    (partition,) = landing_tick(LandingCursor(), stores.landing, stores.registry, ingest.landing_settings()).sealed
    assert partition.units == 3
    assets = [defs.get_assets_def(k) for k in ("raw_episodes", "mcap_episodes")]
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("ingest_partitions", [partition.key])
        result = materialize(assets, instance=instance, partition_key=partition.key, resources=res)
    assert result.success
    mcaps = bucket.store(bucket.mcap)
    eps = stores.registry.partition_episodes(partition.key)
    assert sorted(e["episode_id"] for e in eps) == ["ep-ray0", "ep-ray1", "ep-ray2"]
    assert all(e["status"] == TRANSCODED and e["mcap_uri"] == mcaps.url(f"{e['episode_id']}.mcap") for e in eps)
    assert sorted(mcaps.ls("")) == ["ep-ray0.mcap", "ep-ray1.mcap", "ep-ray2.mcap"]


def test_an_unreachable_mcap_store_fails_before_any_work(s3_unreachable_endpoint, tmp_path, monkeypatch):
    from dyna_resources.ingest.landing import LandingZone
    from dyna_resources.storage.stores import StoreUnavailableError

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # the store's own retries, not a test hook
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, "testing")
    (tmp_path / "landing").mkdir()
    stores = IngestStores(
        Registry.sqlite(tmp_path / "r.sqlite"),
        LandingZone(tmp_path / "landing"),
        tmp_path / "m",
        tmp_path / "q",
        mcap_store="s3://nowhere/mcap",
        endpoint_url=s3_unreachable_endpoint,
    )
    with pytest.raises(StoreUnavailableError, match="s3://nowhere/mcap"):
        stores.check()


def test_training_streams_are_backfilled_in_the_bucket_and_never_over_someone_elses_mcap(
    bucket, episode_factory, tmp_path
):
    """The backfill downloads each MCAP pinned to the recorded version, adds the streams and republishes
    with that version as the precondition: an object replaced meanwhile is a conflict, left as it is."""
    from dyna_resources.episodes.read_profile import stream_token
    from dyna_resources.episodes.training_streams import TrainingStreamSpec
    from dyna_resources.ingest.training_backfill import backfill_partition

    raw = bucket.store(bucket.landing)
    for i in range(2):
        raw.put_file(episode_factory(episode_id=f"ep-bf{i}", seed=740 + i, duration_s=2.0).path, f"d/ep-bf{i}.h5")
    registry = Registry.sqlite(tmp_path / "registry.sqlite")
    stores = IngestStores(
        registry,
        landing_zone(bucket.landing, bucket.endpoint),
        tmp_path / "s" / "mcap",
        tmp_path / "s" / "quarantine",
        mcap_store=bucket.mcap,
        endpoint_url=bucket.endpoint,
    )
    (partition,) = landing_tick(LandingCursor(), stores.landing, registry, ALL_IN_ONE).sealed
    _ingest(stores, partition.key)
    mcaps = bucket.store(bucket.mcap)
    mcaps.put_bytes("ep-bf1.mcap", b"someone else's newer MCAP")  # after the registry recorded its version
    spec = TrainingStreamSpec("t32", 32, 32, gop_frames=15, preset="veryfast")
    rep = backfill_partition(partition.key, stores, [spec], workers=2)
    assert rep.added == ["ep-bf0"] and list(rep.conflicts) == ["ep-bf1"] and rep.failed == {}
    e0, e1 = registry.episode_by_id("ep-bf0"), registry.episode_by_id("ep-bf1")
    assert e0["training_streams"] == stream_token(spec) and e0["mcap_version"] == mcaps.info("ep-bf0.mcap").version
    assert e0["mcap_bytes"] == mcaps.info("ep-bf0.mcap").size
    with fsspec.open(e0["mcap_uri"], "rb", **_options(bucket)) as f, EpisodeReader(f) as r:
        assert r.training_streams == {"t32": r.cameras}
    assert e1["training_streams"] is None and mcaps.cat("ep-bf1.mcap") == b"someone else's newer MCAP"
    assert [p for p in (tmp_path / "s").rglob("*") if p.is_file()] == []  # nothing left on the node
    assert sorted(mcaps.ls("")) == ["ep-bf0.mcap", "ep-bf1.mcap"]  # no temporary objects


def test_a_bag_uploaded_to_a_bucket_lands_whole_once_every_file_it_names_is_there(bucket, tmp_path):
    import dataclasses

    import yaml

    from dyna_resources.sources.topic_map import parse
    from tests.sources.bags import BagSpec, topic_map_yaml, write_bag

    spec = BagSpec(duration_s=4.5, pauses=(1.5, 3.0))  # split by its pauses: 3 episodes
    write_bag(tmp_path / "bag-os", spec)
    raw = bucket.store(bucket.landing)
    # an uploader sending metadata.yaml first: the bag is not whole until its storage file is there
    raw.put_file(tmp_path / "bag-os" / "metadata.yaml", "2026-12-07/bag-os/metadata.yaml")
    registry = Registry.sqlite(tmp_path / "registry.sqlite")
    zone = landing_zone(bucket.landing, bucket.endpoint)
    settling = dataclasses.replace(ALL_IN_ONE, settle_s=3600.0)
    first = landing_tick(LandingCursor(), zone, registry, settling, now=1000.0)
    assert (first.listed, first.new_files, first.settling) == (1, 0, 1)
    (storage,) = (tmp_path / "bag-os").glob("*.mcap")
    raw.put_file(storage, f"2026-12-07/bag-os/{storage.name}")
    second = landing_tick(first.cursor, zone, registry, settling, now=1001.0)
    assert (second.new_files, len(second.sealed)) == (1, 1)
    (landed,) = registry.batch_files([u.key for u in registry.partition_units(second.sealed[0].key)])
    assert landed.path == "2026-12-07/bag-os/metadata.yaml"
    assert landed.bytes == sum(p.stat().st_size for p in (tmp_path / "bag-os").iterdir())

    topics = parse(yaml.safe_load(yaml.safe_dump(topic_map_yaml(spec, split={"rule": "gap", "gap_s": 2.0}))), "t")
    stores = _bag_stores(registry, zone, bucket, tmp_path, topics)
    _ingest(stores, second.sealed[0].key)
    eps = {e["episode_id"]: e for e in registry.episodes()}
    assert sorted(eps) == [f"bag-os-{k:03d}" for k in range(3)]
    for eid, e in eps.items():
        assert e["status"] == TRANSCODED and e["source_format"] == "ros2"
        assert e["source_uri"] == raw.url("2026-12-07/bag-os") + f"/#{eid}"
        with fsspec.open(e["mcap_uri"], "rb", **_options(bucket)) as f, EpisodeReader(f) as r:
            assert r.metadata()["source_format"] == "ros2"
            assert r.metadata()["source_sha256"] == e["source_sha256"]
    left = [p for p in (tmp_path / "scratch").rglob("*") if p.is_file()]
    assert left == [], left  # every staged copy of the bag removed


def test_one_episode_of_a_long_bag_is_staged_as_the_chunks_of_its_window(bucket, tmp_path):
    """A worker transcoding one episode of a long bag in a bucket copies what a reader of its log-time
    window needs (a sparse file of the bag's size), not the bag: and reads that episode as from the bag."""
    from mcap.reader import SeekingReader

    from dyna_resources.sources.ros2 import plan_bag, read_member
    from dyna_resources.sources.topic_map import parse
    from tests.sources.bags import BagSpec, topic_map_yaml, write_bag

    spec = BagSpec(width=320, height=240, duration_s=24.0, pauses=(8.0, 16.0))  # ~10 chunks of ~1 MB
    write_bag(tmp_path / "long", spec)
    raw = bucket.store(bucket.landing)
    for p in sorted((tmp_path / "long").iterdir()):
        raw.put_file(p, f"2026-12-07/long/{p.name}")
    topics = parse(topic_map_yaml(spec, split={"rule": "gap", "gap_s": 2.0}), "t")
    first, *_ = plan_bag(tmp_path / "long", topics)
    zone = landing_zone(bucket.landing, bucket.endpoint)
    staged = zone.stage_item("2026-12-07/long/metadata.yaml", tmp_path / "s", log_window=(first.log_lo, first.log_hi))
    (whole,) = (tmp_path / "long").glob("*.mcap")
    part = staged / whole.name
    assert part.stat().st_size == whole.stat().st_size
    with open(whole, "rb") as f:
        chunks = SeekingReader(f).get_summary().chunk_indexes
    ours = [c for c in chunks if c.message_start_time < first.log_hi and c.message_end_time >= first.log_lo]
    assert len(ours) < len(chunks) / 2  # the first of three episodes
    assert part.stat().st_blocks * 512 < whole.stat().st_size / 2  # holes where the other chunks are
    a, b = read_member(tmp_path / "long", topics, first), read_member(staged, topics, first)
    assert {n: list(c.frames) for n, c in b.cameras.items()} == {n: list(c.frames) for n, c in a.cameras.items()}


def test_a_long_sqlite_bag_in_a_bucket_is_staged_once_for_all_its_episodes_workers(bucket, tmp_path, monkeypatch):
    """A SQLite 3 bag cut into episodes cannot be staged by window: the unit stages it once, before its
    workers fork, and each worker reads its episode from that copy (K episodes once staged K times)."""
    import dataclasses

    from dyna_resources.sources.topic_map import parse
    from tests.sources.bags import BagSpec, topic_map_yaml, write_bag

    staged_log = tmp_path / "staged.log"  # appended to by this process and by its forked workers alike
    real_stage = ObjectLandingZone.stage

    def counting_stage(self, key, scratch_dir, **kwargs):
        with open(staged_log, "a") as f:
            f.write(key + "\n")
        return real_stage(self, key, scratch_dir, **kwargs)

    monkeypatch.setattr(ObjectLandingZone, "stage", counting_stage)
    spec = BagSpec(duration_s=4.5, pauses=(1.5, 3.0), storage="sqlite3")  # split by its pauses: 3 episodes
    write_bag(tmp_path / "bag-db", spec)
    raw = bucket.store(bucket.landing)
    for p in sorted((tmp_path / "bag-db").iterdir()):
        raw.put_file(p, f"2026-12-08/bag-db/{p.name}")
    (db,) = (tmp_path / "bag-db").glob("*.db3")
    registry = Registry.sqlite(tmp_path / "registry.sqlite")
    zone = landing_zone(bucket.landing, bucket.endpoint)
    assert not zone.windowable("2026-12-08/bag-db/metadata.yaml")
    tick = landing_tick(LandingCursor(), zone, registry, dataclasses.replace(ALL_IN_ONE, settle_s=0.0), now=1e12)
    (sealed,) = tick.sealed
    topics = parse(topic_map_yaml(spec, split={"rule": "gap", "gap_s": 2.0}), "t")
    stores = _bag_stores(registry, zone, bucket, tmp_path, topics)
    gates = GateConfig()
    ingest_partition(sealed.key, UnitJob("pre", stores, gates))
    pre = staged_log.read_text().splitlines()
    assert pre.count(f"2026-12-08/bag-db/{db.name}") == 1  # the pre gates plan and read it from one copy
    ingest_partition(sealed.key, UnitJob("post", stores, gates, settings=FAST, workers=2))
    post = staged_log.read_text().splitlines()[len(pre) :]
    assert post.count(f"2026-12-08/bag-db/{db.name}") == 1  # once for the 3 episodes' workers, not 3 times
    eps = registry.episodes()
    assert sorted(e["episode_id"] for e in eps) == [f"bag-db-{k:03d}" for k in range(3)]
    assert {e["status"] for e in eps} == {TRANSCODED}
    left = [p for p in (tmp_path / "scratch").rglob("*") if p.is_file()]
    assert left == [], left  # the unit's copy removed once its episodes are done
