"""Reading ``/proc``: process ids, a process's environment, its parent, its start time.

Shared by the collectors (which job owns a GPU process), the local cluster (which processes carry
its marker) and the fake GPU jobs (who else runs on their GPU). Every read tolerates a process that
exits in between. No imports from the rooms.
"""

import os
import time


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


def _stat_fields(pid, proc_root="/proc"):
    """Fields 3.. of ``/proc/PID/stat`` (state, ppid, ...), or None if the process is gone."""
    data = read_proc_file(f"{proc_root}/{pid}/stat")
    if not data:
        return None
    # The command name (field 2) may hold spaces and parentheses; the rest follows the last ')'.
    return data[data.rfind(b")") + 2:].split()


def parent_pid(pid, proc_root="/proc"):
    fields = _stat_fields(pid, proc_root)
    try:
        return int(fields[1]) if fields and len(fields) > 1 else None
    except ValueError:
        return None


def start_time(pid, proc_root="/proc"):
    """Epoch seconds at which ``pid`` started (clock-tick resolution, 10 ms), or None if it is gone.

    ``/proc/PID/stat`` counts clock ticks since boot; ``btime`` is whole seconds, so the epoch is taken
    from the boot clock instead. An ``exec`` keeps the process and its start time.
    """
    fields = _stat_fields(pid, proc_root)
    if not fields or len(fields) < 20:
        return None
    try:
        since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except ValueError:
        return None
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


class EnvironWatch:
    """The environments of this machine's processes, re-reading only those that may still change.

    For callers that look every fraction of a second (the fake GPU jobs): ``classify(env)`` says
    what a process is: True (wanted; its environment is final), False (not wanted) or None (not
    yet: it may still ``exec`` into a wanted one, e.g. a job's shell; read again next time). A process
    not wanted is read again for ``settle_s`` after it was first seen (a freshly forked process
    carries its parent's environment until it execs), then no more. ``scan()`` returns
    {pid: env} of the wanted processes alive now. A PID that disappears is forgotten, so a PID
    reused later is read afresh (reuse between two scans would need the kernel to run through
    every PID in between).
    """

    def __init__(self, classify, proc_root="/proc", settle_s=1.0, clock=time.monotonic):
        self.classify = classify
        self.proc_root = proc_root
        self.settle_s = settle_s
        self.clock = clock
        self._known = {}  # pid -> (verdict, env or None, first seen)

    def scan(self):
        now = self.clock()
        alive = list_pids(self.proc_root)
        known = {}
        wanted = {}
        for pid in alive:
            entry = self._known.get(pid)
            if entry is not None and (entry[0] is True or
                                      (entry[0] is False and now - entry[2] >= self.settle_s)):
                known[pid] = entry
            else:
                env = read_environ(pid, self.proc_root)
                verdict = self.classify(env) if env is not None else False
                known[pid] = (verdict, env if verdict else None, entry[2] if entry else now)
            if known[pid][0] is True:
                wanted[pid] = known[pid][1]
        self._known = known
        return wanted
