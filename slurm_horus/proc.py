"""Reading ``/proc``: process ids, a process's environment, its parent.

Shared by the collectors (which job owns a GPU process) and the local cluster (which processes carry
its marker). Every read tolerates a process that exits in between. No imports from the rooms.
"""

import os


def list_pids(proc_root="/proc"):
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit()]


def read_proc_file(path):
    """The bytes of a /proc file, or None if the process vanished or is not ours to read."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def read_environ(pid, proc_root="/proc"):
    """The environment of ``pid`` as a dict, or None if it is gone or unreadable."""
    if not pid:
        return None
    data = read_proc_file(f"{proc_root}/{pid}/environ")
    if data is None:
        return None
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def parent_pid(pid, proc_root="/proc"):
    data = read_proc_file(f"{proc_root}/{pid}/stat")
    if not data:
        return None
    # The command name (field 2) may hold spaces and parentheses; ppid follows the last ')'.
    fields = data[data.rfind(b")") + 2:].split()
    try:
        return int(fields[1]) if len(fields) > 1 else None
    except ValueError:
        return None
