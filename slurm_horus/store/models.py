"""Fitted interference models in the SQLite history database (table ``models``).

One row per fit: ``id`` (integer key), ``name`` (predictor name), ``created`` (ISO 8601 UTC) and
``json`` (the model's ``to_dict()``). The newest row is the model in force.
"""

import json
from datetime import datetime, timezone

import sqlite_utils

TABLE = "models"


def save_model(db_path, name, state):
    """Store one fitted model's state; returns its id."""
    db = sqlite_utils.Database(db_path)
    table = db[TABLE]
    if not table.exists():
        table.create({"id": int, "name": str, "created": str, "json": str}, pk="id")
    row = {"name": name, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "json": json.dumps(state, separators=(",", ":"))}
    return table.insert(row).last_pk


def load_model(db_path, model_id=None):
    """(id, name, created, state) of model ``model_id`` or of the newest one; None if there is none."""
    db = sqlite_utils.Database(db_path)
    if not db[TABLE].exists():
        return None
    if model_id is None:
        rows = list(db[TABLE].rows_where(order_by="id desc", limit=1))
    else:
        rows = list(db[TABLE].rows_where("id = ?", [model_id]))
    if not rows:
        return None
    row = rows[0]
    return row["id"], row["name"], row["created"], json.loads(row["json"])
