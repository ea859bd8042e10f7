"""A backup controller on one machine: ``LocalCluster(backup_controller=True)``.

Slurm 22.05's slurmctld listens on ``SlurmctldPort`` on every address (measured: the standby backup
bound 0.0.0.0), there is one port for all controllers, and a controller knows which ``SlurmctldHost``
it is from its host name. Two slurmctld on one host therefore cannot both listen, and even one
alone answers at the other's address (a lone backup pinged "the primary" at 127.0.0.1 and reached
itself, so it never took over). So the backup gets a host of its own: a network and UTS namespace
(``unshare --net --uts``) named ``horusbackup``, joined to this host by a veth pair on a private /30:

* this host (the primary's side): ``10.213.K.1`` -- the primary's address and every node's NodeAddr
  (slurmd listens on every address, and the backup must reach the nodes from its namespace);
* the backup's side: ``10.213.K.2`` -- ``SlurmctldHost=horusbackup(10.213.K.2)``.

The backup slurmctld runs in that namespace (and a mount namespace, where its own pid and log files
are bind-mounted over the primary's, so both read the very same slurm.conf), with in its environment
the site file of its own horusd (``horusd-backup``: its own
socket, ``controller_host = horusbackup``), whose job_submit.lua asks that horusd. Both horusd run on
this host (a Unix socket is all their slurmctld needs); each follows ``scontrol ping``.

Everything is stopped by PID like the other daemons; the namespace goes with its holder process
(``backuphost``), and the veth pair with the namespace. Needs root, ``unshare``, ``nsenter`` and ``ip``.
"""

import os
import random
import shutil
import socket
import subprocess
import time

from . import procs

BACKUP_HOST = "horusbackup"
SLURMCTLD_TIMEOUT_S = 6  # how long the backup waits for a silent primary before it takes over


def _error(message):
    from .cluster import ClusterError  # cluster.py imports this module

    return ClusterError(message)


def primary_host():
    return socket.gethostname().split(".")[0]


def _run(argv):
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise _error(f"backup host: {' '.join(argv)} failed: {(result.stderr or result.stdout).strip()[:300]}")
    return result.stdout


def _used_subnets():
    text = subprocess.run(["ip", "-brief", "addr"], capture_output=True, text=True).stdout
    return {int(word.split(".")[2]) for word in text.split() if word.startswith("10.213.")}


def create(cluster):
    """Start the holder of the backup's namespaces, wire it to this host; returns
    ``{"holder": pid, "here": this host's address, "there": the backup's, "veth": name}``. The holder
    is recorded as ``backuphost``."""
    if os.getuid() != 0:
        raise _error("a backup controller needs root (network namespaces)")
    missing = [p for p in ("unshare", "nsenter", "ip") if shutil.which(p) is None]
    if missing:
        raise _error(f"a backup controller needs {', '.join(missing)} (packages util-linux, iproute2)")
    holder = subprocess.Popen(["unshare", "--net", "--uts", "--mount", "sleep", "infinity"], env=cluster._daemon_env(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    cluster._children.append(holder)
    cluster._record("backuphost", holder.pid)
    deadline = time.monotonic() + 10
    # never touch a namespace that is ours: unshare may not have switched yet
    while os.readlink(f"/proc/{holder.pid}/ns/net") == os.readlink("/proc/self/ns/net") or \
            os.readlink(f"/proc/{holder.pid}/ns/uts") == os.readlink("/proc/self/ns/uts"):
        if holder.poll() is not None or time.monotonic() > deadline:
            raise _error("backup host: unshare --net --uts did not start (no namespaces here?)")
        time.sleep(0.02)
    free = sorted(set(range(1, 255)) - _used_subnets())
    if not free:
        raise _error("backup host: no free 10.213.K.0/30 subnet")
    k = random.choice(free)
    here, there = f"10.213.{k}.1", f"10.213.{k}.2"
    outer, inner = f"hx{holder.pid % 100000}a", f"hx{holder.pid % 100000}b"
    _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
    _run(["ip", "link", "set", inner, "netns", str(holder.pid)])
    _run(["ip", "addr", "add", f"{here}/30", "dev", outer])
    _run(["ip", "link", "set", outer, "up"])
    inside = ["nsenter", "-t", str(holder.pid), "-n", "-u", "-m"]
    _run(inside + ["hostname", BACKUP_HOST])
    # the same slurm.conf (Slurm compares its hash across daemons), but the backup's own pid and log
    # files: in its mount namespace they are bind-mounted over the primary's
    layout = cluster.layout
    for own, shared in ((layout.run / "slurmctld-backup.pid", layout.run / "slurmctld.pid"),
                        (layout.log / "slurmctld-backup.log", layout.log / "slurmctld.log")):
        own.touch()
        shared.touch()
        _run(inside + ["mount", "--bind", str(own), str(shared)])
    _run(inside + ["ip", "link", "set", "lo", "up"])
    _run(inside + ["ip", "addr", "add", f"{there}/30", "dev", inner])
    _run(inside + ["ip", "link", "set", inner, "up"])
    return {"holder": holder.pid, "here": here, "there": there, "veth": outer}


def start_slurmctld(cluster):
    """The backup slurmctld, in the backup's namespaces; it starts in standby."""
    layout = cluster.layout
    env = cluster._daemon_env()
    env["HORUS_CONFIG"] = str(cluster.backup_horus_config)
    log = layout.log / "slurmctld-backup.log"
    with open(layout.log / "slurmctld-backup.stderr", "ab") as err:
        result = subprocess.run(["nsenter", "-t", str(cluster.backup["holder"]), "-n", "-u", "-m",
                                 str(layout.bin / "slurmctld"), "-f", str(layout.slurm_conf)],
                                env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err, timeout=30)
    pid = procs.read_pid_file(layout.run / "slurmctld-backup.pid", wait_s=5.0)
    if result.returncode != 0 or pid is None:
        raise _error(f"the backup slurmctld failed to start (exit {result.returncode}); see {log}")
    cluster._record("slurmctld-backup", pid)
    return pid
