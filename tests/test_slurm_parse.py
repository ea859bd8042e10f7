"""sinfo/squeue/sacct --json parsers on output captured from a real 22.05.8 local cluster.

The captures (tests/data/*-22.05.json) come from: a job pinned with ``-w n3 --gres=gpu:g2:1``,
two ``--gres=shard:g1:1`` jobs and one ``--gres=gpu:2`` job, all running on n3 at capture time
(sacct: after they completed). tests/test_localcluster.py runs the same parsers on live output.
"""

import json
from pathlib import Path

import pytest

from slurm_horus.errors import InputError
from slurm_horus.slurm import GresItem, parse_sacct, parse_sinfo, parse_squeue

DATA = Path(__file__).parent / "data"


def load(name):
    return (DATA / name).read_text()


def test_sinfo_nodes_gres_and_used_indices():
    nodes = {n.name: n for n in parse_sinfo(load("sinfo-22.05.json"))}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    n3 = nodes["n3"]
    assert n3.state == "mixed" and n3.cpus == 8 and n3.alloc_cpus == 4
    assert GresItem("gpu", "g2", 1) in n3.gres and GresItem("shard", "g1", 2) in n3.gres
    assert GresItem("gpu", "g2", 1, (2,)) in n3.gres_used
    assert GresItem("shard", "g1", 1, (1,)) in n3.gres_used
    assert n3.gpu_indices_in_use() == (0, 1, 2, 3)
    assert nodes["n1"].gpu_indices_in_use() == ()


def test_squeue_requests_and_allocated_indices():
    jobs = {j.job_id: j for j in parse_squeue(load("squeue-22.05.json"))}
    assert jobs[1].state == "RUNNING" and jobs[1].nodes == "n3" and jobs[1].required_nodes == "n3"
    assert jobs[1].gres_requested == [GresItem("gpu", "g2", 1)]
    assert jobs[1].gpu_indices() == (2,)
    assert jobs[2].shard_gpu_indices() == jobs[3].shard_gpu_indices() == (1,)
    assert jobs[2].gpu_indices() == ()
    assert jobs[4].gres_requested == [GresItem("gpu", None, 2)]
    assert jobs[4].gpu_indices() == (0, 3)
    assert jobs[1].state_reason == "None"  # Slurm's word for "nothing to wait for"


def test_sacct_allocated_gres_and_indices():
    jobs = {j.job_id: j for j in parse_sacct(load("sacct-22.05.json"))}
    assert {j.state for j in jobs.values()} == {"COMPLETED"}
    assert jobs[1].gpu_indices() == (2,) and jobs[1].gres_counts() == {"gpu": 1, "gpu:g2": 1}
    assert jobs[2].gres_counts() == {"shard": 1} and jobs[2].gpu_indices() == ()
    assert jobs[4].gpu_indices() == (0, 3)
    assert jobs[1].exit_code == 0 and jobs[1].elapsed_s == jobs[1].end_time - jobs[1].start_time


@pytest.mark.parametrize("parser, command", [(parse_sinfo, "sinfo"), (parse_squeue, "squeue"),
                                             (parse_sacct, "sacct")])
def test_bad_json_names_the_command(parser, command):
    with pytest.raises(InputError, match=command):
        parser("not json")
    with pytest.raises(InputError, match=command):
        parser(json.dumps({"errors": [], "something": []}))
    with pytest.raises(InputError, match="reported errors"):
        key = {"sinfo": "nodes", "squeue": "jobs", "sacct": "jobs"}[command]
        parser(json.dumps({"errors": ["Invalid user"], key: []}))


def test_bad_gres_in_json_names_the_field():
    data = json.loads(load("squeue-22.05.json"))
    data["jobs"][0]["tres_per_node"] = "gres:gpu:x:y:z"
    with pytest.raises(InputError, match="tres_per_node"):
        parse_squeue(json.dumps(data))
