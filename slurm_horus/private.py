"""Files that hold what users must not read of each other (the history database, the collector's
spool, horusd's log): created 0640, and an existing one we own loses its world bits. Logs that may
carry what a user wrote escape control characters, so one field cannot forge a log line.

No imports from the rooms: the store, the collectors and horusd use it.
"""

import logging
import os

PRIVATE_MODE = 0o640
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


def make_private(path, mode=PRIVATE_MODE):
    """Create ``path`` (empty) with ``mode`` if it does not exist; take the world's bits off it (and off
    SQLite's companion files beside it) if it does and we own it. Never raises for a file we cannot change."""
    path = str(path)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
        return
    except FileExistsError:
        pass
    except OSError:
        return  # the open that follows says what is wrong
    for name in (path,) + tuple(path + suffix for suffix in SQLITE_COMPANIONS):
        try:
            info = os.stat(name)
            if info.st_uid == os.geteuid() and info.st_mode & 0o007:
                os.chmod(name, info.st_mode & 0o770)
        except OSError:
            pass


_CONTROL = {c: f"\\x{c:02x}" for c in list(range(32)) + [127]}
_CONTROL.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})


def escape_controls(text):
    """``text`` with newlines and other control characters written as escapes: one line stays one line."""
    return str(text).translate(_CONTROL)


class OneLineFormatter(logging.Formatter):
    """A formatter whose message part cannot span lines (a traceback, added after it, still does)."""

    def formatMessage(self, record):
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


def private_log_handler(path):
    """A FileHandler on ``path`` created 0640, with :class:`OneLineFormatter`."""
    make_private(path)
    handler = logging.FileHandler(path)
    handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(message)s"))
    return handler
