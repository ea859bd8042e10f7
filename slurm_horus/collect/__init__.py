"""Getting history in: the NVML sampler (per node, spooled, shipped) and the sacct ingest."""
