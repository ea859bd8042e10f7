"""Fitted interference models in the history database (table ``models``).

One row per fit: ``id`` (integer key), ``name`` (predictor name), ``created`` (ISO 8601 UTC),
``json`` (the model's ``to_dict()``), and for refits from history (``origin = 'refit'``) the number
of local observations and the model error on them before and after. The newest row is the model in
force.
"""

import json
from datetime import datetime, timezone

from .db import open_db, transaction

TABLE = "models"


def _db(db_or_path):
    return open_db(db_or_path) if isinstance(db_or_path, (str, bytes)) or hasattr(db_or_path, "__fspath__") \
        else db_or_path


def save_model(db_or_path, name, state, origin="fit", n_observations=None, error_before=None,
               error_after=None):
    """Store one fitted model's state; returns its id."""
    db = _db(db_or_path)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with transaction(db) as conn:
        cursor = conn.execute(
            "INSERT INTO models (name, created, json, origin, n_observations, error_before, error_after) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [name, created, json.dumps(state, separators=(",", ":")), origin, n_observations,
             error_before, error_after])
        return cursor.lastrowid


def load_model(db_or_path, model_id=None):
    """(id, name, created, state) of model ``model_id`` or of the newest one; None if there is none."""
    db = _db(db_or_path)
    if model_id is None:
        row = db.execute("SELECT id, name, created, json FROM models ORDER BY id DESC LIMIT 1").fetchone()
    else:
        row = db.execute("SELECT id, name, created, json FROM models WHERE id = ?", [model_id]).fetchone()
    if row is None:
        return None
    return row[0], row[1], row[2], json.loads(row[3])


def model_history(db_or_path):
    """Every stored model without its state: dicts, oldest first (for reports)."""
    db = _db(db_or_path)
    fields = ("id", "name", "created", "origin", "n_observations", "error_before", "error_after")
    return [dict(zip(fields, row)) for row in
            db.execute(f"SELECT {', '.join(fields)} FROM models ORDER BY id")]
