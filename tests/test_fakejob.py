"""Fake GPU jobs that feel interference (``horus fake-job``): the rule, and real jobs on the local cluster."""

import re
import subprocess
import sys
import time

import pytest

from slurm_horus.collect.nvml import StandinBackend
from slurm_horus.localcluster.chroot import slurm_install
from slurm_horus.sim.fakejob import OOM_EXIT, FakeJob, gpu_rate, job_rate, job_script, solo_util
from slurm_horus.sim.truth import load_truth

TRUTH = load_truth("gavel:v100")
# a bad pair: resnet50-bs64 keeps 0.69 of its speed next to lm-bs20, which keeps 0.38
BAD = ("resnet50-bs64", "lm-bs20")
# A fake job is `python -m slurm_horus fake-job`; a chroot's Slurm (make test-slurm-newer) runs job
# scripts inside the chroot, where slurm-horus is not installed (a site installs it on its nodes).
in_slurm_chroot = pytest.mark.skipif(slurm_install().root is not None,
                                     reason="job scripts run inside the Slurm chroot, which has no slurm-horus")

OOM_PAIR = ("a3c", "resnet50-bs128")  # the truth marks this pair 0 (cannot run together)


def test_pair_and_triple_follow_the_simulators_truth():
    a, b = BAD
    rate_a, fail = gpu_rate(TRUTH, "v100", [(1.0, "1", a), (2.0, "2", b)], "1")
    assert not fail and rate_a == pytest.approx(TRUTH.pair("v100", a, b))
    rate_b, _ = gpu_rate(TRUTH, "v100", [(1.0, "1", a), (2.0, "2", b)], "2")
    assert rate_b == pytest.approx(TRUTH.pair("v100", b, a))
    trio = [(1.0, "1", a), (2.0, "2", b), (3.0, "3", "transformer-bs32")]
    expected = TRUTH.set_tputs([m[2] for m in trio], "v100")
    for k, member in enumerate(trio):
        assert gpu_rate(TRUTH, "v100", trio, member[1])[0] == pytest.approx(expected[k])
    assert gpu_rate(TRUTH, "v100", [(1.0, "1", a)], "1") == (1.0, False)


def test_a_pair_the_truth_marks_zero_fails_the_newcomer_only():
    assert min(TRUTH.set_tputs(list(OOM_PAIR), "v100")) == 0.0
    members = [(5.0, "7", OOM_PAIR[0]), (6.0, "8", OOM_PAIR[1])]
    assert gpu_rate(TRUTH, "v100", members, "8") == (0.0, True)
    assert gpu_rate(TRUTH, "v100", members, "7") == (1.0, False)  # the resident keeps its speed
    # equal start times (clock ticks): the higher job id is the newcomer
    tie = [(5.0, "10", OOM_PAIR[0]), (5.0, "9", OOM_PAIR[1])]
    assert gpu_rate(TRUTH, "v100", tie, "10")[1] and not gpu_rate(TRUTH, "v100", tie, "9")[1]


def test_a_multi_gpu_job_runs_at_its_slowest_gpu():
    a, b = BAD
    by_gpu = {0: [(1.0, "1", a), (2.0, "2", b)], 1: [(1.0, "1", a)]}
    rate, fail, partners = job_rate(TRUTH, "v100", by_gpu, "1", [0, 1])
    assert rate == pytest.approx(TRUTH.pair("v100", a, b)) and not fail and partners == [b]


class _Neighbours:
    def __init__(self, timeline):
        self.timeline = timeline  # [(from time, {gpu: members})]
        self.now = 0.0

    def by_gpu(self):
        current = {}
        for since, members in self.timeline:
            if self.now >= since:
                current = members
        return current


def test_progress_integrates_the_rate_between_looks():
    a, b = BAD
    clock = {"t": 100.0}
    # a partner arrives at 101.05: the look at 101.1 sees it (looks every 0.1 s from 100.0)
    neighbours = _Neighbours([(100.0, {0: [(100.0, "1", a)]}),
                              (101.05, {0: [(100.0, "1", a), (101.05, "2", b)]})])

    def now():
        neighbours.now = clock["t"]
        return clock["t"]

    def sleep(seconds):
        clock["t"] = round(clock["t"] + seconds, 9)

    env = {"SLURM_JOB_ID": "1", "GPU_DEVICE_ORDINAL": "0"}
    job = FakeJob(3.0, a, TRUTH, "v100", 90.0, env=env, clock=now, sleep=sleep, neighbours=neighbours,
                  started=100.0, period_s=0.1)
    assert job.run() == 0
    x = TRUTH.pair("v100", a, b)
    # 1.1 s of work alone (until the look that sees the partner), then the remaining 1.9 s at x
    assert clock["t"] - 100.0 == pytest.approx(1.1 + 1.9 / x, abs=1e-6)
    assert job.shared_s == pytest.approx(1.9 / x, abs=1e-6)
    assert job.partners_seen == [b]


def test_solo_utilization_by_model_family():
    assert solo_util("resnet50-bs64") > solo_util("recommendation-bs2048")
    assert solo_util("no-such-model") == solo_util(None)


def test_bad_options_give_one_line_and_exit_2():
    result = subprocess.run([sys.executable, "-m", "slurm_horus", "fake-job", "--work", "-1"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0 and "--work" in result.stderr
    result = subprocess.run([sys.executable, "-m", "slurm_horus", "fake-job", "--work", "1", "--truth", "gavel:h999"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "gavel:h999" in result.stderr and "Traceback" not in result.stderr


# ---- on the real local cluster ---------------------------------------------------------------------

_REPORT = re.compile(r"fake-job: job=(\d+) class=(\S+) work=([\d.]+)s wall=([\d.]+)s .* start=([\d.]+) end=([\d.]+)")


def _report(cluster, job_id):
    match = _REPORT.search(cluster.job_output(job_id))
    assert match, cluster.job_output(job_id)
    return {"work": float(match.group(3)), "wall": float(match.group(4)), "start": float(match.group(5)),
            "end": float(match.group(6))}


def _expected_pair_walls(work, start_a, start_b, x_ab, x_ba):
    """Wall times of two jobs of ``work`` s sharing one GPU from the later start on (the truth's rule)."""
    first, second = (start_a, start_b) if start_a <= start_b else (start_b, start_a)
    x_first, x_second = (x_ab, x_ba) if start_a <= start_b else (x_ba, x_ab)
    if second - first >= work:  # never together
        return (work, work)
    done_first = second - first  # alone until the second one arrives
    t_first_end = second + (work - done_first) / x_first
    t_second_end = second + work / x_second
    if t_second_end > t_first_end:  # the second finishes alone at full speed
        t_second_end = t_first_end + (work - (t_first_end - second) * x_second)
    else:
        t_first_end = t_second_end + (work - done_first - (t_second_end - second) * x_first)
    walls = (t_first_end - first, t_second_end - second)
    return walls if start_a <= start_b else walls[::-1]


@in_slurm_chroot
def test_a_bad_pair_on_one_shard_shared_gpu_runs_as_slowly_as_the_truth_says(slurm_cluster, tmp_path):
    """Two jobs of a bad pair on GPU g3 of n4 (typed shards), one job of the same work alone on g2.

    Tolerance: a change of the co-runner set is seen up to one look (0.1 s) late, and start times
    have clock-tick resolution (10 ms): 0.25 s per job, about 4 % of the pair's run time."""
    work = 3.0
    a, b = BAD
    status = tmp_path / "fakegpu"
    status.mkdir()
    common = ["-w", "n4"]
    job_a = slurm_cluster.sbatch(common + ["--gres=shard:g3:1"], job_script(work, a, status_dir=str(status)))
    job_b = slurm_cluster.sbatch(common + ["--gres=shard:g3:1"], job_script(work, b, status_dir=str(status)))
    alone = slurm_cluster.sbatch(common + ["--gres=shard:g2:1"], job_script(work, b, status_dir=str(status)))
    # while both run, the stand-in NVML shows them slowed down: utilization = solo x rate
    slurm_cluster.wait_jobs([job_a, job_b], states={"RUNNING"}, timeout=60)
    backend = StandinBackend(gpus=4, node="n4", slurm_conf=str(slurm_cluster.slurm_conf))
    x_ab, x_ba = TRUTH.pair("v100", a, b), TRUTH.pair("v100", b, a)
    slowed = {round(solo_util(a) * x_ab, 1), round(solo_util(b) * x_ba, 1)}
    seen = set()
    deadline = time.time() + 2.0
    while time.time() < deadline and seen != slowed:  # each payload publishes at its first look
        seen = {round(p.sm_util, 1) for p in backend.processes(3)}
        time.sleep(0.05)
    states = slurm_cluster.wait_jobs([job_a, job_b, alone], timeout=60)
    assert set(states.values()) == {"COMPLETED"}, states
    ra, rb, solo = (_report(slurm_cluster, j) for j in (job_a, job_b, alone))
    want_a, want_b = _expected_pair_walls(work, ra["start"], rb["start"], x_ab, x_ba)
    assert ra["wall"] == pytest.approx(want_a, abs=0.25)
    assert rb["wall"] == pytest.approx(want_b, abs=0.25)
    assert solo["wall"] == pytest.approx(work, abs=0.1)
    assert min(ra["wall"], rb["wall"]) > work + 1.0  # measurably longer than alone
    assert seen == slowed
    assert not list(status.iterdir())  # each job removed its status file


@in_slurm_chroot
def test_a_pair_the_truth_marks_zero_fails_the_second_job_like_an_oom(slurm_cluster, tmp_path):
    first, second = OOM_PAIR
    resident = slurm_cluster.sbatch(["-w", "n4", "--gres=shard:g1:1"], job_script(4.0, first))
    slurm_cluster.wait_jobs([resident], states={"RUNNING"}, timeout=60)
    time.sleep(0.3)  # its payload is up
    newcomer = slurm_cluster.sbatch(["-w", "n4", "--gres=shard:g1:1"], job_script(4.0, second))
    states = slurm_cluster.wait_jobs([resident, newcomer], timeout=60)
    assert states == {resident: "COMPLETED", newcomer: "FAILED"}
    assert "out of memory (emulated)" in slurm_cluster.job_output(newcomer)
    assert _report(slurm_cluster, resident)["wall"] == pytest.approx(4.0, abs=0.25)
    exit_code = slurm_cluster.run(["scontrol", "show", "job", str(newcomer)]).stdout
    assert f"ExitCode={OOM_EXIT}:0" in exit_code


def test_environ_watch_rereads_only_what_may_still_change(tmp_path):
    """A fake /proc: a job shell that later execs the payload is seen once it does; a process that is
    not wanted is read again only while it is young; a PID that disappears is forgotten."""
    from slurm_horus.proc import EnvironWatch

    def process(pid, **env):
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        (tmp_path / str(pid) / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))

    reads = []

    def classify(env):
        reads.append(env.get("NAME"))
        if "FAKE" in env:
            return True
        return None if "JOB" in env else False

    now = {"t": 0.0}
    watch = EnvironWatch(classify, proc_root=str(tmp_path), settle_s=1.0, clock=lambda: now["t"])
    process(10, NAME="daemon")
    process(11, NAME="shell", JOB="1")
    assert watch.scan() == {} and sorted(reads) == ["daemon", "shell"]
    process(11, NAME="payload", JOB="1", FAKE="1")  # the shell execs the payload
    reads.clear()
    now["t"] = 0.5
    assert list(watch.scan()) == [11] and sorted(reads) == ["daemon", "payload"]
    reads.clear()
    now["t"] = 1.5  # the daemon has settled, the payload is known: nothing is read
    assert list(watch.scan()) == [11] and reads == []
    (tmp_path / "11" / "environ").unlink()
    (tmp_path / "11").rmdir()
    assert watch.scan() == {}
    process(11, NAME="new", JOB="2", FAKE="1")  # the PID comes back: read afresh
    assert watch.scan()[11]["NAME"] == "new"
