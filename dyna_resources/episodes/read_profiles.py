"""The read profiles a deployment can choose from, by name: the embedded ones below, and any in
``<home>/read_profiles.yaml`` (which may also redefine an embedded name).

The file is a mapping of profile names to profiles, each as :meth:`ReadProfile.as_dict` writes it
(``groups`` may be left out: the embedded topic groups), e.g.::

    t96:
      training_streams: [{name: t96, height: 96, width: 96, gop_frames: 15}]
      read_stream: t96
      output_size: [96, 96]
"""

from __future__ import annotations

from pathlib import Path

import yaml

from .read_profile import TOPIC_GROUPS, ReadProfile
from .training_streams import TrainingStreamSpec


def _training(name: str, size: int) -> ReadProfile:
    """The topic groups, plus one ``size`` x ``size`` training stream of 30-frame GOPs that training reads
    at that size (no resize in the loader)."""
    return ReadProfile(
        name=name,
        groups=TOPIC_GROUPS.groups,
        training_streams=(TrainingStreamSpec(name, size, size, gop_frames=30),),
        read_stream=name,
        output_size=(size, size),
    )


EMBEDDED: dict[str, ReadProfile] = {
    # The archive cameras at full size, area-resized by the loader to the trainer's input (64 x 64).
    "archive": ReadProfile(name="archive", groups=TOPIC_GROUPS.groups, output_size=(64, 64)),
    "t64": _training("t64", 64),  # the embedded default: the demo model's input
    "t128": _training("t128", 128),
    "t224": _training("t224", 224),
}
DEFAULT_READ_PROFILE = "t64"


class ReadProfileError(ValueError):
    """A profile name no one defines, or a profiles file that does not parse."""


def load_profiles(path: Path | None) -> dict[str, ReadProfile]:
    """The embedded profiles, with those of the YAML file ``path`` (when it exists) over them."""
    profiles = dict(EMBEDDED)
    if path is None or not path.is_file():
        return profiles
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ReadProfileError(f"{path}: not YAML: {e}") from None
    if not isinstance(doc, dict):
        raise ReadProfileError(f"{path}: expected a mapping of profile names to profiles")
    for name, body in doc.items():
        if not isinstance(body, dict):
            raise ReadProfileError(f"{path}: profile {name!r}: expected a mapping")
        d = {"groups": TOPIC_GROUPS.as_dict()["groups"], **body, "name": str(name)}
        try:
            profiles[str(name)] = ReadProfile.from_dict(d)
        except (KeyError, TypeError, ValueError) as e:
            raise ReadProfileError(f"{path}: profile {name!r}: {e}") from None
    return profiles


def resolve(name: str, path: Path | None = None) -> ReadProfile:
    """Profile ``name`` (embedded, or defined in ``path``). :raises ReadProfileError: no such profile."""
    profiles = load_profiles(path)
    if name not in profiles:
        where = f" or in {path}" if path is not None else ""
        raise ReadProfileError(
            f"read profile {name!r} is not defined (embedded: {', '.join(EMBEDDED)}{where}); "
            "set DYNA_READ_PROFILE to one of them"
        )
    return profiles[name]
