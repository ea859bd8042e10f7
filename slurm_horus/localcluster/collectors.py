"""Stand-in NVML collectors for a local cluster: one ``horus collect --backend standin`` per node.

As a site runs ``horus collect`` on each GPU node: each collector samples its node's fake GPUs (the
fake jobs' processes, ``slurm_horus/collect/nvml.py``) into a spool and ships it into ``db``.
``stop()`` ends them and ships what was not shipped yet. Used by ``horus demo`` and ``horus replay``.
"""

import subprocess
import sys


class StandinCollectors:
    """``db_path``: ship straight into this history database; or ``ship_to(node)``: the arguments that
    ship a node's batches elsewhere (the demo: ``--ship-to`` the cluster's receiver, signed by the
    node's munged)."""

    def __init__(self, cluster, db_path=None, interval_s=1.0, ship_every_s=5.0, env=None, ship_to=None):
        self.cluster = cluster
        self.db_path = None if db_path is None else str(db_path)
        self.ship_to = ship_to
        self.interval_s = interval_s
        self.ship_every_s = ship_every_s
        self.env = dict(cluster.env if env is None else env)
        self.running = []  # (spool path, node, Popen)

    def _horus(self, args, **kwargs):
        return [sys.executable, "-m", "slurm_horus", *args], dict(env=self.env, **kwargs)

    def _destination(self, node):
        return self.ship_to(node) if self.ship_to is not None else ["--db", self.db_path]

    def start(self):
        for node in self.cluster.node_names():
            spool = self.cluster.root / "run" / f"collect-{node}.db"
            argv, kwargs = self._horus(
                ["collect", "--backend", "standin", "--node", node, "--gpus", str(self.cluster.gpus),
                 "--interval", f"{self.interval_s:g}", "--spool", str(spool), "--ship-every",
                 f"{self.ship_every_s:g}", "--slurm-conf", str(self.cluster.slurm_conf)] + self._destination(node),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                cwd=str(self.cluster.root))  # python -m looks in the current directory first
            self.running.append((spool, node, subprocess.Popen(argv, **kwargs)))
        return self

    def stop(self, ship=True):
        """Stop every collector; ship what its spool still holds (unless ``ship`` is false)."""
        running, self.running = self.running, []
        for _spool, _node, process in running:
            process.terminate()
        for spool, node, process in running:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if ship and spool.exists():
                argv, kwargs = self._horus(["collect", "--ship", "--spool", str(spool)] + self._destination(node),
                                           capture_output=True, timeout=120, cwd=str(self.cluster.root))
                subprocess.run(argv, **kwargs)

    def kill(self):
        """Stop at once, shipping nothing (an interrupted run)."""
        for _spool, _node, process in self.running:
            process.kill()
            process.wait()
        self.running = []

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()
