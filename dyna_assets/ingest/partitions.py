from dagster import DynamicPartitionsDefinition

# One partition per ingest batch (sortable key such as 20261129T14-000123), added by the landing sensor.
ingest_batches = DynamicPartitionsDefinition(name="ingest_batches")
