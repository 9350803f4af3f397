"""Cluster side: preflight checks (infra.preflight), Slurm templates, Ansible playbook, Dagster deployment."""
