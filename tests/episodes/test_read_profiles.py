"""Read profiles as configuration: the embedded ones, a deployment's file over them, and refusals that
name the file and the field."""

import pytest

from dyna_resources.episodes.read_profile import TOPIC_GROUPS, ReadProfile, carries, stream_token, streams_column
from dyna_resources.episodes.read_profiles import DEFAULT_READ_PROFILE, EMBEDDED, ReadProfileError, resolve
from dyna_resources.episodes.training_streams import TrainingStreamSpec


def test_the_embedded_default_reads_a_training_stream_at_its_own_size():
    p = resolve(DEFAULT_READ_PROFILE)
    assert p.read_stream == "t64" and p.output_size == (64, 64) and p.stream("t64").gop_frames == 30
    assert p.reads == ("cameras", "proprio") and p.groups == TOPIC_GROUPS.groups
    assert resolve("archive").read_stream is None and resolve("archive").stream_token() is None
    assert p.stream_token() == stream_token(p.stream("t64"))


def test_a_file_adds_and_redefines_profiles_and_round_trips(tmp_path):
    f = tmp_path / "read_profiles.yaml"
    f.write_text(
        "t96:\n  training_streams: [{name: t96, height: 96, width: 96, gop_frames: 15}]\n"
        "  read_stream: t96\n  output_size: [96, 96]\n  read_groups: [cameras, proprio]\n"
        "archive: {output_size: [48, 48]}\n"
    )
    p = resolve("t96", f)
    assert p.stream("t96") == TrainingStreamSpec("t96", 96, 96, gop_frames=15)
    assert ReadProfile.from_dict(p.as_dict()) == p
    assert resolve("archive", f).output_size == (48, 48)  # the file's, over the embedded one
    assert resolve("t128", f) == EMBEDDED["t128"]
    # the digest follows every field
    assert len({p.digest, resolve("archive", f).digest, EMBEDDED["archive"].digest}) == 3
    # a profile with nothing but groups reads as it always has (episode metadata, digests)
    assert TOPIC_GROUPS.as_dict().keys() == {"name", "groups"}


@pytest.mark.parametrize(
    "text, why",
    [
        ("t: {read_stream: nope}", "read_stream 'nope' is not one of its training streams"),
        ("t: {read_groups: [lidar]}", "read_groups names unknown groups ['lidar']"),
        ("t: {output_size: [0, 64]}", "output_size must be two positive integers"),
        ("t: {training_streams: [{name: a, height: 33, width: 32}]}", "TrainingStreamSpec.height"),
        ("t: [1, 2]", "profile 't': expected a mapping"),
        ("- a\n- b", "expected a mapping of profile names"),
        ("t: {read_stream: [", "not YAML"),
    ],
)
def test_a_bad_profile_is_refused_naming_the_file_and_the_field(tmp_path, text, why):
    f = tmp_path / "read_profiles.yaml"
    f.write_text(text)
    with pytest.raises(ReadProfileError) as e:
        resolve("t", f)
    assert str(f) in str(e.value) and why in str(e.value)


def test_an_unknown_name_lists_what_is_defined(tmp_path):
    with pytest.raises(ReadProfileError, match="read profile 't999' is not defined .*archive, t64, t128, t224"):
        resolve("t999", tmp_path / "read_profiles.yaml")


def test_stream_tokens_tell_specs_apart():
    a = TrainingStreamSpec("t32", 32, 32, gop_frames=15)
    b = TrainingStreamSpec("t32", 32, 32, gop_frames=5)
    assert stream_token(a) != stream_token(b) and stream_token(a).startswith("t32@")
    column = streams_column([b, a])
    assert column == ",".join(sorted([stream_token(a), stream_token(b)]))
    assert carries(column, stream_token(a)) and not carries(None, stream_token(a))
    assert not carries(stream_token(a) + "x", stream_token(a)) and streams_column([]) is None
