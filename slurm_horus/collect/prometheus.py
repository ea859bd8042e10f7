"""``horus ingest --prometheus URL``: GPU samples from NVIDIA's DCGM exporter, read out of Prometheus.

Sites that already run dcgm-exporter with Prometheus (and jobstats on top of it) need no second
sampler: this reads the raw samples Prometheus keeps and stores them like the collector's, so the
reports, the learning loop and horusd see them alike.

What is read (dcgm-exporter's default counters; its labels ``gpu``, ``UUID``, ``device``,
``modelName``, ``Hostname``, ``pci_bus_id``):

=============================  ============================================
``DCGM_FI_DEV_GPU_UTIL``       ``gpu_util`` (%)
``DCGM_FI_DEV_MEM_COPY_UTIL``  ``mem_util`` (%)
``DCGM_FI_DEV_FB_USED``        ``mem_used_mb`` (MiB)
``DCGM_FI_DEV_FB_FREE``        ``mem_total_mb`` = used + free (MiB)
=============================  ============================================

Samples of one GPU taken in one scrape share a timestamp; that (node, gpu, timestamp) is the sample.
The node is the ``Hostname`` label (``--node-label``), else the host part of ``instance``, short name.

Which job held a GPU, as jobstats does it: jobstats' NVIDIA exporter publishes a companion gauge
``nvidia_gpu_jobId`` per GPU (labels ``uuid``, ``minor_number``; value: the Slurm job id, 0 when free)
from files a Slurm prolog/epilog writes, and its queries keep the GPU series ``and nvidia_gpu_jobId ==
JOBID``. DCGM's own series carry ``UUID`` (its ``gpu`` index and Slurm's ``minor_number`` need not
agree), so the join is by UUID: a DCGM sample belongs to the job the companion named at its latest
sample at or before it (within Prometheus' 5-minute staleness). dcgm-exporter's own HPC job mapping
(``--hpc-job-mapping-dir``, the same prolog-written files) instead adds an ``hpc_job`` label, one
series per job; both are read. A GPU held by one job gives that job its utilization and memory; a
GPU shared by several (device-level metrics cannot tell them apart) marks each ``shared`` with no
utilization, the collector's rule when NVML has no per-process numbers.

Incremental and idempotent like the sacct ingest: raw samples in windows (``metric[Ws]`` at the
window's end, no resampling), a watermark per Prometheus URL in ``meta``, natural keys with INSERT OR
IGNORE (the rollups are kept by triggers on inserted rows only).
"""

import bisect
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass

from ..errors import InputError
from ..store.db import get_meta, set_meta, transaction
from .ingest import IngestResult
from .sampler import store_batches

METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": "gpu_util",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "mem_util",
    "DCGM_FI_DEV_FB_USED": "fb_used",
    "DCGM_FI_DEV_FB_FREE": "fb_free",
}
JOB_COMPANION = "nvidia_gpu_jobId"
HPC_JOB_LABEL = "hpc_job"
STALENESS_S = 300.0
WATERMARK_KEY = "prometheus.watermark"
DEFAULT_FIRST_S = 86400
DEFAULT_WINDOW_S = 900
MAX_POINTS = 400_000  # a window whose answer holds more raw points than this is split
LAG_S = 30  # the newest seconds may still be scraped: stop this far behind now


class PrometheusSource:
    """Raw samples of one metric over a window, via ``/api/v1/query`` with a range selector."""

    def __init__(self, url, match="", timeout_s=60.0):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InputError(f"--prometheus {url!r}: expected http://HOST:PORT")
        self.url = url.rstrip("/")
        self.match = match.strip().strip("{}")
        self.timeout_s = timeout_s
        self.queries = 0

    def selector(self, metric):
        return f"{metric}{{{self.match}}}" if self.match else metric

    def raw(self, metric, end, window_s):
        """[(labels, [(ts, value)])] of ``metric`` in (end - window_s, end]."""
        query = f"{self.selector(metric)}[{max(1, int(round(window_s * 1000)))}ms]"
        params = urllib.parse.urlencode({"query": query, "time": f"{end:.3f}"})
        request = urllib.request.Request(f"{self.url}/api/v1/query?{params}", headers={"Accept": "application/json"})
        self.queries += 1
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            raise InputError(f"prometheus {self.url}: HTTP {exc.code} for {query}: "
                             f"{_error_of(exc.read())}") from None
        except (OSError, urllib.error.URLError) as exc:
            raise InputError(f"prometheus {self.url} unreachable: {getattr(exc, 'reason', exc)}") from None
        try:
            doc = json.loads(text)
        except ValueError:
            raise InputError(f"prometheus {self.url}: answer to {query} is not JSON") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise InputError(f"prometheus {self.url}: {query}: {_error_of(text)}")
        data = doc.get("data") or {}
        if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
            raise InputError(f"prometheus {self.url}: {query}: expected a matrix")
        series = []
        for item in data["result"]:
            labels = item.get("metric") or {}
            points = []
            for ts, value in item.get("values") or ():
                try:
                    number = float(value)
                except (TypeError, ValueError):
                    continue
                if math.isfinite(number):
                    points.append((float(ts), number))
            series.append((labels, points))
        return series


def _error_of(text):
    try:
        doc = json.loads(text)
        return str(doc.get("error") or doc.get("status") or "failed")[:300]
    except (ValueError, AttributeError):
        return "failed"


def node_of(labels, node_label="Hostname"):
    name = labels.get(node_label) or labels.get("Hostname") or labels.get("hostname") or ""
    if not name:
        instance = labels.get("instance", "")
        name = instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance
    return name.split(".")[0] or None


def _job_id(text):
    try:
        value = int(float(text))
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


class JobMap:
    """UUID -> time-ordered (ts, job id or None) from the jobstats companion series."""

    def __init__(self, series):
        by_uuid = defaultdict(list)
        for labels, points in series:
            uuid = labels.get("uuid") or labels.get("UUID")
            if uuid:
                by_uuid[uuid].extend((ts, _job_id(value)) for ts, value in points)
        self.times, self.jobs = {}, {}
        for uuid, points in by_uuid.items():
            points.sort()
            self.times[uuid] = [p[0] for p in points]
            self.jobs[uuid] = [p[1] for p in points]

    def job_at(self, uuid, ts):
        times = self.times.get(uuid)
        if not times:
            return None
        k = bisect.bisect_right(times, ts) - 1
        if k < 0 or ts - times[k] > STALENESS_S:
            return None
        return self.jobs[uuid][k]


def samples_from_series(metric_series, companion_series=(), node_label="Hostname"):
    """{metric: [(labels, points)]} of one window -> sample batches (one per node), as the
    collector's: ``{"node", "ts", "gpus": [...], "jobs": [...]}``."""
    merged = {}  # (node, gpu, ts) -> sample
    for metric, field in METRICS.items():
        for labels, points in metric_series.get(metric, ()):
            node = node_of(labels, node_label)
            gpu = labels.get("gpu")
            if node is None or gpu is None or not str(gpu).isdigit():
                continue
            job = _job_id(labels.get(HPC_JOB_LABEL))
            for ts, value in points:
                key = (node, int(gpu), round(ts, 3))
                sample = merged.get(key)
                if sample is None:
                    sample = merged[key] = {"uuid": labels.get("UUID") or labels.get("uuid"),
                                            "name": labels.get("modelName"), "jobs": set()}
                sample[field] = value
                if job is not None:
                    sample["jobs"].add(job)
    jobs = JobMap(companion_series)
    batches = defaultdict(lambda: {"gpus": [], "jobs": []})
    for (node, gpu, ts), sample in sorted(merged.items()):
        held = set(sample["jobs"])
        if sample["uuid"]:
            companion = jobs.job_at(sample["uuid"], ts)
            if companion is not None:
                held.add(companion)
        used, free = sample.get("fb_used"), sample.get("fb_free")
        batch = batches[node]
        batch["gpus"].append({
            "node": node, "gpu_index": gpu, "ts": ts, "uuid": sample["uuid"], "gpu_name": sample["name"],
            "gpu_util": sample.get("gpu_util"), "mem_util": sample.get("mem_util"), "mem_used_mb": used,
            "mem_total_mb": used + free if used is not None and free is not None else None,
            "job_ids": ",".join(map(str, sorted(held))) or None,
        })
        alone = len(held) == 1
        for job in sorted(held):
            batch["jobs"].append({
                "job_id": job, "node": node, "gpu_index": gpu, "ts": ts,
                "sm_util": sample.get("gpu_util") if alone else None,
                "mem_util": sample.get("mem_util") if alone else None,
                "mem_used_mb": used if alone else None, "n_procs": None, "shared": int(not alone),
            })
    return [{"node": node, "ts": max(g["ts"] for g in b["gpus"]), **b} for node, b in sorted(batches.items())]


@dataclass
class PrometheusResult(IngestResult):
    queries: int = 0
    gpu_samples: int = 0
    job_rows: int = 0
    stored_rows: int = 0
    nodes: int = 0


def _watermark_key(url):
    return f"{WATERMARK_KEY}.{url.rstrip('/')}"


def ingest_prometheus(db, source, since=None, until=None, window_s=DEFAULT_WINDOW_S, node_label="Hostname",
                      progress=None, now=None):
    """Read DCGM samples from ``source`` over [since, until] into ``db``; a :class:`PrometheusResult`.

    ``since`` overrides the stored watermark; without either, the last day is read.
    """
    now = time.time() if now is None else now
    until = float(until if until is not None else now - LAG_S)
    key = _watermark_key(source.url)
    mark = get_meta(db, key)
    if since is None:
        since = float(mark) if mark is not None else until - DEFAULT_FIRST_S
    since = float(since)
    result = PrometheusResult(watermark=float(mark) if mark is not None else None, source="prometheus")
    nodes = set()
    start, size = since, float(window_s)
    while start < until:
        end = min(until, start + size)
        metric_series = {metric: source.raw(metric, end, end - start) for metric in METRICS}
        points = sum(len(p) for series in metric_series.values() for _l, p in series)
        if points > MAX_POINTS and size > 60:
            size = max(60.0, size / 2)  # too much at once: the same window again, halved
            continue
        companion = source.raw(JOB_COMPANION, end, end - start + STALENESS_S)
        batches = samples_from_series(metric_series, companion, node_label)
        # (end - window, end]: a sample exactly at ``start`` belongs to the previous window
        for batch in batches:
            batch["gpus"] = [g for g in batch["gpus"] if g["ts"] > start or start == since]
            batch["jobs"] = [j for j in batch["jobs"] if j["ts"] > start or start == since]
        if batches:
            result.stored_rows += store_batches(db, batches)
        result.gpu_samples += sum(len(b["gpus"]) for b in batches)
        result.job_rows += sum(len(b["jobs"]) for b in batches)
        nodes.update(b["node"] for b in batches)
        with transaction(db) as conn:
            set_meta(conn, key, repr(end))
        result.watermark = end
        result.windows += 1
        if progress is not None:
            progress((end - since) / max(1e-9, until - since), result.windows, result.gpu_samples)
        if points < MAX_POINTS // 8:
            size *= 2
        start = end
    result.queries = source.queries
    result.nodes = len(nodes)
    return result
