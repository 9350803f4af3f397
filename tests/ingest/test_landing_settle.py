"""Landing waits for a stable file: a file written under its final name (rsync --inplace, an NFS copy,
a recorder) lands once its size and mtime stand still across two listings ``settle_s`` apart, or at
once with its uploader's completion marker; a file the pre gates held back as truncated lands again,
as a new item, when a new version of it appears."""

import os
import shutil
import threading
import time

from dagster import DagsterInstance, build_sensor_context, materialize

from dyna_assets.definitions import defs
from dyna_assets.deployment import embedded_ray
from dyna_assets.ingest.sensors import landing_sensor
from dyna_resources.catalog.registry import TRANSCODED, Registry
from dyna_resources.ingest.batches import inventory_batch
from dyna_resources.ingest.gates import GateConfig
from dyna_resources.ingest.landing import COMPLETION_MARKER, LandingZone
from dyna_resources.ingest.tick import LandingCursor, LandingSettings, landing_tick
from dyna_resources.resources import GatesResource, HomeResource, IngestResource, LadderResource, TranscodeResource

SETTLE = LandingSettings(target_batch_bytes=1 << 40, max_wait_s=0, reconcile_every=0, settle_s=30)


def write(root, key: str, data: bytes, mtime_s: float | None = None):
    p = root / key
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "ab") as f:
        f.write(data)
    if mtime_s is not None:
        os.utime(p, (mtime_s, mtime_s))
    return p


def test_a_file_growing_under_its_final_name_lands_once_after_it_stood_still(tmp_path):
    zone = LandingZone(tmp_path / "landing")
    reg = Registry.sqlite(tmp_path / "r.sqlite")
    t0 = 1_000_000.0
    write(zone.root, "2026-12-05/ep-a.h5", b"x" * 100, mtime_s=t0)
    plan = landing_tick(LandingCursor(), zone, reg, SETTLE, now=t0)
    assert (plan.new_files, plan.settling, reg.counts()["landed_files"]) == (0, 1, 0)
    plan = landing_tick(plan.cursor, zone, reg, SETTLE, now=t0 + 10)  # still, but not for settle_s yet
    assert (plan.new_files, plan.settling) == (0, 1)
    write(zone.root, "2026-12-05/ep-a.h5", b"x" * 100, mtime_s=t0 + 35)  # it grew: the clock starts again
    plan = landing_tick(plan.cursor, zone, reg, SETTLE, now=t0 + 40)
    assert (plan.new_files, plan.settling) == (0, 1)
    plan = landing_tick(plan.cursor, zone, reg, SETTLE, now=t0 + 65)
    assert (plan.new_files, plan.settling) == (0, 1)
    plan = landing_tick(plan.cursor, zone, reg, SETTLE, now=t0 + 71)  # the same size and mtime 31 s apart
    assert (plan.new_files, plan.settling) == (1, 0)
    assert [(f.path, f.bytes) for f in reg.landed(["2026-12-05/ep-a.h5"]).values()] == [("2026-12-05/ep-a.h5", 200)]
    assert [b.files for b in plan.created] == [1]
    plan = landing_tick(plan.cursor, zone, reg, SETTLE, now=t0 + 200)  # landed once
    assert (plan.new_files, plan.settling, reg.counts()["landed_files"]) == (0, 0, 1)
    reg.close()


def test_a_completion_marker_lands_a_file_at_once_and_a_file_that_goes_is_forgotten(tmp_path):
    zone = LandingZone(tmp_path / "landing")
    reg = Registry.sqlite(tmp_path / "r.sqlite")
    write(zone.root, "d/ep-done.h5", b"x" * 10)
    (zone.root / ("d/ep-done.h5" + COMPLETION_MARKER)).touch()
    write(zone.root, "d/ep-gone.h5", b"x" * 10)
    plan = landing_tick(LandingCursor(), zone, reg, SETTLE, now=100.0)
    assert plan.new_files == 1 and list(reg.landed(["d/ep-done.h5"])) == ["d/ep-done.h5"]
    assert set(plan.cursor.settling) == {"d/ep-gone.h5"}
    (zone.root / "d/ep-gone.h5").unlink()  # an uploader that gave up
    plan = landing_tick(plan.cursor, zone, reg, SETTLE, now=200.0)
    assert plan.new_files == 0 and plan.cursor.settling == {}
    # the cursor survives the sensor's JSON round trip with what is settling
    assert LandingCursor.loads(plan.cursor.dumps()) == plan.cursor
    reg.close()


def test_a_truncated_file_held_back_lands_again_as_a_new_item_when_a_new_version_appears(episode_factory, stores):
    whole = episode_factory(episode_id="ep-reup", seed=950, duration_s=1.5)
    key = "2026-12-05/ep-reup.h5"
    dst = stores.landing.root / key
    dst.parent.mkdir(parents=True)
    data = whole.path.read_bytes()
    dst.write_bytes(data[: len(data) // 2])  # half an upload, then the uploader died
    now = time.time()
    plan = landing_tick(LandingCursor(), stores.landing, stores.registry, SETTLE, now=now)
    plan = landing_tick(plan.cursor, stores.landing, stores.registry, SETTLE, now=now + 31)
    (first,) = plan.created
    inventory_batch(first.key, stores, GateConfig())
    (q,) = stores.registry.quarantined(first.key)
    assert q["source_path"] == key and q["stage"] == "pre" and "truncated" in q["reason"]
    plan = landing_tick(plan.cursor, stores.landing, stores.registry, SETTLE, now=now + 60)
    assert plan.relanded == [] and plan.created == []  # the same bytes: nothing to look at again
    shutil.copyfile(whole.path, dst)  # the uploader sends it again, whole, under the same name
    plan = landing_tick(plan.cursor, stores.landing, stores.registry, SETTLE, now=now + 90)
    assert plan.relanded == [] and plan.settling == 1  # a new version: it settles like a new file
    plan = landing_tick(plan.cursor, stores.landing, stores.registry, SETTLE, now=now + 121)
    assert plan.relanded == [key]
    (second,) = plan.created
    assert second.key != first.key and [f.path for f in stores.registry.batch_files(second.key)] == [key]
    assert stores.registry.batch_files(first.key) == []
    inventory_batch(second.key, stores, GateConfig())
    assert stores.registry.quarantined() == []
    (ep,) = stores.registry.episodes(second.key)
    assert (ep["episode_id"], ep["status"], ep["source_bytes"]) == ("ep-reup", "accepted", len(data))


def test_the_landing_sensor_on_a_real_instance_lands_a_slow_upload_once_whole_after_it_stops(tmp_path, episode_factory):
    """An episode written under its final name at ~400 KB/s while the landing sensor ticks on a real
    instance every 0.3 s: nothing is landed while it grows; once it stops it
    is landed once, at its whole size, and the run the sensor requests ingests it."""
    home = tmp_path / "home"
    src = episode_factory(episode_id="ep-slow", seed=960, duration_s=3.0).path
    data = src.read_bytes()
    key = "2026-12-05/ep-slow.h5"
    dst = home / "landing" / key
    dst.parent.mkdir(parents=True)
    (home / "gates.yaml").write_text("# every gate at its default\n")
    (home / "step_ladders.yaml").write_text("# the embedded procedures and thresholds\n")
    ingest = IngestResource(
        home=HomeResource(root=str(home)), target_batch_bytes=1 << 40, max_wait_s=0, settle_s=1.0, units_on="process"
    )
    res = {
        "ingest": ingest,
        "gates": GatesResource(home=ingest.home, file=str(home / "gates.yaml")),
        "transcode": TranscodeResource(workers=1, preset="veryfast", gop_frames=30),
        "ladders": LadderResource(home=ingest.home, file=str(home / "step_ladders.yaml"), pictures=0),
        "ray": embedded_ray(),
    }  # units_on="process": never connected
    chunk, rate = 40_000, 400_000  # bytes a write, bytes a second

    def upload():
        with open(dst, "wb") as f:
            for i in range(0, len(data), chunk):
                f.write(data[i : i + chunk])
                f.flush()
                time.sleep(chunk / rate)

    writer = threading.Thread(target=upload)
    reg = ingest.stores().registry
    requests, cursor, seen_while_growing = [], None, []
    with DagsterInstance.ephemeral() as instance:
        writer.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            growing = writer.is_alive()
            # the sensor's body on a real instance, as tests/dyna_assets do; its requests are resolved against
            # partitions it adds in the same result, which evaluate_tick outside the daemon does not see
            with build_sensor_context(
                instance=instance, cursor=cursor, definitions=defs, resources={"ingest": ingest}
            ) as ctx:
                result = landing_sensor(ctx)
            cursor = result.cursor
            for req in result.dynamic_partitions_requests:
                instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
            requests += result.run_requests
            if growing:
                seen_while_growing.append(reg.counts()["landed_files"])
            elif requests:
                break
            time.sleep(0.3)
        writer.join()
        assert len(seen_while_growing) >= 5 and set(seen_while_growing) == {0}  # never landed mid-upload
        assert [(f.path, f.bytes) for f in reg.landed([key]).values()] == [(key, len(data))]
        (req,) = requests
        assets = [defs.get_assets_def(k) for k in ("raw_episodes", "mcap_episodes")]
        result = materialize(assets, instance=instance, partition_key=req.partition_key, resources=res)
        assert result.success
    assert reg.quarantined() == [] and reg.counts()["landed_files"] == 1
    (ep,) = reg.episodes()
    assert (ep["episode_id"], ep["status"], ep["source_bytes"]) == ("ep-slow", TRANSCODED, len(data))
    reg.close()
