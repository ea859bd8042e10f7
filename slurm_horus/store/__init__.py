"""SQLite history store: schema, migrations and the reads/writes the other rooms share."""
