"""Raw GPU samples: how long they stay, and the horizon below which none are taken any more.

At a thousand nodes x 8 GPUs sampled every 10 s the two raw tables grow by ~70 million rows a day
each, so a site keeps them ``raw_days`` (the job report's utilization plots read them) and the
reports, the learning loop and horusd read the rollups (``job_gpu_summary``, ``cluster_hourly``,
``gpus``), which triggers keep and which stay. Pruning first moves the *raw horizon* up (``meta``
key ``raw.horizon``); a writer drops rows below it, so a batch that arrives late, after its hour was
pruned, cannot be counted a second time in the rollups.
"""

import time

from .db import get_meta, set_meta, transaction

RAW_HORIZON_KEY = "raw.horizon"
DELETE_CHUNK = 20000


def raw_horizon(db):
    value = get_meta(db, RAW_HORIZON_KEY)
    return float(value) if value is not None else None


def prune_raw(db, raw_days, now=None):
    """Delete raw samples older than ``raw_days`` (0: keep all); returns the number of rows deleted.

    Small transactions, so a receiver storing meanwhile never waits long for the write lock.
    """
    if not raw_days or raw_days <= 0:
        return 0
    now = time.time() if now is None else now
    before = now - raw_days * 86400.0
    previous = raw_horizon(db) or 0.0
    if before <= previous:
        return 0
    with transaction(db) as conn:
        set_meta(conn, RAW_HORIZON_KEY, repr(before))
    deleted = 0
    while True:
        with transaction(db) as conn:
            cursor = conn.execute(
                "DELETE FROM gpu_samples WHERE (node, gpu_index, ts) IN "
                "(SELECT node, gpu_index, ts FROM gpu_samples WHERE ts < ? LIMIT ?)",
                [before, DELETE_CHUNK])
        deleted += cursor.rowcount
        if cursor.rowcount < DELETE_CHUNK:
            break
    # job_gpu_use has no index on ts alone: go job by job through its primary key
    jobs = [row[0] for row in db.execute(
        "SELECT DISTINCT job_id FROM job_gpu_summary WHERE first_ts < ? AND last_ts >= ?", [before, previous])]
    for offset in range(0, len(jobs), 200):
        with transaction(db) as conn:
            for job_id in jobs[offset: offset + 200]:
                deleted += conn.execute("DELETE FROM job_gpu_use WHERE job_id = ? AND ts < ?",
                                        [job_id, before]).rowcount
    return deleted
