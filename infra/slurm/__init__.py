"""Slurm job templates and the launcher that renders and submits them (no Dagster import)."""
