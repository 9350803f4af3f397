"""Curation: one manifest per curation spec, from one SQL query over the warehouse."""
