"""The Ray cluster the ingest assets fan their work units out to (dagster-ray resources).

Embedded: a local cluster on this machine (:class:`EmbeddedRay`); production: a KubeRay cluster
per step (``KubeRayInteractiveJob``, see ``deployment.py``). The assets connect only when their
work units run on Ray (``IngestResource.units_on``), so a run that does not need it starts nothing.
"""

from __future__ import annotations

from dagster_ray import LocalRay, RayResource


class EmbeddedRay(LocalRay):
    """dagster-ray's ``LocalRay`` (``ray.init()`` starts a local cluster for the step and stops it
    after), except that a process already connected to Ray keeps its connection: ``make demo`` starts
    one cluster for all its runs. LocalRay calls ``ray.init`` regardless, which refuses a second init."""

    def connect(self, context):
        import ray

        if ray.is_initialized():
            return None  # not ours: cleanup leaves it connected
        return super().connect(context)


def connect_for_units(context, ray: RayResource) -> None:
    """Connect the step to its Ray cluster (created and waited for by the resource's lifecycle, which
    leaves only the connection to the asset: ``Lifecycle(connect=False)``)."""
    import ray as ray_api

    if not ray.connected and not ray_api.is_initialized():
        ray.connect(context)
        context.log.info(f"work units on {ray.display_name}")
