"""``horus collect``: sample the GPUs of one node, spool the samples locally, ship them to the store.

Many nodes must never write one SQLite file over NFS, so each collector appends its batches to a
small local spool (SQLite, one row per batch, crash-safe) and ships them in bulk: directly into the
history database when this host can open it (``--ship``), or as JSON lines that the head node imports
(``horus collect --export - | ssh head horus collect --import -``). Shipping uses the samples' natural
keys with INSERT OR IGNORE, so a batch shipped twice (a kill between "written" and "marked shipped")
is stored once.
"""

import json
import logging
import socket
import sqlite3
import time
from pathlib import Path

from ..private import make_private
from ..store.db import transaction
from . import procfs

log = logging.getLogger(__name__)

GPU_COLUMNS = ("node", "gpu_index", "ts", "uuid", "gpu_name", "gpu_util", "mem_util", "mem_used_mb",
               "mem_total_mb", "job_ids")
USE_COLUMNS = ("job_id", "node", "gpu_index", "ts", "sm_util", "mem_util", "mem_used_mb", "n_procs",
               "shared")


def node_name():
    return socket.gethostname().split(".")[0]


def _sum_known(values):
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def sample_once(backend, node, ts=None, proc_root="/proc", slurm_conf=None):
    """One sample of every GPU: {"node", "ts", "gpus": [row], "jobs": [row]} (rows as dicts)."""
    ts = round(time.time() if ts is None else ts, 3)
    holders = procfs.gpu_holders(node, proc_root, slurm_conf)
    gpus, uses = [], []
    for index in range(backend.device_count() or 0):
        try:
            reading = backend.read_gpu(index)
            procs = backend.processes(index) if reading is not None else None
        except Exception:  # a backend fault on one GPU must not stop the others
            log.exception("reading GPU %s failed", index)
            continue
        if reading is None:  # lost GPU
            continue
        by_job = {}
        for proc in procs or []:
            job = procfs.job_of_pid(proc.pid, proc_root)
            if job is not None:
                by_job.setdefault(job, []).append(proc)
        jobs = sorted(set(by_job) | holders.get(index, set()))
        shared = len(jobs) > 1
        gpus.append({
            "node": node, "gpu_index": index, "ts": ts, "uuid": reading.uuid, "gpu_name": reading.name,
            "gpu_util": reading.gpu_util, "mem_util": reading.mem_util,
            "mem_used_mb": reading.mem_used_mb, "mem_total_mb": reading.mem_total_mb,
            "job_ids": ",".join(map(str, jobs)) or None,
        })
        for job in jobs:
            mine = by_job.get(job, [])
            sm = _sum_known(p.sm_util for p in mine)
            mem_util = _sum_known(p.mem_util for p in mine)
            if not mine:
                sm, mem_util = 0.0, 0.0  # holds the GPU, runs nothing on it: idle
            elif sm is None and not shared:
                sm, mem_util = reading.gpu_util, reading.mem_util  # no per-process data, sole user
            uses.append({
                "job_id": job, "node": node, "gpu_index": index, "ts": ts,
                "sm_util": None if sm is None else min(100.0, sm),
                "mem_util": None if mem_util is None else min(100.0, mem_util),
                "mem_used_mb": _sum_known(p.used_mem_mb for p in mine) or (0.0 if not mine else None),
                "n_procs": len(mine), "shared": int(shared),
            })
    return {"node": node, "ts": ts, "gpus": gpus, "jobs": uses}


class Spool:
    """The node-local batch queue: a tiny SQLite file (WAL), one row per sampled batch."""

    def __init__(self, path):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            make_private(self.path)  # 0640 (and its -wal, -shm): the processes of every user's jobs
        self.conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS batches (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, "
            "payload TEXT NOT NULL, shipped INTEGER NOT NULL DEFAULT 0)"
        )

    def append(self, batch):
        self.conn.execute("INSERT INTO batches (ts, payload) VALUES (?, ?)",
                          [batch["ts"], json.dumps(batch, separators=(",", ":"))])

    def pending(self, limit=1000):
        rows = self.conn.execute(
            "SELECT id, payload FROM batches WHERE shipped = 0 ORDER BY id LIMIT ?", [limit]
        ).fetchall()
        return [(row[0], json.loads(row[1])) for row in rows]

    def mark_shipped(self, ids, keep_s=86400, now=None):
        now = time.time() if now is None else now
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany("UPDATE batches SET shipped = 1 WHERE id = ?", [(i,) for i in ids])
        # Shipped batches stay a day (for a look when something went wrong), then go.
        self.conn.execute("DELETE FROM batches WHERE shipped = 1 AND ts < ?", [now - keep_s])
        self.conn.execute("COMMIT")

    def count(self, shipped=0):
        return self.conn.execute("SELECT count(*) FROM batches WHERE shipped = ?", [shipped]).fetchone()[0]

    def close(self):
        self.conn.close()


_GPU_SQL = "INSERT OR IGNORE INTO gpu_samples ({}) VALUES ({})".format(
    ", ".join(GPU_COLUMNS), ", ".join("?" * len(GPU_COLUMNS)))
_USE_SQL = "INSERT OR IGNORE INTO job_gpu_use ({}) VALUES ({})".format(
    ", ".join(USE_COLUMNS), ", ".join("?" * len(USE_COLUMNS)))


def store_batches(db, batches):
    """Write sample batches into the history store (one transaction); returns rows offered."""
    gpu_rows = [tuple(g.get(c) for c in GPU_COLUMNS) for b in batches for g in b.get("gpus", ())]
    use_rows = [tuple(u.get(c) for c in USE_COLUMNS) for b in batches for u in b.get("jobs", ())]
    with transaction(db) as conn:
        conn.executemany(_GPU_SQL, gpu_rows)
        conn.executemany(_USE_SQL, use_rows)
    return len(gpu_rows) + len(use_rows)


def _drain(spool, chunk, deliver):
    """Hand every unshipped spool batch to ``deliver`` (a chunk at a time), marking each chunk
    shipped once delivered; returns the number of batches."""
    done = 0
    while True:
        pending = spool.pending(chunk)
        if not pending:
            return done
        deliver([batch for _, batch in pending])
        spool.mark_shipped([i for i, _ in pending])
        done += len(pending)


def ship(spool, db, chunk=500):
    """Move every unshipped spool batch into ``db``; returns the number of batches shipped."""
    return _drain(spool, chunk, lambda batches: store_batches(db, batches))


def export_batches(spool, out, chunk=500):
    """Write unshipped batches as JSON lines to ``out`` and mark them shipped (the push path)."""
    def write(batches):
        for batch in batches:
            out.write(json.dumps(batch, separators=(",", ":")) + "\n")
        out.flush()
    return _drain(spool, chunk, write)


def import_batches(db, lines, source="-", chunk=500):
    """Store JSON-line batches (``export_batches`` output); a bad line names source:line."""
    from ..errors import InputError

    batch, imported = [], 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            if not isinstance(item, dict) or "gpus" not in item:
                raise ValueError("not a sample batch")
        except ValueError as exc:
            raise InputError(f"{source}:{lineno}: {exc}") from None
        batch.append(item)
        if len(batch) >= chunk:
            store_batches(db, batch)
            imported, batch = imported + len(batch), []
    if batch:
        store_batches(db, batch)
        imported += len(batch)
    return imported


def run_collector(backend, spool, node, interval_s=5.0, count=None, ship_to=None, ship_every_s=60.0,
                  proc_root="/proc", slurm_conf=None, sleep=time.sleep, clock=time.time):
    """Sample every ``interval_s`` into ``spool`` (``count`` times, or forever); ship now and then."""
    done, last_ship = 0, clock()
    while count is None or done < count:
        started = clock()
        spool.append(sample_once(backend, node, started, proc_root, slurm_conf))
        done += 1
        if ship_to is not None and (clock() - last_ship >= ship_every_s or done == count):
            ship(spool, ship_to)
            last_ship = clock()
        if count is None or done < count:
            sleep(max(0.0, interval_s - (clock() - started)))
    return done
