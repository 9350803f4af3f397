"""What each asset's pod asks Kubernetes for in production (``dagster-k8s/config`` op tags, read by
the K8s run launcher and executor; ignored by the embedded instance). Sized per step, so no worker
pool is sized for the worst one: transcoding is CPU-bound, manifests need memory for DuckDB's sort,
prewarm and training run on the GPU nodes, whose NVMe holds the page cache."""


def pod(cpu: str, memory: str, *, gpus: int = 0, pool: str = "cpu") -> dict:
    limits = {"memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {
        "dagster-k8s/config": {
            "container_config": {"resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits}},
            "pod_spec_config": {"node_selector": {"dyna/pool": pool}},
        }
    }


INGEST = pod("1", "2Gi")  # inventory and pre gates: I/O bound
TRANSCODE = pod("16", "32Gi")  # a process pool of x264 encoders, one per core
LADDERS = pod("1", "2Gi")  # reads the proprio chunks of each MCAP, never its video
WAREHOUSE = pod("2", "8Gi")
MANIFEST = pod("8", "64Gi")  # DuckDB sorts the segment rows in memory
PREWARM = pod("4", "8Gi", pool="gpu")  # warms the cache of the GPU node it runs on
REPLICA = pod("2", "4Gi")
DATASET = pod("1", "4Gi")  # copies a manifest, diffs two
EVALUATE = pod("4", "16Gi", gpus=1, pool="gpu")
RELEASE = pod("1", "4Gi")
TRAIN = pod("8", "64Gi", gpus=8, pool="gpu")  # the local torchrun launcher; Slurm launchers need far less
