"""Placement decisions in the history store (table ``decisions``), written by horusd.

A decision is what horus chose for one submission and what it predicted; ``horus report job`` shows
its predicted slowdown next to the observed one (the job's AdminComment carries ``horus:<id>``, the
ingest stores that id as ``jobs.horus_id``).
"""

import json
import time

from .db import transaction

FIELDS = ("decision_id", "ts", "job_id", "job_class", "user", "policy", "mode", "nodes", "gpus",
          "predicted_slowdown", "corunners", "detail")


def record_decision(db, decision_id, job_class=None, user=None, policy=None, mode=None, nodes=(),
                    gpus=None, predicted_slowdown=None, corunners=None, detail=None, job_id=None, ts=None):
    """Store (or replace) one decision. ``gpus``: {node: [index]}; ``corunners``: {job_id: slowdown}."""
    row = (decision_id, time.time() if ts is None else ts, job_id, job_class, user, policy, mode,
           ",".join(nodes), json.dumps(gpus or {}, sort_keys=True), predicted_slowdown,
           json.dumps(corunners or {}, sort_keys=True), json.dumps(detail or {}, sort_keys=True))
    with transaction(db) as conn:
        conn.execute(f"INSERT OR REPLACE INTO decisions ({', '.join(FIELDS)}) VALUES "
                     f"({', '.join('?' * len(FIELDS))})", row)


def decision(db, decision_id):
    row = db.execute(f"SELECT {', '.join(FIELDS)} FROM decisions WHERE decision_id = ?", [decision_id]).fetchone()
    if row is None:
        return None
    result = dict(zip(FIELDS, row))
    for key in ("gpus", "corunners", "detail"):
        result[key] = json.loads(result[key]) if result[key] else {}
    return result
