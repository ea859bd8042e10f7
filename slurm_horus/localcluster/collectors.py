"""Stand-in NVML collectors for a local cluster: one ``horus collect --backend standin`` per node.

As a site runs ``horus collect`` on each GPU node: each collector samples its node's fake GPUs (the
fake jobs' processes, ``slurm_horus/collect/nvml.py``) into a spool and ships it into ``db``.
``stop()`` ends them and ships what was not shipped yet. Used by ``horus demo`` and ``horus replay``.
"""

import subprocess
import sys


class StandinCollectors:
    def __init__(self, cluster, db_path, interval_s=1.0, ship_every_s=5.0, env=None):
        self.cluster = cluster
        self.db_path = str(db_path)
        self.interval_s = interval_s
        self.ship_every_s = ship_every_s
        self.env = dict(cluster.env if env is None else env)
        self.running = []  # (spool path, Popen)

    def _horus(self, args, **kwargs):
        return [sys.executable, "-m", "slurm_horus", *args], dict(env=self.env, **kwargs)

    def start(self):
        for node in self.cluster.node_names():
            spool = self.cluster.root / "run" / f"collect-{node}.db"
            argv, kwargs = self._horus(
                ["collect", "--backend", "standin", "--node", node, "--gpus", str(self.cluster.gpus),
                 "--interval", f"{self.interval_s:g}", "--spool", str(spool), "--ship-every",
                 f"{self.ship_every_s:g}", "--db", self.db_path, "--slurm-conf", str(self.cluster.slurm_conf)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                cwd=str(self.cluster.root))  # python -m looks in the current directory first
            self.running.append((spool, subprocess.Popen(argv, **kwargs)))
        return self

    def stop(self, ship=True):
        """Stop every collector; ship what its spool still holds (unless ``ship`` is false)."""
        running, self.running = self.running, []
        for _spool, process in running:
            process.terminate()
        for spool, process in running:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if ship and spool.exists():
                argv, kwargs = self._horus(["collect", "--ship", "--spool", str(spool), "--db", self.db_path],
                                           capture_output=True, timeout=120, cwd=str(self.cluster.root))
                subprocess.run(argv, **kwargs)

    def kill(self):
        """Stop at once, shipping nothing (an interrupted run)."""
        for _spool, process in self.running:
            process.kill()
            process.wait()
        self.running = []

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()
