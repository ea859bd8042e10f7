"""The SQLite history database: schema, reads and writes (sqlite-utils)."""
