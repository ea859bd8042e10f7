"""SQLite history store: schema and migrations (db.py), shared reads (queries.py), fitted models
(models.py), all through sqlite-utils."""
