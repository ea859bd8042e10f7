"""horusd on the local cluster: its site file and its start (stopped by PID like every daemon)."""

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


def _cluster_error(message):
    from .cluster import ClusterError  # cluster.py imports this module

    return ClusterError(message)


def start_horusd(cluster, timeout):
    """Start ``horus serve`` in its own session; wait until it answers a ping."""
    layout = cluster.layout
    log = layout.log / "horusd.log"
    env = cluster._daemon_env()
    env["HORUS_CONFIG"] = str(cluster.horus_config)
    make_private(layout.log / "horusd.stdout")
    with open(layout.log / "horusd.stdout", "ab") as out:
        # cwd: `python -m` looks in the current directory first, where another copy of slurm_horus
        # (a checkout of another version) would be run instead of this installation
        child = subprocess.Popen([sys.executable, "-m", "slurm_horus", "serve", "--log-file", str(log)],
                                 env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                 start_new_session=True, cwd=str(layout.root))
    cluster._children.append(child)
    cluster._record("horusd", child.pid)
    deadline = time.monotonic() + min(timeout, 60)
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise _cluster_error(f"horusd exited during start-up (exit {child.returncode}); see {log} "
                               f"and {layout.log / 'horusd.stdout'}")
        reply = protocol.ask({"op": "ping"}, cluster.horus_socket, timeout_s=1.0)
        if reply is not None and reply.get("state_age_s", 99) < 30:
            return child.pid
        time.sleep(0.05)
    procs.stop_pids([child.pid])
    raise _cluster_error(f"horusd did not answer within {timeout:g} s; see {log}")
