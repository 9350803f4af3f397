"""The post gates on real MCAPs: what `decodable` decodes (every keyframe, a seeded sample of whole
GOPs, or everything), and that a damaged access unit fails where it is decoded."""

import hashlib
import json

import pytest

from dyna_resources.episodes.codec import is_keyframe
from dyna_resources.episodes.mcap_reader import EpisodeReader
from dyna_resources.episodes.topics import STATS_METADATA
from dyna_resources.ingest.gates import GateConfig, GateConfigError
from dyna_resources.ingest.post_gates import check_video, gops_to_decode, post_gates


class Units:
    """A reader that yields given access units: a real stream with one unit changed."""

    def __init__(self, units):
        self.units = units

    def iter_video(self, camera):
        return iter(self.units)


def source_of(path) -> dict:
    with EpisodeReader(path) as r:
        stats = r.metadata(STATS_METADATA)
    return {
        "cameras": json.loads(stats["cameras"]),
        "streams": json.loads(stats["streams"]),
        "bytes_in": 10 * path.stat().st_size,
        "bytes_out": path.stat().st_size,
    }


def test_the_sample_is_exact_and_the_same_on_every_run():
    gops = {"scene_left": 17, "scene_right": 17, "wrist": 17}
    one = gops_to_decode("ep-000123", gops, 1)
    assert sum(len(v) for v in one.values()) == 1 and set(one) == set(gops)
    assert gops_to_decode("ep-000123", gops, 1) == one
    three = gops_to_decode("ep-000123", gops, 3)
    assert sum(len(v) for v in three.values()) == 3
    assert all(g < 17 for v in three.values() for g in v)
    picks = {
        tuple(sorted((c, g) for c, v in gops_to_decode(f"ep-{i:06d}", gops, 1).items() for g in v)) for i in range(40)
    }
    assert len(picks) > 10  # spread over the episode's GOPs, not always the first
    every = {c: set(range(n)) for c, n in gops.items()}
    assert gops_to_decode("ep-000123", gops, 0) == every
    assert gops_to_decode("ep-000123", gops, 51) == every


def test_sampled_decode_reads_every_unit_and_decodes_each_keyframe_and_the_chosen_gop(mcap_fleet):
    paths, _ = mcap_fleet
    with EpisodeReader(paths[0]) as r:
        cam = r.cameras[0]
        everything = check_video(r, cam, None)
        sampled = check_video(r, cam, {2})
        keyframes_only = check_video(r, cam, set())
    # 4 s at 30 Hz in 1 s GOPs
    assert (everything.frames, everything.gops, everything.decoded_frames, everything.decoded_gops) == (120, 4, 120, 4)
    assert (sampled.frames, sampled.gops, sampled.decoded_frames, sampled.decoded_gops) == (120, 4, 30 + 3, 1)
    assert (keyframes_only.decoded_frames, keyframes_only.decoded_gops) == (4, 0)
    assert (sampled.first_ns, sampled.last_ns) == (everything.first_ns, everything.last_ns)


def test_a_damaged_unit_fails_where_it_is_decoded_and_a_damaged_keyframe_always(mcap_fleet):
    paths, _ = mcap_fleet
    with EpisodeReader(paths[0]) as r:
        units = list(r.iter_video(r.cameras[0]))
    cut = lambda i: [(t, au[: len(au) // 2]) if k == i else (t, au) for k, (t, au) in enumerate(units)]
    bad_p = Units(cut(35))  # a P-frame in GOP 1
    with pytest.raises(ValueError, match=r"access unit 35 \(at \d+ ns\), GOP 1"):
        check_video(bad_p, "wrist", None)
    with pytest.raises(ValueError, match="GOP 1"):
        check_video(bad_p, "wrist", {1})
    assert check_video(bad_p, "wrist", {0}).decoded_gops == 1  # the sample's blind spot: GOP 1 is not decoded
    for decode in (None, {0}, set()):
        with pytest.raises(ValueError, match=r"access unit 30 .*GOP 1"):
            check_video(Units(cut(30)), "wrist", decode)  # GOP 1's keyframe
    with pytest.raises(ValueError, match="does not open with a keyframe"):
        check_video(Units(units[1:]), "wrist", set())


def keyframe_digest(units) -> str:
    """The digest a copying transcoder records: blake2b-128 of the keyframes, in order."""
    h = hashlib.blake2b(digest_size=16)
    for _, au in units:
        if is_keyframe(au):
            h.update(au)
    return h.hexdigest()


def test_keyframes_read_back_as_the_bytes_the_transcoder_decoded_are_not_decoded_again(mcap_fleet):
    paths, _ = mcap_fleet
    with EpisodeReader(paths[0]) as r:
        units = list(r.iter_video(r.cameras[0]))
    vouched = keyframe_digest(units)
    keyframes_only = check_video(Units(units), "wrist", set(), vouched)
    assert (keyframes_only.decoded_frames, keyframes_only.vouched_keyframes, keyframes_only.gops) == (0, 4, 4)
    sampled = check_video(Units(units), "wrist", {2}, vouched)  # the sampled GOP is decoded whole all the same
    assert (sampled.decoded_frames, sampled.decoded_gops, sampled.vouched_keyframes) == (30, 1, 3)
    other = check_video(Units(units), "wrist", set(), "0" * 32)  # not the bytes decoded: every keyframe decoded
    assert (other.decoded_frames, other.vouched_keyframes) == (4, 0)
    # a keyframe damaged after the transcoder decoded it: the digest differs, so it is decoded, and fails
    cut = [(t, au[: len(au) // 2]) if k == 30 else (t, au) for k, (t, au) in enumerate(units)]
    with pytest.raises(ValueError, match=r"access unit 30 .*GOP 1"):
        check_video(Units(cut), "wrist", set(), vouched)


def test_post_gates_pass_a_good_mcap_at_any_sample_and_reject_a_bad_setting(mcap_fleet):
    paths, _ = mcap_fleet
    for sample in (0, 1, 2):
        gates = GateConfig.from_mapping({"decodable": {"params": {"sample_gops": sample}}})
        results = {g.gate: g for g in post_gates(paths[1], source_of(paths[1]), gates)}
        assert set(results) == {"decodable", "frame_counts", "durations", "size_sanity"}
        assert all(g.passed for g in results.values()), results
    with pytest.raises(GateConfigError, match="unknown param"):
        GateConfig.from_mapping({"decodable": {"params": {"sample": 1}}})


def test_frame_counts_and_durations_still_count_every_unit_when_the_sample_skips_them(mcap_fleet):
    paths, _ = mcap_fleet
    source = source_of(paths[2])
    cam = next(iter(source["cameras"]))
    source["cameras"][cam] = {
        **source["cameras"][cam],
        "frames": source["cameras"][cam]["frames"] + 1,
        "last_ns": source["cameras"][cam]["last_ns"] + 10**8,
    }
    results = {g.gate: g for g in post_gates(paths[2], source, GateConfig())}
    assert results["decodable"].passed
    assert not results["frame_counts"].passed and f"{cam}: 120 frames, source has 121" in results["frame_counts"].detail
    assert not results["durations"].passed and cam in results["durations"].detail
