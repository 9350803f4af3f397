"""Ingest engines: landing zone, batch packing, quality gates, per-batch inventory and transcode."""
