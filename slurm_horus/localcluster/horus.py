"""horusd and the sample receiver on the local cluster: their site file and their start (stopped by
PID like every daemon).

The receiver (``horus receive``) stands for the head node's end of network shipping. A real site has
one munged per node, whose credentials carry the node's address; here every node gets its own munged
too (same key, its own socket ``munge/<node>.socket``) with ``--origin 127.0.0.<i+2>``, and the site
file's ``ship_nodes`` map says which address is which node, so a collector that claims another node
is refused exactly as on a real site.
"""

import os
import pwd
import subprocess
import sys
import time

from ..private import make_private
from ..service import protocol
from . import procs

# What the local cluster runs by default: co-location through typed shards, our flagship policy.
DEFAULT_SETTINGS = {
    "binding": "shard",
    "policy": "horus",
    "refresh_s": "1",
    "timeout_ms": "100",
    "gpu_type": "v100",
}


def write_config(path, layout, settings):
    values = dict(DEFAULT_SETTINGS)
    values.update({k: str(v) for k, v in settings.items()})
    values.setdefault("socket", str(layout.run / "horusd.sock"))
    values.setdefault("db", str(layout.root / "horus.db"))
    values.setdefault("disable_file", str(layout.etc / "horus.disabled"))
    lines = ["# slurm-horus site file of this local cluster (written by horus local-cluster)"]
    lines += [f"{key} = {value}" for key, value in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return values


def node_origin(index):
    """The address node number ``index`` (0-based) signs its munge credentials with."""
    return f"127.0.0.{index + 2}"


def receiver_settings(layout, port, node_names):
    """Site-file settings of the receiver (and its node map file, written here)."""
    node_file = layout.etc / "horus-nodes"
    node_file.write_text("# node  address its munged signs with (--origin)\n" + "".join(
        f"{name} {node_origin(i)}\n" for i, name in enumerate(node_names)))
    users = ["root"]
    for name in ("nobody",):  # an unprivileged collector, as a site runs it
        try:
            pwd.getpwnam(name)
            users.append(name)
        except KeyError:
            pass
    if os.getuid() != 0:
        users.append(str(os.getuid()))
    return {
        "receive_listen": f"127.0.0.1:{port}",
        "ship_to": f"http://127.0.0.1:{port}",
        "munge_socket": str(layout.munge_socket),
        "ship_nodes": str(node_file),
        "ship_users": ",".join(users),
    }


def start_receiver(cluster, timeout):
    """One munged per node (each signing with its node's address), then ``horus receive``."""
    from ..collect.shipping import receiver_reachable
    from .prereq import find_program

    layout = cluster.layout
    munged = find_program("munged")
    for index, name in enumerate(cluster.node_names()):
        socket_path = layout.node_munge_socket(name)
        cluster._start_daemonizing(
            f"munged-{name}",
            [munged, f"--key-file={layout.munge / 'munge.key'}", f"--socket={socket_path}",
             f"--pid-file={layout.munge / f'munged-{name}.pid'}", f"--log-file={layout.munge / f'munged-{name}.log'}",
             f"--seed-file={layout.munge / f'munged-{name}.seed'}", f"--origin={node_origin(index)}",
             "--num-threads=1"],
            layout.munge / f"munged-{name}.pid", layout.munge / f"munged-{name}.log")
    url = f"http://127.0.0.1:{cluster.ports['receiver']}"
    return _start_service(cluster, "receiver", "receive", "horus receive",
                          lambda: receiver_reachable(url, timeout_s=0.5), timeout)


def _cluster_error(message):
    from .cluster import ClusterError  # cluster.py imports this module

    return ClusterError(message)


def _exit_error(what, code, log, stdout):
    """Why a service exited during start-up: a PortClash (the cluster starts again on fresh ports, as
    for a Slurm daemon) when it could not listen on its port, else a ClusterError."""
    from .cluster import PortClash, _log_says_port_in_use

    message = f"{what} exited during start-up (exit {code}); see {log} and {stdout}"
    if _log_says_port_in_use(stdout) or _log_says_port_in_use(log):
        return PortClash(f"{what}: port in use ({message})")
    return _cluster_error(message)


def start_horusd(cluster, timeout):
    """Start ``horus serve`` in its own session; wait until it answers a ping."""

    def answers():
        reply = protocol.ask({"op": "ping"}, cluster.horus_socket, timeout_s=1.0)
        return reply is not None and reply.get("state_age_s", 99) < 30

    return _start_service(cluster, "horusd", "serve", "horusd", answers, timeout)


def start_backup_horusd(cluster, timeout):
    """The horusd beside the backup slurmctld (its own site file and socket); it starts in standby."""
    return _start_service(
        cluster, "horusd-backup", "serve", "the backup horusd",
        lambda: protocol.ask({"op": "ping"}, cluster.backup_horus_socket, timeout_s=1.0) is not None, timeout,
        config=cluster.backup_horus_config)


def _start_service(cluster, name, command, what, answers, timeout, config=None):
    """Start ``horus COMMAND --log-file log/NAME.log`` in its own session with the cluster's site file
    (or ``config``); record it as NAME; wait until ``answers()``."""
    layout = cluster.layout
    log = layout.log / f"{name}.log"
    env = cluster._daemon_env()
    env["HORUS_CONFIG"] = str(config or cluster.horus_config)
    make_private(layout.log / f"{name}.stdout")
    with open(layout.log / f"{name}.stdout", "ab") as out:
        # cwd: `python -m` looks in the current directory first, where another copy of slurm_horus
        # (a checkout of another version) would be run instead of this installation
        child = subprocess.Popen([sys.executable, "-m", "slurm_horus", command, "--log-file", str(log)],
                                 env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                 start_new_session=True, cwd=str(layout.root))
    cluster._children.append(child)
    cluster._record(name, child.pid)
    deadline = time.monotonic() + min(timeout, 60)
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise _exit_error(what, child.returncode, log, layout.log / f"{name}.stdout")
        if answers():
            return child.pid
        time.sleep(0.05)
    procs.stop_pids([child.pid])
    raise _cluster_error(f"{what} did not answer within {timeout:g} s; see {log}")


def wait_refreshed(cluster, timeout=30.0):
    """Wait until horusd has re-read Slurm after this moment, so that its state shows the jobs Slurm
    has started or ended by now. refresh_s is 1 s here, but horusd stretches the interval to 20x what
    a refresh costs (a loaded machine, a Slurm whose --json commands take longer), so a fixed sleep
    does not do. Returns the seconds waited; raises ClusterError after ``timeout``."""
    since = time.monotonic()
    time.sleep(0.1)
    while time.monotonic() - since < timeout:
        reply = protocol.ask({"op": "ping"}, cluster.horus_socket, timeout_s=2.0)
        if reply is not None and reply.get("state_age_s", timeout) < time.monotonic() - since - 0.05:
            return time.monotonic() - since
        time.sleep(0.1)
    raise _cluster_error(f"horusd did not refresh its cluster state within {timeout:g} s")
