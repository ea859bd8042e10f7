"""Processes and ports of a local cluster: free ports, PIDs, and stopping by PID only.

Other clusters (other users, other test sessions) may run the very same binaries on this machine, so
nothing here ever looks a process up by name: a PID is trusted only when ``/proc/PID/environ``
carries this cluster's marker variable (every daemon is started with it).
"""

import os
import random
import signal
import socket
import time
from pathlib import Path

from ..proc import list_pids, parent_pid, read_environ

MARKER_VAR = "HORUS_LOCAL_CLUSTER"
PORT_RANGE = (20000, 60000)
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def port_range(path=EPHEMERAL_RANGE_FILE):
    """Where the daemons' ports are drawn: below the kernel's ephemeral range when there is room.

    A port picked free may be taken before its daemon binds it (a second or more later, after the
    daemons before it), and the busiest takers are the outgoing connections of the cluster itself
    (every scontrol, sbatch and slurmd RPC), whose local ports the kernel draws from that range: a
    sample receiver lost its port to one once in CI. A clash is still survived (the cluster starts
    again on fresh ports); below that range it is rare."""
    low, high = PORT_RANGE
    try:
        ephemeral_low = int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return low, high
    return (low, ephemeral_low) if ephemeral_low - low >= 4000 else (low, high)


def port_is_free(port):
    """True when nothing listens on 127.0.0.1:port and we may bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_free_ports(count, start=None, avoid=()):
    """``count`` distinct free TCP ports on 127.0.0.1, trying upwards from ``start`` (random if None).

    A port in use is skipped, so a clash with another cluster just moves us to the next one.
    """
    low, high = port_range()
    port = start if start is not None else random.randrange(low, high - 1000)
    chosen = []
    avoid = set(avoid)
    tries = 0
    while len(chosen) < count:
        tries += 1
        if tries > 5000:
            raise RuntimeError("no free TCP ports found on 127.0.0.1")
        if port >= 65535:
            port = low
        if port not in avoid and port_is_free(port):
            chosen.append(port)
        port += 1
    return chosen


def pid_alive(pid):
    """True when PID exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state letter follows the command name in parentheses.
    return status.rsplit(")", 1)[1].split()[0] != "Z"


def belongs_to(pid, marker):
    """True when PID runs with ``HORUS_LOCAL_CLUSTER=<marker>`` in its environment."""
    return (read_environ(pid) or {}).get(MARKER_VAR) == marker


def marked_processes(marker):
    """Every live process started for this cluster (it carries the marker), plus its descendants.

    Job steps (slurmstepd) inherit slurmd's environment, hence the marker; the job's own processes
    have the submitter's environment but are slurmstepd's descendants.
    """
    pids = list_pids()
    parents = {pid: parent_pid(pid) for pid in pids}
    found = {pid for pid in pids if belongs_to(pid, marker)}
    grew = True
    while grew:
        children = {pid for pid, ppid in parents.items() if ppid in found and pid not in found}
        grew = bool(children)
        found |= children
    found.discard(os.getpid())
    return sorted(pid for pid in found if pid_alive(pid))


def signal_pid(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pids, timeout):
    """Wait until none of ``pids`` is alive; return the ones still alive at the timeout."""
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if pid_alive(p)]
    return alive


def stop_pids(pids, timeout=10.0):
    """SIGTERM, wait, then SIGKILL what is left; return PIDs that survived even that."""
    pids = [p for p in pids if p and pid_alive(p)]
    for pid in pids:
        signal_pid(pid, signal.SIGTERM)
    left = wait_gone(pids, timeout)
    for pid in left:
        signal_pid(pid, signal.SIGKILL)
    return wait_gone(left, 5.0)


def read_pid_file(path, wait_s=0.0):
    """The PID in ``path``, waiting up to ``wait_s`` for it to appear; None if absent."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            text = Path(path).read_text().strip()
            if text:
                return int(text.split()[0])
        except (OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)
