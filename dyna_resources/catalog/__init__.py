"""System of record (registry); CDC, warehouse and curation follow."""
