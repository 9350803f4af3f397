"""Datasets: a curation spec's manifest published as an immutable name@version."""
