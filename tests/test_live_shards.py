"""Fractional GPUs on the real local cluster (issue 21): 8-shard GPUs (gres.conf ``Count=8``), jobs
asking ``--gres=shard:3`` with plain sbatch; job_submit.lua asks horusd, which places each on one
GPU's free shards exactly where the simulator's scheduling cycle puts the same requests."""

import re
import time

import pytest

from slurm_horus.interference import build_model

from conftest import horusd_sees_now, local_cluster
from shard_packing import packing_by_the_simulators_cycle

pytestmark = pytest.mark.slurm

SLEEP = "#!/bin/sh\nsleep 300\n"


@pytest.fixture(scope="module")
def shard_cluster():
    yield from local_cluster(nodes=2, gpus=4, horus=True, shards_per_gpu=8)


def shards_held(cluster, job_id):
    """(node, GPU index, shards, admin comment) of a running job, read by slurm-horus's squeue reader:
    22.05 prints ``shard:gK:N(IDX:K)``, 24.11+ ``shard:N(0/8,N/8,..)`` (per GPU, by position)."""
    (job,) = [j for j in cluster.queue() if j.job_id == job_id]
    held = [(node, item) for node, items in job.gres_by_node() for item in items
            if item.name == "shard" and item.count > 0]
    assert len(held) == 1 and len(held[0][1].indices) == 1, job
    node, item = held[0]
    return node, item.indices[0], item.count, job.admin_comment or ""


def wait_running(cluster, job_id, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster.job_states([job_id]).get(job_id) == "RUNNING":
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} not running: {cluster.job_states([job_id])}")


def test_eight_shard_jobs_are_packed_as_the_simulators_cycle_says(shard_cluster):
    cluster = shard_cluster
    horusd_sees_now(cluster)
    where = []
    for _ in range(8):
        job_id = cluster.sbatch(["--gres=shard:3", "-J", "third"], SLEEP)
        wait_running(cluster, job_id)
        node, index, count, comment = shards_held(cluster, job_id)
        assert count == 3
        # horusd placed it (its token), on the GPU it pinned: not Slurm's own choice
        assert re.search(rf"horus:h[0-9a-f]+ mode=fraction slowdown=[0-9.]+ class=\S+ gpus={node}:{index}\b",
                         comment), comment
        where.append((node, index))
        time.sleep(0.2)
        horusd_sees_now(cluster)
    expected = packing_by_the_simulators_cycle("horus", [3] * 8, lambda kind: build_model(kind),
                                               nodes=tuple(cluster.node_names()), partition="debug")
    assert where == expected
    assert max(where.count(g) for g in set(where)) * 3 <= 8  # no GPU over its 8 shards
    cluster.cancel_all_jobs()
