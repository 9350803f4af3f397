"""Cluster side: preflight checks, Slurm templates, Ansible playbook, Dagster deployment. Not built yet (cluster issue)."""
