"""``horus ingest --prometheus`` against a real Prometheus (Debian's ``prometheus``, started here)
scraping a small exporter that speaks DCGM's metric names and labels, plus the companion gauge of
jobstats' NVIDIA exporter (``nvidia_gpu_jobId``), for real jobs of the local cluster."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from slurm_horus.collect.prometheus import JobMap, node_of, samples_from_series
from slurm_horus.localcluster.procs import pick_free_ports

DCGM_HELP = {
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
}
TOTAL_MIB = 16384


class FakeGpus:
    """What the exporters publish: {(node, gpu): (util, fb_used MiB, job id or None, via)}; ``via`` is
    "jobstats" (the companion gauge) or "hpc_job" (dcgm-exporter's HPC job mapping label)."""

    def __init__(self, nodes, gpus):
        self.lock = threading.Lock()
        self.state = {(n, g): (0.0, 0.0, None, None) for n in nodes for g in range(gpus)}

    def set(self, node, gpu, util, used, job=None, via="jobstats"):
        with self.lock:
            self.state[(node, gpu)] = (util, used, job, via)

    def dcgm(self):
        lines = []
        with self.lock:
            state = dict(self.state)
        for metric, (kind, text) in DCGM_HELP.items():
            lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
            for (node, gpu), (util, used, job, via) in sorted(state.items()):
                value = {"DCGM_FI_DEV_GPU_UTIL": util, "DCGM_FI_DEV_MEM_COPY_UTIL": util / 2,
                         "DCGM_FI_DEV_FB_USED": used, "DCGM_FI_DEV_FB_FREE": TOTAL_MIB - used}[metric]
                labels = (f'gpu="{gpu}",UUID="{_uuid(node, gpu)}",pci_bus_id="00000000:{gpu + 10:02X}:00.0",'
                          f'device="nvidia{gpu}",modelName="Tesla V100-SXM2-16GB",Hostname="{node}",'
                          f'DCGM_FI_DRIVER_VERSION="535.129.03"')
                if job and via == "hpc_job":
                    labels += f',hpc_job="{job}"'
                lines.append(f"{metric}{{{labels}}} {value:g}")
        return "\n".join(lines) + "\n"

    def jobstats(self):
        lines = ["# HELP nvidia_gpu_jobId JobId number of a job currently using this GPU as reported by Slurm",
                 "# TYPE nvidia_gpu_jobId gauge"]
        with self.lock:
            state = dict(self.state)
        for (node, gpu), (_util, _used, job, via) in sorted(state.items()):
            value = job if job and via == "jobstats" else 0
            lines.append(f'nvidia_gpu_jobId{{minor_number="{gpu}",name="Tesla V100-SXM2-16GB",'
                         f'uuid="{_uuid(node, gpu)}"}} {value}')
        return "\n".join(lines) + "\n"


def _uuid(node, gpu):
    return f"GPU-{abs(hash(node)) % 10 ** 8:08d}-0000-4000-8000-{gpu:012d}"


@pytest.fixture
def exporter(slurm_cluster_dbd):
    gpus = FakeGpus(slurm_cluster_dbd.node_names(), slurm_cluster_dbd.gpus)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = (gpus.dcgm() if self.path.startswith("/metrics") else gpus.jobstats()).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # Prometheus gave up on a slow scrape
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield gpus, server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def prometheus(exporter):
    """A real Prometheus scraping the exporter every second; yields its URL."""
    binary = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)
    if binary is None:
        pytest.fail("prometheus not found: install the Debian package prometheus (scripts/ensure-debian-deps.sh "
                    "does, as make test runs it)", pytrace=False)
    _gpus, port = exporter
    work = Path(tempfile.mkdtemp(prefix="hprom-"))
    (work / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
        "scrape_configs:\n"
        f"  - job_name: dcgm\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        f"  - job_name: jobstats-nvidia\n    metrics_path: /jobstats\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
    web = pick_free_ports(1)[0]
    log = open(work / "prometheus.log", "wb")
    process = subprocess.Popen([binary, f"--config.file={work / 'prometheus.yml'}",
                                f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{web}",
                                "--storage.tsdb.retention.time=1h"], stdout=log, stderr=log,
                               stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{web}"
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        assert process.poll() is None and time.time() < deadline, (work / "prometheus.log").read_text()[-2000:]
        time.sleep(0.2)
    yield url
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    log.close()
    shutil.rmtree(work, ignore_errors=True)


def _horus(cluster, *args):
    done = subprocess.run([sys.executable, "-m", "slurm_horus", *args], env=cluster.env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _gpu_of(cluster, job_id):
    for job in cluster.queue():
        if job.job_id == job_id:
            return job.nodes, job.gpu_indices()[0]
    raise AssertionError(f"job {job_id} not in squeue")


def test_dcgm_samples_in_prometheus_land_in_the_jobs_report(slurm_cluster_dbd, exporter, prometheus, tmp_path):
    cluster = slurm_cluster_dbd
    gpus, _port = exporter
    began = int(time.time()) - 5
    first = cluster.sbatch(["--gres=gpu:1", "-w", "n2", "--job-name=dcgm-a"], "#!/bin/sh\nsleep 12\n")
    second = cluster.sbatch(["--gres=gpu:1", "-w", "n3", "--job-name=dcgm-b"], "#!/bin/sh\nsleep 12\n")
    cluster.wait_jobs([first, second], states={"RUNNING"}, timeout=60)
    node_a, gpu_a = _gpu_of(cluster, first)
    node_b, gpu_b = _gpu_of(cluster, second)
    gpus.set(node_a, gpu_a, 73.0, 5000.0, first, via="jobstats")  # what the prolog told the exporters
    gpus.set(node_b, gpu_b, 41.0, 3000.0, second, via="hpc_job")
    cluster.wait_jobs([first, second], timeout=60)
    gpus.set(node_a, gpu_a, 0.0, 0.0)  # the epilog: free again
    gpus.set(node_b, gpu_b, 0.0, 0.0)
    time.sleep(2)
    db = tmp_path / "h.db"
    deadline = time.time() + 60
    while len(cluster.accounting([first, second])) < 2 or not all(
            r.end_time for r in cluster.accounting([first, second])):
        assert time.time() < deadline
        time.sleep(0.5)
    _horus(cluster, "ingest", "--db", str(db), "--since", str(began - 60), "--no-progress")
    until = str(int(time.time()))  # (by default the newest 30 s are left for the next run: still being scraped)
    result = json.loads(_horus(cluster, "ingest", "--db", str(db), "--prometheus", prometheus, "--since",
                               str(began), "--until", until, "--json", "--no-progress"))
    assert result["nodes"] == len(cluster.node_names()) and result["gpu_samples"] > 0
    for job_id, node, gpu, util, used in ((first, node_a, gpu_a, 73.0, 5000.0), (second, node_b, gpu_b, 41.0, 3000.0)):
        report = json.loads(_horus(cluster, "report", "job", str(job_id), "--db", str(db), "--json"))
        [held] = report["gpus"]
        assert (held["node"], held["gpu_index"]) == (node, gpu)
        assert held["samples"] >= 3, report["gpus"]  # a 12-s job scraped every second (or so, under load)
        assert held["max_sm_util"] == util and held["max_mem_mb"] == used
        if job_id == second:  # hpc_job: the job is a label of the very samples
            assert held["mean_sm_util"] == util
        else:  # the companion is scraped apart from DCGM: a sample at each edge may fall to the other side
            assert held["mean_sm_util"] >= util * (held["samples"] - 2) / held["samples"] - 0.1
        assert held["mem_total_mb"] == TOTAL_MIB and held["shared_fraction"] == 0.0
        assert f"{node}:{gpu}" in report["gpu_list"]
    cluster_report = json.loads(_horus(cluster, "report", "cluster", "--db", str(db), "--json"))
    assert cluster_report["gpu_samples"] == result["gpu_samples"]
    # incremental and idempotent: the same range again stores nothing new
    again = json.loads(_horus(cluster, "ingest", "--db", str(db), "--prometheus", prometheus, "--since",
                              str(began), "--until", until, "--json", "--no-progress"))
    assert again["stored_rows"] > 0
    cluster_again = json.loads(_horus(cluster, "report", "cluster", "--db", str(db), "--json"))
    assert cluster_again["gpu_samples"] == cluster_report["gpu_samples"]
    bad = subprocess.run([sys.executable, "-m", "slurm_horus", "ingest", "--db", str(db), "--prometheus",
                          prometheus, "--prometheus-match", 'cluster=~"(', "--since", str(began), "--until", until,
                          "--no-progress"], env=cluster.env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "HTTP 400" in bad.stderr


def test_series_become_samples_of_the_jobs_that_held_the_gpus():
    labels = {"gpu": "1", "UUID": "GPU-a", "modelName": "NVIDIA H100", "Hostname": "g001.cluster"}
    series = {
        "DCGM_FI_DEV_GPU_UTIL": [(labels, [(100.0, 80.0), (110.0, 60.0)]),
                                 ({**labels, "gpu": "2", "UUID": "GPU-b", "hpc_job": "77"}, [(100.0, 30.0)]),
                                 ({**labels, "gpu": "2", "UUID": "GPU-b", "hpc_job": "78"}, [(100.0, 30.0)])],
        "DCGM_FI_DEV_FB_USED": [(labels, [(100.0, 1000.0), (110.0, 2000.0)])],
        "DCGM_FI_DEV_FB_FREE": [(labels, [(100.0, 15000.0), (110.0, 14000.0)])],
    }
    companion = [({"uuid": "GPU-a", "minor_number": "1"}, [(99.5, 5.0), (105.0, 0.0)])]
    [batch] = samples_from_series(series, companion)
    assert batch["node"] == "g001"
    by_key = {(g["gpu_index"], g["ts"]): g for g in batch["gpus"]}
    assert by_key[(1, 100.0)]["job_ids"] == "5" and by_key[(1, 100.0)]["mem_total_mb"] == 16000.0
    assert by_key[(1, 110.0)]["job_ids"] is None  # the companion said 0: free
    assert by_key[(2, 100.0)]["job_ids"] == "77,78"
    uses = {(u["job_id"], u["gpu_index"]): u for u in batch["jobs"]}
    assert uses[(5, 1)]["sm_util"] == 80.0 and uses[(5, 1)]["shared"] == 0
    assert uses[(77, 2)]["shared"] == 1 and uses[(77, 2)]["sm_util"] is None
    assert JobMap(companion).job_at("GPU-a", 99.0) is None and JobMap(companion).job_at("GPU-a", 500.0) is None
    assert node_of({"instance": "gpu7.example.org:9400"}) == "gpu7"
