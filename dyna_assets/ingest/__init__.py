"""Ingest: landing sensor → raw_episodes → mcap_episodes, per ingest-batch partition."""
