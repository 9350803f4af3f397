"""Ingest sources: one reader per recording format (the legacy HDF5, ROS 2 bags, LeRobot datasets), each
yielding the episode model the transcoder, the gates and the registry use. ``detect`` tells the format
from the content."""
