"""sinfo/scontrol/squeue/sacct --json parsers on output captured from real 22.05.8, 24.11.5 and
26.05.5 local clusters.

The captures (tests/data/*-<release>.json, made by scripts/capture_slurm_json.py) come from: a job
pinned with ``-w n3 --gres=gpu:g2:1``, two ``--gres=shard:g1:1`` jobs and one ``--gres=gpu:2`` job, all
running on n3 at capture time (sacct: after they completed). tests/test_localcluster.py runs the same
parsers on live output (on every version with ``make test-slurm-newer``).
"""

import json
from pathlib import Path

import pytest

from slurm_horus.errors import InputError
from slurm_horus.slurm import GresItem, parse_sacct, parse_sinfo, parse_squeue
from slurm_horus.slurm.openapi import INFINITE, document_version, job_state, loads, unwrap, words
from slurm_horus.slurm.version import SlurmVersion, support_lines

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


NEWER = ["24.11", "26.05"]
NODE_FILES = [("22.05", "sinfo-22.05.json", "sinfo")] + [(r, f"scontrol-nodes-{r}.json", "scontrol") for r in NEWER]


@pytest.mark.parametrize("release, name, command", NODE_FILES)
def test_nodes_of_every_version_read_the_same(release, name, command):
    nodes = {n.name: n for n in parse_sinfo(load(name), command)}
    n3 = nodes["n3"]
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert n3.state == "mixed" and n3.state_flags == () and n3.cpus == 8 and n3.alloc_cpus == 4
    assert n3.partitions == ("debug",) and n3.features == ()
    assert GresItem("gpu", "g2", 1) in n3.gres and GresItem("shard", "g1", 2) in n3.gres
    assert n3.gpu_indices_in_use() == (0, 1, 2, 3)
    assert nodes["n1"].state == "idle" and nodes["n1"].gpu_indices_in_use() == ()
    assert document_version(loads(load(name), command)).release == release


@pytest.mark.parametrize("release", NEWER)
def test_grouped_sinfo_of_newer_slurm_is_refused_with_what_to_read_instead(release):
    with pytest.raises(InputError, match=f"Slurm {release}.* groups nodes: read them with scontrol --json"):
        parse_sinfo(load(f"sinfo-{release}.json"))


@pytest.mark.parametrize("release", ["22.05"] + NEWER)
def test_squeue_of_every_version_reads_the_same(release):
    jobs = {j.job_id: j for j in parse_squeue(load(f"squeue-{release}.json"))}
    assert {j.state for j in jobs.values()} == {"RUNNING"}
    assert jobs[1].nodes == "n3" and jobs[1].required_nodes == "n3" and jobs[1].gpu_indices() == (2,)
    assert jobs[1].gres_requested == [GresItem("gpu", "g2", 1)]
    assert jobs[2].shard_gpu_indices() == jobs[3].shard_gpu_indices() == (1,) and jobs[2].gpu_indices() == ()
    assert jobs[2].gres_requested == [GresItem("shard", "g1", 1)]
    assert jobs[4].gres_requested == [GresItem("gpu", None, 2)] and jobs[4].gpu_indices() == (0, 3)
    assert [(n, [i for i in items if i.count]) for n, items in jobs[2].gres_by_node()] == [
        ("n3", [GresItem("shard", None, 1, (1,))])]
    assert jobs[1].submit_time > 1.7e9 and jobs[1].start_time >= jobs[1].submit_time
    limit = 525600 if release == "22.05" else 5  # the 22.05 capture ran without --time
    assert jobs[1].time_limit == limit and jobs[1].end_time == jobs[1].start_time + 60 * limit
    assert jobs[1].state_reason == "None"
    prefix = "gres:" if release == "22.05" else "gres/"
    assert jobs[1].tres_per_node == prefix + "gpu:g2:1"


@pytest.mark.parametrize("release", ["22.05"] + NEWER)
def test_sacct_of_every_version_reads_the_same(release):
    jobs = {j.job_id: j for j in parse_sacct(load(f"sacct-{release}.json"))}
    assert {j.state for j in jobs.values()} == {"COMPLETED"}
    assert jobs[1].gpu_indices() == (2,) and jobs[1].gres_counts() == {"gpu": 1, "gpu:g2": 1}
    assert jobs[2].gres_counts() == {"shard": 1} and jobs[2].gpu_indices() == ()
    assert jobs[4].gpu_indices() == (0, 3)
    assert jobs[1].exit_code == 0 and jobs[1].elapsed_s == jobs[1].end_time - jobs[1].start_time > 0


def test_wrapped_numbers_are_unwrapped_in_one_place():
    assert unwrap({"set": True, "infinite": False, "number": 5}) == 5
    assert unwrap({"set": False, "infinite": False, "number": 0}) is None
    assert unwrap({"set": False, "infinite": True, "number": 0}) == INFINITE
    assert unwrap({"set": True, "number": 5, "other": 1}) == {"set": True, "number": 5, "other": 1}
    text = '{"jobs": [{"time": {"limit": {"set": false, "infinite": true, "number": 0}, "start": 3}}]}'
    assert loads(text, "sacct")["jobs"][0]["time"] == {"limit": INFINITE, "start": 3}
    assert loads(json.loads(text), "sacct") == loads(text, "sacct")  # a decoded document reads the same


@pytest.mark.parametrize("value, expected", [
    ("RUNNING", "RUNNING"), (["RUNNING"], "RUNNING"), (["RUNNING", "COMPLETING"], "COMPLETING"),
    (["PENDING", "REQUEUED"], "REQUEUED"), ([], ""), (None, ""),
])
def test_job_state_reads_both_forms_as_2205_printed_it(value, expected):
    assert job_state(value) == expected


def test_node_state_flags_of_newer_slurm():
    doc = json.loads(load("scontrol-nodes-24.11.json"))
    doc["nodes"][0]["state"] = ["IDLE", "DRAIN"]
    node = parse_sinfo(json.dumps(doc), "scontrol")[0]
    assert node.state == "idle" and node.state_flags == ("DRAIN",) and words(["IDLE", "DRAIN"])[1] == "DRAIN"


@pytest.mark.parametrize("text, version", [
    ("slurm-wlm 24.11.5", SlurmVersion(24, 11, 5)), ("slurm 22.05.8\n", SlurmVersion(22, 5, 8)),
    ("26.05", SlurmVersion(26, 5, 0)), ("none", None),
])
def test_versions_parse_and_spell_gres(text, version):
    assert SlurmVersion.parse(text) == version
    if version is not None:
        assert version.gres_prefix == ("gres:" if version < SlurmVersion(23, 2) else "gres/")


def test_support_lines_say_tested_untested_or_unsupported():
    assert support_lines(SlurmVersion(24, 11, 5))[0][0] == "info"
    assert "tested" in support_lines(SlurmVersion(22, 5, 8))[0][1]
    assert support_lines(SlurmVersion(25, 5, 1))[0][0] == "warning"
    assert support_lines(SlurmVersion(21, 8, 8))[0][0] == "error"
    assert support_lines(None)[0][0] == "warning"


def test_an_empty_sacct_answer_of_2205_is_no_error():
    """22.05 answers a window without jobs with errors: [{"error_number": 9003, "description": "Nothing found"}]."""
    empty = {"meta": {}, "errors": [{"description": "Nothing found", "error_number": 9003,
                                     "error": "Nothing found with query", "source": "slurmdb_jobs_get"}], "jobs": []}
    assert parse_sacct(json.dumps(empty)) == []
    with pytest.raises(InputError, match="reported errors"):
        parse_sacct(json.dumps(dict(empty, errors=[{"error_number": 1, "description": "Invalid user"}])))
