"""Versions stamped on every episode and every materialization.

Bump SCHEMA_VERSION when the MCAP layout or a message schema changes (readers care);
bump PIPELINE_VERSION when transcode code or default settings change (so the episodes
written by the old pipeline become stale and are reprocessed, and only those).
"""

SCHEMA_VERSION = "1.0"
PIPELINE_VERSION = "1.5"  # 1.1: mcap_uri, gate-based quality score, dark frames; 1.2: quality scorers;
# 1.3: step ladders (a new MCAP resets its ladder; the ladder itself is versioned by its segmenter + config);
# 1.4: frozen frames counted by the transcode, a spike statistic that holds up to ~15 % spikes;
# 1.5: x264 "faster", CRF 18.5, trellis and mbtree off (benchmarks encode: fleet rate at equal quality)
