"""A private, throw-away Slurm cluster with fake GPUs on one machine.

``LocalCluster(...).up()`` starts munged, optionally MariaDB + slurmdbd, slurmctld and one slurmd
per node, all under one directory, on free ports, and records every daemon's PID in a JSON state
file there. ``down()`` cancels the jobs, waits for the queue to drain, and stops the daemons by PID.
The daemons outlive the Python process that started them (``horus local-cluster up`` exits at
once); ``LocalCluster.attach(dir)`` picks a running cluster up again from its state file.

``slurm`` picks the Slurm it runs (:mod:`.chroot`): the system's (Debian 12: 22.05), or 24.11 / 26.05
from a Debian chroot; ``env`` then puts that Slurm's client commands first on ``PATH``.
"""

import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from ..errors import HorusError, InputError
from ..resources import resource_path
from ..slurm import queries
from ..slurm.runner import SlurmCommandError, run_slurm
from . import backup as backup_host
from . import files, procs
from . import horus as horus_local
from .chroot import SYSTEM, SystemSlurm, slurm_install
from .prereq import check_prerequisites, find_program

STATE_FILE = "cluster.json"
DEFAULT_NODES = 4
DEFAULT_GPUS = 4
DEFAULT_CLUSTER_NAME = "horus"
MUNGE_SOCKET_NAME = "munge.socket.2"
EPILOG_NAME = "horus_epilog.lua"  # job_submit_lua/: tells horusd each job's end (EpilogSlurmctld)
# Longest usable AF_UNIX path on Linux is 107 bytes; munged and mariadbd put sockets in the dir.
MAX_SOCKET_PATH = 107
PORT_ATTEMPTS = 4
# Bump when what the golden DB holds changes (schema set-up, users), so old caches are not reused.
GOLDEN_FORMAT = "golden-v3"
# A throw-away DB: a small redo log keeps each cluster's copy (and the copying) small, and
# durability is traded for speed (slurmdbd's schema set-up and TRES inserts commit a lot).
MARIADB_SIZE_OPTIONS = ("--innodb-buffer-pool-size=64M", "--innodb-log-file-size=16M",
                        "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0", "--sync-binlog=0")
TERMINAL_STATES = {
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "TIMEOUT",
}


class ClusterError(HorusError):
    """The local cluster failed to start or stop; the message points at the log to read."""


class PortClash(ClusterError):
    """A daemon found its port taken between our check and its bind; the caller retries."""


class ClusterLayout:
    """Where everything of one cluster lives under its root directory."""

    SUBDIRS = ("etc", "state", "log", "run", "spool", "munge", "dev", "bin", "db", "jobs")

    def __init__(self, root):
        self.root = Path(root).resolve()
        for name in self.SUBDIRS:
            setattr(self, name, self.root / name)
        self.slurm_conf = self.etc / "slurm.conf"
        self.munge_socket = self.munge / MUNGE_SOCKET_NAME
        self.state_file = self.root / STATE_FILE
        self.db_data = self.db / "data"
        self.db_socket = self.db / "mysqld.sock"

    def gpu_device(self, node, index):
        return self.dev / node / f"nvidia{index}"

    def node_munge_socket(self, node):
        """The socket of the munged that stands for ``node``'s own (see ``horus.start_receiver``)."""
        return self.munge / f"{node}.socket"


def golden_cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "slurm-horus"


def _golden_key(cluster_name, db_install, install):
    """Cache key of the golden DB: the cluster name and the exact MariaDB/slurmdbd binaries."""
    parts = [GOLDEN_FORMAT, cluster_name]
    for program, install in (("mariadbd", db_install), ("slurmdbd", install)):
        path = install.real_program(program)
        info = os.stat(install.host_path(path)) if path else None
        parts.append(f"{program}:{info.st_size}:{int(info.st_mtime)}" if info else program)
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]


def poll(predicate, timeout, step=0.2):
    """True as soon as ``predicate()`` is, False once ``timeout`` seconds passed (tests, benchmarks)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def _wait_until(predicate, timeout, what, log_hint=None, poll=0.05):
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            hint = f" (see {log_hint})" if log_hint else ""
            raise ClusterError(f"timed out after {timeout:g} s waiting for {what}{hint}")
        time.sleep(poll)


def _tcp_listening(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _log_says_port_in_use(path):
    try:
        return "Address already in use" in Path(path).read_text(errors="replace")
    except OSError:
        return False


# What slurmdbd 24.11/26.05 (Debian's builds) log before they stop against a MariaDB 11.8.9 server.
MARIADB_MISMATCH = "_check_mysql_concat_is_sane: null result"


def accounting_failure(log_text):
    """One line saying why slurmdbd stopped, when it is the known MariaDB mismatch; else None."""
    if MARIADB_MISMATCH not in log_text:
        return None
    server = re.search(r"MySQL server version is: (\S+)", log_text)
    return (f"accounting unavailable: this slurmdbd stops at start-up against MariaDB "
            f"{server.group(1) if server else '(unknown version)'} ({MARIADB_MISMATCH}), a mismatch between "
            "Debian's slurmdbd and MariaDB 11.8 packages; run it against MariaDB 10.11 (Debian 12's "
            "mariadb-server, as horus local-cluster does) or start the cluster without --with-dbd")


def validate_lua(path):
    """``luac5.1 -p``: a broken job_submit.lua at slurmctld start-up is fatal, so check it first."""
    luac = find_program("luac5.1") or find_program("luac")
    if luac is None:
        raise ClusterError("luac5.1 not found (package lua5.1): cannot validate job_submit.lua")
    result = subprocess.run([luac, "-p", str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        message = result.stderr.strip().replace(luac + ": ", "")
        raise InputError(f"invalid job_submit.lua: {message}")


class LocalCluster:
    """One local cluster. See the module docstring; ``docs/local-cluster.md`` has the details."""

    def __init__(self, directory=None, nodes=DEFAULT_NODES, gpus=DEFAULT_GPUS, with_dbd=False,
                 job_submit_lua=None, cluster_name=DEFAULT_CLUSTER_NAME, base_port=None,
                 use_golden_db=True, horus=False, horus_settings=None, job_submit_plugin=True,
                 partitions=None, extra_conf=(), cred_expire=None, slurm=None, backup_controller=False,
                 shards_per_gpu=files.SHARDS_PER_GPU, ended_epilog=True):
        if nodes < 1 or gpus < 1:
            raise InputError("a local cluster needs at least 1 node and 1 GPU per node")
        self.temporary = directory is None
        self.directory = directory
        self.nodes = nodes
        self.gpus = gpus
        self.with_dbd = with_dbd
        self.job_submit_lua = Path(job_submit_lua) if job_submit_lua else None
        self.cluster_name = cluster_name
        self.base_port = base_port
        self.use_golden_db = use_golden_db
        # horus: also run horusd and install the placing job_submit.lua (else the logging-only one)
        self.horus = horus
        self.horus_settings = dict(horus_settings or {})
        self.job_submit_plugin = job_submit_plugin  # False: no JobSubmitPlugins line (a baseline)
        self.partitions = partitions  # PartitionName= lines (default: "debug" over all nodes)
        self.extra_conf = list(extra_conf)  # more slurm.conf lines (e.g. preemption)
        # with horus: EpilogSlurmctld = horus_epilog.lua beside job_submit.lua (horusd hears of each job end)
        self.ended_epilog = ended_epilog
        self.cred_expire = cred_expire  # seconds; also the wait of a requeued job (Slurm's default 120)
        # which Slurm: a name (system, 24.11, 26.05; None: $HORUS_LOCAL_SLURM or system) or a SlurmInstall
        self.install = slurm_install(slurm) if slurm is None or isinstance(slurm, str) else slurm
        self.mounts = []  # mounts made for this cluster alone (a chroot's view of a dir outside /tmp)
        # MariaDB is always the host's. slurmdbd 24.11 and 26.05 as Debian builds them stop at start-up
        # against their own suite's MariaDB 11.8.9 server (see docs/local-cluster.md); against the
        # host's MariaDB 10.11 (Debian 12) they work. slurmdbd talks to it over TCP only.
        self.db_install = SystemSlurm()
        self._version = None  # slurm_version(), once asked
        # a second SlurmctldHost in a namespace of its own, with its own horusd (see backup.py)
        self.backup_controller = backup_controller
        if backup_controller and self.install.bin_dir is not None:
            # the backup runs the host's slurmctld binary in its namespaces, and its pid and log files
            # are bind-mounted over in that host view: neither is what a chroot's slurmctld would see
            raise InputError(f"a backup controller runs with the system's Slurm only, not Slurm {self.install.name}")
        self.backup = None  # {"holder", "here", "there", "veth"} once created
        self.shards_per_gpu = int(shards_per_gpu)  # gres.conf Count= of each GPU's shard line
        self.layout = ClusterLayout(directory) if directory is not None else None
        self.ports = {}
        self.daemons = []  # [{"name", "pid"}], in start order
        self.timings = {}
        self._children = []  # Popen objects of non-daemonizing children (mariadbd), for reaping

    # ----------------------------------------------------------------- public API
    @property
    def root(self):
        return self.layout.root

    @property
    def slurm_conf(self):
        return self.layout.slurm_conf

    @property
    def marker(self):
        return str(self.layout.root)

    @property
    def env(self):
        """Our environment with ``SLURM_CONF`` pointing at this cluster (for subprocesses)."""
        env = self.install.env(dict(os.environ))
        env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    @property
    def horus_config(self):
        return self.layout.etc / "horus.conf"

    @property
    def horus_socket(self):
        return str(self.layout.run / "horusd.sock")

    @property
    def backup_horus_config(self):
        return self.layout.etc / "horus-backup.conf"

    @property
    def backup_horus_socket(self):
        return str(self.layout.run / "horusd-backup.sock")

    @property
    def ship_to(self):
        """URL of the cluster's sample receiver, or None when it runs none."""
        port = self.ports.get("receiver")
        return f"http://127.0.0.1:{port}" if port else None

    def export_line(self):
        """The shell line that points Slurm's commands and horus's (``horus doctor``, ``horus-sbatch``,
        ``horus report``, ``horus collect``) at this cluster: SLURM_CONF, HORUS_CONFIG when horusd runs
        here, HORUS_SHIP_TO when the sample receiver does, and a chroot Slurm's commands first on PATH."""
        line = f"export SLURM_CONF={shlex.quote(str(self.slurm_conf))}"
        if self.horus_config.exists():
            line += f" HORUS_CONFIG={shlex.quote(str(self.horus_config))}"
        if self.ship_to:
            line += f" HORUS_SHIP_TO={shlex.quote(self.ship_to)}"
        if self.install.bin_dir is not None:
            line += f' PATH={shlex.quote(str(self.install.bin_dir))}:"$PATH"'
        return line

    def node_names(self):
        return files.node_names(self.nodes)

    def run(self, argv, **kwargs):
        """Run a Slurm CLI against this cluster (see :func:`slurm_horus.slurm.runner.run_slurm`)."""
        kwargs.setdefault("env", self.env)
        return run_slurm(argv, slurm_conf=self.slurm_conf, **kwargs)

    def sbatch(self, args=(), script="#!/bin/sh\ntrue\n"):
        """Submit ``script`` with ``sbatch --parsable args``; return the job id.

        Output goes to ``<dir>/jobs/slurm-<id>.out`` unless ``args`` name ``--output``.
        """
        args = list(args)
        if not any(str(a).startswith(("--output", "-o")) for a in args):
            args.append(f"--output={self.layout.jobs}/slurm-%j.out")
        if not any(str(a).startswith(("--chdir", "-D")) for a in args):
            args.append(f"--chdir={self.layout.jobs}")
        return queries.submit_batch(args, script, slurm_conf=self.slurm_conf, env=self.env)

    def job_output(self, job_id):
        return (self.layout.jobs / f"slurm-{job_id}.out").read_text()

    def job_states(self, job_ids=None):
        """{job id: state} of the jobs slurmctld still knows (completed ones for MinJobAge)."""
        argv = ["squeue", "-h", "-t", "all", "-o", "%i %T"]
        if job_ids:
            argv += ["-j", ",".join(str(j) for j in job_ids)]
        states = {}
        for line in self.run(argv).stdout.splitlines():
            job_id, _, state = line.strip().partition(" ")
            if job_id.isdigit():
                states[int(job_id)] = state
        return states

    def wait_jobs(self, job_ids, timeout=60.0, states=TERMINAL_STATES):
        """Wait until every job in ``job_ids`` is in one of ``states``; return {id: state}."""
        job_ids = [int(j) for j in job_ids]

        def reached():
            current = self.job_states(job_ids)
            if all(current.get(j) in states for j in job_ids):
                return current
            return None

        return _wait_until(reached, timeout, f"jobs {job_ids} to reach {sorted(states)}",
                           self.layout.log / "slurmctld.log", poll=0.1)

    def nodes_info(self):
        return queries.sinfo(self.slurm_conf, env=self.env)

    def queue(self):
        return queries.squeue(self.slurm_conf, env=self.env)

    def accounting(self, job_ids=None):
        return queries.sacct(job_ids, slurm_conf=self.slurm_conf, env=self.env)

    def slurm_version(self):
        """The version of the Slurm this cluster runs (``scontrol version``, asked once)."""
        if self._version is None:
            self._version = queries.slurm_version(self.slurm_conf, env=self.env)
        return self._version

    def install_job_submit(self, lua_file):
        """Validate ``lua_file`` and copy it beside slurm.conf as job_submit.lua.

        slurmctld reloads the script at the next submission when its mtime (whole seconds) is later
        than the time it last loaded one, so the copy's mtime is set one second ahead: a file
        replaced in the same second as the last load is still picked up.
        """
        validate_lua(lua_file)
        target = self.layout.etc / "job_submit.lua"
        previous = target.stat().st_mtime if target.exists() else 0
        tmp = target.with_suffix(".lua.tmp")
        shutil.copyfile(lua_file, tmp)
        os.replace(tmp, target)
        bumped = max(time.time() + 1.0, previous + 1.0)
        os.utime(target, (bumped, bumped))
        return target

    def fail_over(self, timeout=60.0, sig=15):
        """The primary slurmctld stops (``sig``: SIGTERM, a controller shut down; SIGKILL, a crash, loses
        what it had not saved yet); wait until the backup is in control (``scontrol ping`` says so and
        squeue answers). Returns the seconds it took."""
        if self.backup is None:
            raise ClusterError("this cluster has no backup controller")
        began = time.monotonic()
        for daemon in self.daemons:
            if daemon["name"] == "slurmctld" and self._daemon_alive(daemon):
                procs.signal_pid(daemon["pid"], sig)
                procs.wait_gone([daemon["pid"]], 30)

        def backup_in_control():
            ping = self._poll(["scontrol", "ping"])
            if ping is None or f"at {backup_host.BACKUP_HOST} is UP" not in ping.stdout:
                return False
            squeue = self._poll(["squeue", "-h"])
            return squeue is not None and squeue.returncode == 0

        _wait_until(backup_in_control, timeout, "the backup controller to take over",
                    self.layout.log / "slurmctld-backup.log", poll=0.5)
        return time.monotonic() - began

    # ----------------------------------------------------------------- start
    def up(self, timeout=60.0):
        """Start the whole cluster; return self. Raises ClusterError (daemons stopped again)."""
        self.install.prepare()
        check_prerequisites(with_dbd=self.with_dbd, install=self.install)
        if self.job_submit_lua is None:
            self.job_submit_lua = resource_path(
                "job_submit_lua", "job_submit.lua" if self.horus else "job_submit_logging.lua")
        validate_lua(self.job_submit_lua)
        started = time.monotonic()
        if self.layout is None:
            self.directory = tempfile.mkdtemp(prefix="horus-cluster-")
            self.layout = ClusterLayout(self.directory)
        self._prepare_directory()
        try:
            self.mounts = self.install.acquire(self.layout.root)
            self._write_state()
            self._start_with_port_retries(timeout)
        except BaseException:
            # Leave nothing running; the directory stays for its logs.
            self._stop_daemons()
            self._release_install()
            self._write_state()
            raise
        self.timings["up_s"] = round(time.monotonic() - started, 3)
        self._write_state()
        return self

    def _start_with_port_retries(self, timeout):
        last_error = None
        for _attempt in range(PORT_ATTEMPTS):
            try:
                return self._start(timeout)
            except PortClash as exc:
                last_error = exc
                self._stop_daemons()
                self.base_port = None  # next try: fresh random ports
        raise ClusterError(f"could not find free ports after {PORT_ATTEMPTS} tries: {last_error}")

    def _prepare_directory(self):
        layout = self.layout
        if layout.state_file.exists():
            previous = self.read_state(layout.root)
            alive = [d for d in previous.get("daemons", []) if self._daemon_alive(d)]
            if alive:
                raise ClusterError(f"a local cluster is already running in {layout.root} "
                                   f"(stop it with: horus local-cluster down --dir {layout.root})")
        elif layout.root.exists() and any(layout.root.iterdir()) and not self.temporary:
            unknown = [p.name for p in layout.root.iterdir() if p.name not in ClusterLayout.SUBDIRS]
            if unknown:
                raise InputError(f"--dir {layout.root} is not empty and holds no local cluster")
        longest = max(len(str(layout.munge_socket)), len(str(layout.db_socket)))
        if longest > MAX_SOCKET_PATH:
            raise InputError(f"--dir {layout.root} is too long for a Unix socket path; use a shorter one")
        layout.root.mkdir(parents=True, exist_ok=True)
        for parent in layout.root.parents:
            # munged refuses a socket below a directory that others cannot search.
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                raise InputError(f"--dir {layout.root}: {parent} is not searchable by others (munged needs "
                                 f"o+x on every directory above its socket); choose a directory under /tmp")
        for name in ClusterLayout.SUBDIRS:
            path = getattr(layout, name)
            if path.exists():
                shutil.rmtree(path)
            path.mkdir()
        # munged insists that every directory leading to its socket is world-searchable.
        for path in (layout.root, layout.munge):
            os.chmod(path, 0o755)
        for name in self.node_names():
            (layout.spool / name).mkdir()
            (layout.dev / name).mkdir()
            for k in range(self.gpus):
                # A fake GPU: a character device aliasing /dev/null (major 1, minor 3).
                os.mknod(layout.gpu_device(name, k), stat.S_IFCHR | 0o666, os.makedev(1, 3))
        # Slurm reads its role from argv[0]: start the daemons through links named exactly so.
        for program in ("slurmctld", "slurmd", "slurmstepd"):
            os.symlink(self.install.real_program(program), layout.bin / program)
        key = layout.munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        (layout.etc / "plugstack.conf").write_text("")
        self.install_job_submit(self.job_submit_lua)
        if self.horus and self.ended_epilog:
            epilog = layout.etc / EPILOG_NAME
            shutil.copyfile(resource_path("job_submit_lua", EPILOG_NAME), epilog)
            os.chmod(epilog, 0o755)

    def _choose_ports(self):
        count = 1 + self.nodes + (2 if self.with_dbd else 0) + (1 if self.horus else 0)
        ports = procs.pick_free_ports(count, start=self.base_port)
        self.ports = {"slurmctld": ports[0], "slurmd": ports[1:1 + self.nodes]}
        if self.with_dbd:
            self.ports["slurmdbd"], self.ports["mariadb"] = ports[1 + self.nodes:3 + self.nodes]
        if self.horus:
            self.ports["receiver"] = ports[-1]

    def _write_configs(self):
        layout = self.layout
        controllers, node_addr, extra = ("localhost",), "127.0.0.1", list(self.extra_conf)
        if self.horus and self.ended_epilog:
            extra.append(f"EpilogSlurmctld={layout.etc / EPILOG_NAME}")
        if self.backup is not None:
            controllers = (f"{backup_host.primary_host()}({self.backup['here']})",
                           f"{backup_host.BACKUP_HOST}({self.backup['there']})")
            node_addr = self.backup["here"]
            extra.append(f"SlurmctldTimeout={backup_host.SLURMCTLD_TIMEOUT_S}")
        layout.slurm_conf.write_text(files.slurm_conf(
            layout, self.ports, self.nodes, self.gpus, self.cluster_name, self.with_dbd,
            job_submit_plugin=self.job_submit_plugin, partitions=self.partitions, extra_lines=extra,
            cred_expire=self.cred_expire, controllers=controllers, node_addr=node_addr,
            shards_per_gpu=self.shards_per_gpu))
        (layout.etc / "gres.conf").write_text(files.gres_conf(layout, self.nodes, self.gpus, self.shards_per_gpu))
        if self.with_dbd:
            dbd_conf = layout.etc / "slurmdbd.conf"
            dbd_conf.write_text(files.slurmdbd_conf(layout, self.ports))
            os.chmod(dbd_conf, 0o600)  # slurmdbd refuses a readable file (it holds the DB password)
        if self.horus:
            # beside job_submit.lua, where the script looks first; horusd gets it via HORUS_CONFIG
            settings = horus_local.receiver_settings(layout, self.ports["receiver"], self.node_names())
            settings.update(self.horus_settings)
            if self.backup is not None:
                horus_local.write_config(self.backup_horus_config, layout, dict(
                    settings, socket=self.backup_horus_socket, controller_host=backup_host.BACKUP_HOST))
                settings["controller_host"] = backup_host.primary_host()
            horus_local.write_config(self.horus_config, layout, settings)

    def _daemon_env(self):
        env = self.env
        env[procs.MARKER_VAR] = self.marker
        # job_submit.lua inside slurmctld reads HORUS_CONFIG first: this cluster's site file, never one
        # the caller's environment names (another cluster's, or the real site's)
        env.pop("HORUS_CONFIG", None)
        if self.horus:
            env["HORUS_CONFIG"] = str(self.horus_config)
        return env

    def _record(self, name, pid):
        self.daemons.append({"name": name, "pid": pid})
        self._write_state()

    def _start_daemonizing(self, name, argv, pid_file, log_file):
        """Run a daemon that forks into the background; record the PID from its pid file."""
        stderr_path = self.layout.log / f"{name}.stderr"
        with open(stderr_path, "ab") as err:
            result = subprocess.run(self.install.command(argv), env=self._daemon_env(), stdin=subprocess.DEVNULL,
                                    stdout=err, stderr=err, timeout=30)
        pid = procs.read_pid_file(pid_file, wait_s=5.0)
        if result.returncode != 0 or pid is None:
            if _log_says_port_in_use(log_file) or _log_says_port_in_use(stderr_path):
                raise PortClash(f"{name}: port in use")
            raise ClusterError(f"{name} failed to start (exit {result.returncode}); see {log_file} "
                               f"and {stderr_path}")
        self._record(name, pid)
        return pid

    def _check_alive(self, name, pid, log_file):
        if not procs.pid_alive(pid):
            if _log_says_port_in_use(log_file):
                raise PortClash(f"{name}: port in use")
            raise ClusterError(f"{name} (pid {pid}) exited during start-up; see {log_file}")

    def _start(self, timeout):
        self.daemons = []
        # A retry after a port clash starts from clean logs, state and DB.
        for path in (self.layout.log, self.layout.run, self.layout.state, self.layout.db):
            shutil.rmtree(path)
            path.mkdir()
        self._choose_ports()
        self.backup = backup_host.create(self) if self.backup_controller else None
        self._write_configs()
        layout = self.layout
        t0 = time.monotonic()
        self._start_munged()
        if self.with_dbd:
            self._start_accounting(timeout)
        t_dbd = time.monotonic()
        ctld_log = layout.log / "slurmctld.log"
        ctld = self._start_daemonizing("slurmctld", [layout.bin / "slurmctld", "-f", layout.slurm_conf],
                                       layout.run / "slurmctld.pid", ctld_log)

        def controller_up():
            self._check_alive("slurmctld", ctld, ctld_log)
            if _log_says_port_in_use(ctld_log):  # it exits a moment later; whoever holds the port may hang us
                raise PortClash("slurmctld: port in use")
            result = self._poll(["scontrol", "ping"])
            return result is not None and result.returncode == 0 and "UP" in result.stdout

        _wait_until(controller_up, timeout, "slurmctld to answer", ctld_log)
        for index, name in enumerate(self.node_names()):
            self._start_daemonizing(
                f"slurmd-{name}",
                [layout.bin / "slurmd", "-f", layout.slurm_conf, "-N", name, "-d", layout.bin / "slurmstepd"],
                layout.run / f"slurmd-{name}.pid", layout.log / f"slurmd-{name}.log")
        self._wait_nodes_idle(timeout)
        if self.horus:
            horus_local.start_horusd(self, timeout)
            horus_local.start_receiver(self, timeout)
        if self.backup is not None:
            backup_host.start_slurmctld(self)
            if self.horus:
                horus_local.start_backup_horusd(self, timeout)
        self.timings["accounting_s"] = round(t_dbd - t0, 3)
        self.timings["slurm_s"] = round(time.monotonic() - t_dbd, 3)

    def _poll(self, argv):
        """One status query during start-up; None when it hangs (the daemon is not up yet)."""
        try:
            return self.run(argv, check=False, timeout=3)
        except SlurmCommandError:
            return None

    def _wait_nodes_idle(self, timeout):
        expected = set(self.node_names())

        def all_idle():
            for daemon in self.daemons:
                if daemon["name"].startswith("slurmd-"):
                    self._check_alive(daemon["name"], daemon["pid"],
                                      self.layout.log / f"{daemon['name']}.log")
            result = self._poll(["sinfo", "-h", "-N", "-o", "%N %T"])
            if result is None:
                return False
            idle = {line.split()[0] for line in result.stdout.splitlines() if line.split()[1:] == ["idle"]}
            return idle >= expected

        _wait_until(all_idle, timeout, f"nodes {sorted(expected)} to be idle", self.layout.log)

    def _start_munged(self):
        layout = self.layout
        munged = self.install.program("munged")
        self._start_daemonizing(
            "munged",
            [munged, f"--key-file={layout.munge / 'munge.key'}", f"--socket={layout.munge_socket}",
             f"--pid-file={layout.munge / 'munged.pid'}", f"--log-file={layout.munge / 'munged.log'}",
             f"--seed-file={layout.munge / 'munged.seed'}"],
            layout.munge / "munged.pid", layout.munge / "munged.log")
        _wait_until(layout.munge_socket.exists, 10, "munged's socket", layout.munge / "munged.log")

    # ----------------------------------------------------------------- accounting
    def _start_accounting(self, timeout):
        """MariaDB + slurmdbd; the DB comes from the golden copy when there is one (~2 s vs ~10 s)."""
        golden = golden_cache_dir() / f"golden-db-{_golden_key(self.cluster_name, self.db_install, self.install)}"
        if self.use_golden_db and golden.is_dir():
            shutil.copytree(golden, self.layout.db_data, symlinks=True)
            self.timings["golden_db"] = True
            self._start_mariadb(timeout)
            self._start_slurmdbd(timeout)
            return
        self.timings["golden_db"] = False
        self._init_database()
        self._start_mariadb(timeout)
        self._mariadb_sql(
            f"CREATE USER '{files.DB_USER}'@'127.0.0.1' IDENTIFIED BY '{files.DB_PASSWORD}'; "
            f"GRANT ALL ON {files.DB_NAME}.* TO '{files.DB_USER}'@'127.0.0.1';")
        self._start_slurmdbd(timeout)
        self.run(["sacctmgr", "-i", "add", "cluster", self.cluster_name], timeout=60)
        if self.use_golden_db:
            self._save_golden(golden, timeout)

    def _init_database(self):
        installer = self.db_install.program("mariadb-install-db")
        log = self.layout.log / "mariadb-install-db.log"
        with open(log, "wb") as out:
            result = subprocess.run(self.db_install.command(
                [installer, "--no-defaults", "--user=root", f"--datadir={self.layout.db_data}",
                 "--auth-root-authentication-method=normal", "--skip-test-db", *MARIADB_SIZE_OPTIONS]),
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=120)
        if result.returncode != 0:
            raise ClusterError(f"mariadb-install-db failed (exit {result.returncode}); see {log}")

    def _start_mariadb(self, timeout):
        layout = self.layout
        log = layout.log / "mariadb.err"
        argv = [self.db_install.program("mariadbd"), "--no-defaults", "--user=root", f"--datadir={layout.db_data}",
                f"--socket={layout.db_socket}", f"--port={self.ports['mariadb']}", "--bind-address=127.0.0.1",
                f"--pid-file={layout.db / 'mysqld.pid'}", f"--log-error={log}",
                "--innodb-lock-wait-timeout=900", "--skip-name-resolve", *MARIADB_SIZE_OPTIONS]
        with open(layout.log / "mariadb.stdout", "ab") as out:
            child = subprocess.Popen(self.db_install.command(argv), env=self._daemon_env(), stdin=subprocess.DEVNULL,
                                     stdout=out,
                                     stderr=out, start_new_session=True)
        self._children.append(child)
        self._record("mariadbd", child.pid)

        def ready():
            self._check_alive("mariadbd", child.pid, log)
            return layout.db_socket.exists() and _tcp_listening(self.ports["mariadb"])

        _wait_until(ready, timeout, "MariaDB", log)

    def _mariadb_sql(self, sql):
        result = subprocess.run(self.db_install.command([self.db_install.program("mariadb"), "--no-defaults", "-S",
                                                      str(self.layout.db_socket), "-uroot", "-e", sql]),
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise ClusterError(f"MariaDB refused setup SQL: {result.stderr.strip()}")

    def _start_slurmdbd(self, timeout):
        layout = self.layout
        log = layout.log / "slurmdbd.log"
        pid = self._start_daemonizing("slurmdbd", [self.install.program("slurmdbd")], layout.run / "slurmdbd.pid", log)

        def answers():
            if not procs.pid_alive(pid):
                why = accounting_failure(log.read_text(errors="replace") if log.exists() else "")
                if why:
                    raise ClusterError(why)
            self._check_alive("slurmdbd", pid, log)
            return _tcp_listening(self.ports["slurmdbd"])

        _wait_until(answers, timeout, "slurmdbd", log)

    def _save_golden(self, golden, timeout):
        """Keep a copy of the freshly initialised DB (schema + cluster) for later starts.

        MariaDB is stopped for the copy so the files are consistent, then started again.
        """
        for name in ("slurmdbd", "mariadbd"):
            self._stop_named(name)
        golden.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=golden.name + ".", dir=golden.parent))
        shutil.copytree(self.layout.db_data, staging / "data", symlinks=True)
        try:
            os.rename(staging / "data", golden)  # atomic: a concurrent cluster may have won the race
        except OSError:
            pass
        shutil.rmtree(staging, ignore_errors=True)
        self._start_mariadb(timeout)
        self._start_slurmdbd(timeout)

    # ----------------------------------------------------------------- stop
    def _daemon_alive(self, daemon):
        return procs.pid_alive(daemon["pid"]) and procs.belongs_to(daemon["pid"], self.marker)

    def _stop_named(self, name):
        for daemon in [d for d in self.daemons if d["name"] == name]:
            if self._daemon_alive(daemon):
                procs.stop_pids([daemon["pid"]])
            self.daemons.remove(daemon)
        self._reap()

    def _reap(self):
        for child in list(self._children):
            if child.poll() is not None:
                self._children.remove(child)

    def cancel_all_jobs(self, timeout=60.0):
        """scancel every job and wait until squeue lists none (finished jobs leave the list).

        Returns False when the controller does not answer; the caller then stops daemons anyway.
        """

        def listed_jobs():
            result = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=10)
            return result.stdout.split() if result.returncode == 0 else None

        try:
            job_ids = listed_jobs()
            if job_ids is None:
                return False
            if job_ids:
                self.run(["scancel", *job_ids], check=False, timeout=10)
            _wait_until(lambda: listed_jobs() == [], timeout, "the queue to drain", poll=0.1)
        except (ClusterError, SlurmCommandError):
            return False
        return True

    def _stop_daemons(self):
        """Stop recorded daemons (nodes first, munged last) and every leftover job process."""
        order = ["horusd", "receiver", "slurmd", "slurmctld", "backuphost", "slurmdbd", "mariadbd", "munged"]
        ranked = sorted(self.daemons, key=lambda d: order.index(d["name"].split("-")[0]))
        for rank_name in order:
            pids = [d["pid"] for d in ranked if d["name"].split("-")[0] == rank_name and self._daemon_alive(d)]
            procs.stop_pids(pids)
        # Job steps orphaned by a dead slurmd ignore SIGTERM: SIGKILL them (and their jobs) by PID.
        leftovers = procs.marked_processes(self.marker)
        for pid in leftovers:
            procs.signal_pid(pid, 9)
        procs.wait_gone(leftovers, 5.0)
        self._reap()
        self.daemons = []

    def down(self, remove=None, timeout=60.0):
        """Cancel jobs, stop every daemon by PID; remove the directory if it was a temp dir
        (``remove=None``) or when ``remove`` is true. Returns the PIDs found still alive (none)."""
        if self.layout is None:
            return []
        was = [d["pid"] for d in self.daemons]
        if any(self._daemon_alive(d) for d in self.daemons if d["name"].startswith("slurmctld")):
            self.cancel_all_jobs(timeout)
        self._stop_daemons()
        survivors = [pid for pid in was if procs.pid_alive(pid) and procs.belongs_to(pid, self.marker)]
        survivors += procs.marked_processes(self.marker)
        if not survivors:
            self._release_install()
        if remove is None:
            remove = self.temporary
        if remove and not survivors:
            shutil.rmtree(self.layout.root, ignore_errors=True)
        elif self.layout.root.exists():
            self._write_state()
        return sorted(set(survivors))

    def _release_install(self):
        """Unmount what this cluster's Slurm chroot needed, if no other cluster still uses it."""
        left = self.install.release(self.layout.root, self.mounts)
        if left:
            raise ClusterError(f"could not unmount {', '.join(left)} (still busy)")
        self.mounts = []

    # ----------------------------------------------------------------- state file
    def state(self):
        return {
            "dir": str(self.layout.root),
            "slurm_conf": str(self.slurm_conf),
            "cluster_name": self.cluster_name,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "with_dbd": self.with_dbd,
            "slurm": self.install.name,
            "mounts": list(self.mounts),
            "temporary": self.temporary,
            "ports": self.ports,
            "backup": self.backup,
            "daemons": [dict(d) for d in self.daemons],
            "timings": self.timings,
        }

    def _write_state(self):
        tmp = self.layout.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state(), indent=2) + "\n")
        os.replace(tmp, self.layout.state_file)

    @staticmethod
    def read_state(directory):
        path = Path(directory) / STATE_FILE
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise InputError(f"no local cluster in {directory} ({STATE_FILE} not found)") from None
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: unreadable cluster state: {exc}") from None

    @classmethod
    def attach(cls, directory):
        """The cluster recorded in ``directory``'s state file (running or not)."""
        state = cls.read_state(directory)
        cluster = cls(directory=state["dir"], nodes=state["nodes"], gpus=state["gpus"],
                      with_dbd=state["with_dbd"], cluster_name=state["cluster_name"],
                      slurm=state.get("slurm") or SYSTEM)
        cluster.mounts = state.get("mounts", [])
        cluster.temporary = state.get("temporary", False)
        cluster.ports = state.get("ports", {})
        cluster.backup = state.get("backup")
        cluster.daemons = state.get("daemons", [])
        cluster.timings = state.get("timings", {})
        return cluster

    def status(self):
        """The state plus, per daemon, whether its PID is alive and still ours."""
        state = self.state()
        for daemon in state["daemons"]:
            daemon["alive"] = self._daemon_alive(daemon)
        state["running"] = bool(state["daemons"]) and all(d["alive"] for d in state["daemons"])
        return state

    def __enter__(self):
        return self.up() if not self.daemons else self

    def __exit__(self, *exc_info):
        self.down()
