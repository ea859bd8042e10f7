"""Which Slurm a local cluster runs: the system's, or a newer one from a Debian chroot.

Debian 12 ships Slurm 22.05; Debian 13 "trixie" ships 24.11 and "sid" 26.05. ``--slurm 24.11`` runs
a local cluster on trixie's Slurm without touching the host: the first use builds a chroot with
``mmdebstrap`` (one to three minutes on this machine) under ``$HORUS_SLURM_CHROOTS`` (default
``/var/cache/slurm-horus/chroots``), later uses reuse it.

A :class:`SlurmInstall` says how to reach one installation:

* :meth:`~SlurmInstall.program` - a daemon's path as the command sees it, :meth:`~SlurmInstall.command`
  - the argv that runs it (``chroot ROOT`` in front for a chroot);
* :attr:`~SlurmInstall.bin_dir` - a directory of small wrappers, one per Slurm client command
  (``sinfo`` runs ``chroot ROOT /usr/bin/sinfo`` in the caller's directory). The cluster's
  environment puts it first on ``PATH``, so everything that runs Slurm commands by name - horusd's
  refresh, ``horus-sbatch``, a user's shell after ``eval "$(horus local-cluster env)"``, the tests -
  reaches the chroot's Slurm without knowing it is there, as a site's ``module load slurm/24.11``
  would do. slurm-horus's own Python stays on the host; only Slurm and munge run inside (MariaDB is
  the host's: see PACKAGES).
* :meth:`~SlurmInstall.acquire` / :meth:`~SlurmInstall.release` - the mounts a chroot needs while a
  cluster uses it: ``proc``, ``/sys`` with the cgroup tree (``rbind`` + ``rslave``: slurmd 24.11
  refuses to start without a cgroup filesystem), ``/dev``, ``/dev/pts``, ``/dev/shm``, a tmpfs on
  ``/run``, and the host's ``/tmp`` (cluster directories live there, so paths are the same inside
  and out); a cluster directory elsewhere is bound at its own path. Each cluster holds a lease
  (``leases/``) from ``acquire`` to ``release``; ``release`` unmounts only when no other cluster holds
  one and no process runs inside the chroot any more (``/proc/PID/root``), so clusters can share one
  and a cluster starting while another stops keeps its mounts.
"""

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import HorusError, InputError
from .procs import marked_processes

SYSTEM = "system"
CHROOTS_VAR = "HORUS_SLURM_CHROOTS"
DEFAULT_CHROOTS = "/var/cache/slurm-horus/chroots"
LOCAL_SLURM_VAR = "HORUS_LOCAL_SLURM"  # the default of --slurm (the test targets set it)
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What runs inside: the daemons, the clients, and Lua 5.1 + lua-socket for job_submit.lua (trixie's
# and sid's job_submit_lua.so still link liblua5.1). Not Python (slurm-horus runs on the host), and not
# MariaDB: these slurmdbd builds stop at start-up against their own suite's MariaDB 11.8.9 server,
# so the host's (Debian 12: 10.11) serves them (see LocalCluster.db_install).
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "lua5.1", "lua-socket")
# The Slurm client commands that get a wrapper in bin_dir.
CLIENT_COMMANDS = ("sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol",
                   "sdiag", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger")
SEARCH_PATH = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
LEASE_GRACE_S = 120  # a lease this old whose cluster runs no process (it was killed) no longer counts
# A file only the chroot holds: a wrapper that sees it runs inside already (a job's PATH still names
# bin_dir, and with HORUS_SLURM_CHROOTS under /tmp, which is bound inside, the wrappers are there too).
MARKER = "/etc/slurm-horus-chroot"
FORMAT = 1  # bump when what a built chroot must hold changes: older builds are rebuilt


@dataclass(frozen=True)
class Release:
    slurm: str  # "24.11": the major.minor the suite must ship
    suite: str  # Debian suite
    apt_options: tuple = ()


RELEASES = {
    "24.11": Release("24.11", "trixie"),
    # sid's Release file reads as expired on this machine's clock
    "26.05": Release("26.05", "sid", ('Acquire::Check-Valid-Until "false"',)),
}


class ChrootError(HorusError):
    """A chroot could not be built, mounted or released; the message says what to do."""


def default_slurm(environ=None):
    """The Slurm a local cluster runs when none is named: ``$HORUS_LOCAL_SLURM`` or the system's."""
    return ((environ if environ is not None else os.environ).get(LOCAL_SLURM_VAR) or SYSTEM).strip()


def chroots_dir(environ=None):
    return Path((environ if environ is not None else os.environ).get(CHROOTS_VAR) or DEFAULT_CHROOTS)


def slurm_install(name=None, environ=None):
    """The installation called ``name`` (``system``, ``24.11``, ``26.05``; default: see default_slurm)."""
    name = name or default_slurm(environ)
    if name == SYSTEM:
        return SystemSlurm()
    if name not in RELEASES:
        raise InputError(f"unknown Slurm {name!r}: choose one of {', '.join([SYSTEM, *RELEASES])}")
    return ChrootSlurm(RELEASES[name], chroots_dir(environ))


def _run(argv, what, timeout=60, **kwargs):
    try:
        result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kwargs)
    except FileNotFoundError:
        raise ChrootError(f"{what}: {argv[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise ChrootError(f"{what}: timed out after {timeout} s") from None
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()
        raise ChrootError(f"{what} failed (exit {result.returncode}): {tail[-1] if tail else 'no output'}")
    return result


class SystemSlurm:
    """The Slurm installed on this machine (Debian 12: 22.05): programs from ``$PATH``, no prefix."""

    name = SYSTEM
    root = None
    bin_dir = None

    def program(self, name):
        return shutil.which(name, path=os.environ.get("PATH", os.defpath))

    def real_program(self, name):
        """``name`` with every symlink resolved (Slurm reads its role from the name it is run by)."""
        path = self.program(name)
        return os.path.realpath(path) if path else None

    def host_path(self, path):
        return Path(path)

    def command(self, argv):
        return [str(a) for a in argv]

    def env(self, env):
        return env

    def as_user(self, argv, user):
        """(argv, subprocess keywords) that run a Slurm client ``argv`` as ``user`` (a passwd entry);
        the caller is root."""
        return [str(a) for a in argv], {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}

    def prepare(self, echo=None):
        return self

    def acquire(self, directory):
        return []

    def release(self, directory, mounts=()):
        return []

    def describe(self):
        return "the system's Slurm"


class ChrootSlurm:
    """Slurm ``release.slurm`` from a Debian chroot under ``base`` (built on first use)."""

    def __init__(self, release, base):
        self.release_info = release
        self.name = release.slurm
        self.home = Path(base) / f"slurm-{release.slurm}"
        self.root = self.home / "root"
        self.bin_dir = self.home / "bin"
        self.stamp = self.home / "built.json"

    def describe(self):
        return f"Slurm {self.name} (Debian {self.release_info.suite} chroot {self.root})"

    # ---- reaching it ------------------------------------------------------------------------
    def program(self, name):
        """The path of ``name`` inside the chroot (as the chrooted command sees it), or None. Its
        symlinks are followed inside the chroot: an absolute link (``/etc/alternatives/...``) read
        from the host would name the host's file."""
        for directory in SEARCH_PATH:
            inside = f"{directory}/{name}"
            resolved = self._resolved(inside)
            if resolved is not None and os.access(self.host_path(resolved), os.X_OK):
                return inside
        return None

    def real_program(self, name):
        """``name``'s path inside the chroot with its symlinks (``/etc/alternatives``) resolved there."""
        path = self.program(name)
        return None if path is None else self._resolved(path)

    def _resolved(self, path):
        """``path`` (inside the chroot) with its symlinks resolved there; None when it is missing."""
        for _ in range(40):
            host = self.host_path(path)
            if not os.path.islink(host):
                return path if os.path.exists(host) else None
            target = os.readlink(host)
            path = os.path.normpath(target if target.startswith("/") else os.path.join(os.path.dirname(path), target))
        raise ChrootError(f"{path}: too many symlinks in {self.root}")

    def host_path(self, path):
        """A path inside the chroot, as seen from the host."""
        return self.root / str(path).lstrip("/")

    def command(self, argv):
        return [shutil.which("chroot") or "/usr/sbin/chroot", str(self.root)] + [str(a) for a in argv]

    def env(self, env):
        """``env`` with the client wrappers first on PATH."""
        env = dict(env)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', os.defpath)}"
        return env

    def as_user(self, argv, user, cwd="/tmp"):
        """(argv, subprocess keywords) that run a Slurm client ``argv`` as ``user`` (a passwd entry).

        Only root may chroot, so the client wrappers work for root alone; root runs ``chroot
        --userspec`` instead, which enters the chroot and then becomes the user. The user must exist
        inside too (slurmctld and slurmd resolve uids there): its passwd and group lines are copied in."""
        self._add_user(user)
        chroot = shutil.which("chroot") or "/usr/sbin/chroot"
        return [chroot, f"--userspec={user.pw_uid}:{user.pw_gid}", f"--groups={user.pw_gid}", str(self.root),
                "/usr/bin/env", "-C", cwd] + [str(a) for a in argv], {}

    def _add_user(self, user):
        import grp

        entries = ((self.host_path("/etc/passwd"), user.pw_name, ":".join(
                       [user.pw_name, "x", str(user.pw_uid), str(user.pw_gid), user.pw_gecos, user.pw_dir,
                        user.pw_shell])),
                   (self.host_path("/etc/group"), None, None))
        try:
            group = grp.getgrgid(user.pw_gid)
            entries = (entries[0], (entries[1][0], group.gr_name, f"{group.gr_name}:x:{group.gr_gid}:"))
        except KeyError:
            entries = entries[:1]
        with self._locked():
            for path, name, line in entries:
                if name is None:
                    continue
                text = path.read_text() if path.exists() else ""
                if not any(existing.split(":", 1)[0] == name for existing in text.splitlines()):
                    path.write_text(text + ("" if not text or text.endswith("\n") else "\n") + line + "\n")

    # ---- building --------------------------------------------------------------------------------
    def built(self):
        try:
            info = json.loads(self.stamp.read_text())
        except (OSError, ValueError):
            return None
        if info.get("format") != FORMAT or not (self.root / "usr/sbin/slurmctld").exists():
            return None
        return info

    def prepare(self, echo=None):
        """Build the chroot and its wrappers unless a build is already there (under a lock)."""
        if os.geteuid() != 0:
            raise ChrootError("a chroot Slurm needs root (mmdebstrap, chroot, mount)")
        self.home.mkdir(parents=True, exist_ok=True)
        with self._locked():
            if self.built() is None:
                self._build(echo)
            self._write_hosts()
            self._write_wrappers()
        return self

    def _write_hosts(self):
        """The host's name files inside, and the marker the wrappers look for.

        mmdebstrap leaves no /etc/hosts: without one nothing inside resolves ``localhost``
        (slurm.conf's SlurmctldHost and NodeHostname) nor this machine's own name, which srun and
        slurmd look up for a job step (a job's ``srun`` then never starts its step). The host's
        ``/etc/hosts`` and ``/etc/resolv.conf`` are copied in on every prepare (a ``localhost``
        line is added when the host's has none)."""
        for name in ("/etc/hosts", "/etc/resolv.conf"):
            try:
                text = Path(name).read_text()
            except OSError:
                text = ""
            if name == "/etc/hosts" and not any("localhost" in line.split("#")[0].split()[1:]
                                                for line in text.splitlines()):
                text += "127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n"
            target = self.host_path(name)
            if target.is_symlink():  # resolv.conf may be a link to the build host's /run
                target.unlink()
            if not target.exists() or target.read_text() != text:
                target.write_text(text)
        marker = self.host_path(MARKER)
        if not marker.exists():
            marker.write_text(f"Slurm {self.name} chroot of slurm-horus: the client wrappers run the commands "
                              "directly when they see this file\n")

    def _build(self, echo):
        release = self.release_info
        mmdebstrap = shutil.which("mmdebstrap")
        if mmdebstrap is None:
            raise ChrootError(f"building the Slurm {release.slurm} chroot needs mmdebstrap: "
                              "apt-get install -y --no-install-recommends mmdebstrap")
        if echo:
            echo(f"building the Slurm {release.slurm} chroot (Debian {release.suite}) in {self.root}; "
                 "1-3 minutes, once")
        started = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix="root.", dir=self.home))
        try:
            argv = [mmdebstrap, "--mode=root", "--variant=minbase", f"--include={','.join(PACKAGES)}"]
            argv += [f"--aptopt={option}" for option in release.apt_options]
            argv += [release.suite, str(staging), DEBIAN_MIRROR]
            log = self.home / "build.log"
            with open(log, "w") as out:
                result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=1800)
            if result.returncode != 0:
                raise ChrootError(f"mmdebstrap failed (exit {result.returncode}); see {log}")
            versions = _package_versions(staging)
            found = versions.get("slurmctld", "")
            if not found.startswith(release.slurm + "."):
                raise ChrootError(f"Debian {release.suite} ships Slurm {found or 'none'}, not {release.slurm}: "
                                  f"this slurm-horus does not know that combination")
            if self.root.exists():
                shutil.rmtree(self.root)
            os.rename(staging, self.root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        info = {"format": FORMAT, "slurm": release.slurm, "suite": release.suite, "packages": versions,
                "built_at": int(time.time()), "build_s": round(time.monotonic() - started, 1)}
        self.stamp.write_text(json.dumps(info, indent=2) + "\n")

    def _write_wrappers(self):
        self.bin_dir.mkdir(exist_ok=True)
        root = shlex.quote(str(self.root))
        chroot = shlex.quote(shutil.which("chroot") or "/usr/sbin/chroot")
        for command in CLIENT_COMMANDS:
            inside = self.program(command)
            if inside is None:
                continue
            text = (
                "#!/bin/sh\n"
                f"# Slurm {self.name}'s {command}, run in its chroot (written by horus local-cluster).\n"
                f"root={root}\n"
                # inside the chroot already (a job's PATH): the real command
                f'[ -e {MARKER} ] && exec {inside} "$@"\n'
                f'[ -d "$root/usr" ] || exec {inside} "$@"\n'
                # chroot(8) starts in /: keep the caller's directory where the chroot sees it too
                f'[ -n "$PWD" ] && [ -d "$root$PWD" ] && exec {chroot} "$root" /usr/bin/env -C "$PWD" {inside} "$@"\n'
                f'exec {chroot} "$root" {inside} "$@"\n'
            )
            path = self.bin_dir / command
            if not path.exists() or path.read_text() != text:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(text)
                os.chmod(tmp, 0o755)
                os.replace(tmp, path)

    @contextmanager
    def _locked(self):
        with open(self.home / "lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # ---- mounts -----------------------------------------------------------------------------
    def _system_mounts(self):
        """[(how, source, target inside)] in mount order."""
        return [
            ("proc", "proc", "/proc"),
            ("bind", "/sys", "/sys"),
            ("rbind-rslave", "/sys/fs/cgroup", "/sys/fs/cgroup"),
            ("bind", "/dev", "/dev"),
            ("bind", "/dev/pts", "/dev/pts"),
            ("bind", "/dev/shm", "/dev/shm"),
            ("tmpfs", "tmpfs", "/run"),
            ("bind", "/tmp", "/tmp"),
        ]

    def acquire(self, directory):
        """Mount what the chroot needs (idempotent); bind ``directory`` at its own path when the
        shared mounts do not show it. Returns the per-cluster mounts made (for :meth:`release`)."""
        directory = Path(directory).resolve()
        made = []
        with self._locked():
            lease = self._lease(directory)
            lease.parent.mkdir(exist_ok=True)
            lease.write_text(str(directory))
            mounted = mount_points()
            for how, source, inside in self._system_mounts():
                target = self.host_path(inside)
                if str(target) in mounted or (how not in ("proc", "tmpfs") and not Path(source).exists()):
                    continue
                _mount(how, source, target)
            if not self.host_path(directory).is_dir() or not _same_dir(directory, self.host_path(directory)):
                target = self.host_path(directory)
                target.mkdir(parents=True, exist_ok=True)
                _mount("bind", directory, target)
                made.append(str(directory))
        return made

    def users(self):
        """PIDs of the processes that run inside this chroot."""
        root = os.path.realpath(self.root)
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.readlink(f"/proc/{entry}/root") == root:
                        found.append(int(entry))
                except OSError:
                    continue
        return found

    def _lease(self, directory):
        return self.home / "leases" / hashlib.sha1(str(directory).encode()).hexdigest()[:16]

    def _other_leases(self):
        """Leases of clusters that may still use the chroot; stale ones (their directory is gone, or
        nothing of theirs has run for LEASE_GRACE_S) are removed."""
        live = []
        for lease in (self.home / "leases").glob("*"):
            try:
                directory = lease.read_text()
                age = time.time() - lease.stat().st_mtime
            except OSError:
                continue
            if not os.path.isdir(directory) or (age > LEASE_GRACE_S and not marked_processes(directory)):
                lease.unlink(missing_ok=True)
            else:
                live.append(directory)
        return live

    def release(self, directory, mounts=()):
        """Unmount ``mounts`` (made by acquire for one cluster) and, when no other cluster holds a
        lease and nothing runs inside any more, the shared mounts too. Returns the mount points that
        could not be unmounted."""
        failed = []
        with self._locked():
            self._lease(Path(directory).resolve()).unlink(missing_ok=True)
            for path in mounts:
                failed += _umount(self.host_path(path))
            if self._other_leases() or self.users():
                return failed
            mounted = mount_points()
            for _how, _source, inside in reversed(self._system_mounts()):
                target = self.host_path(inside)
                if str(target) in mounted:
                    failed += _umount(target)
        return failed

    def in_use(self):
        """Whether a cluster holds a lease or a process runs inside (then release keeps the mounts)."""
        with self._locked():
            return bool(self._other_leases() or self.users())

    def mounted(self):
        prefix = str(self.root) + "/"
        return sorted(p for p in mount_points() if p.startswith(prefix))


def _package_versions(root):
    result = subprocess.run(["chroot", str(root), "dpkg-query", "-W", "-f", "${Package} ${Version}\n", *PACKAGES],
                            capture_output=True, text=True, timeout=60)
    versions = {}
    for line in result.stdout.splitlines():
        name, _, version = line.partition(" ")
        if version:
            versions[name] = version
    return versions


def _same_dir(a, b):
    try:
        return os.path.samestat(os.stat(a), os.stat(b))
    except OSError:
        return False


def mount_points():
    """Every mount point of this mount namespace (``/proc/self/mountinfo``, octal escapes decoded)."""
    points = set()
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            if len(fields) > 4:
                points.add(fields[4].encode().decode("unicode_escape"))
    return points


def _mount(how, source, target):
    what = f"mount {source} on {target}"
    if how == "proc":
        _run(["mount", "-t", "proc", "proc", target], what)
    elif how == "tmpfs":
        _run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", target], what)
    elif how == "bind":
        _run(["mount", "--bind", source, target], what)
    elif how == "rbind-rslave":
        _run(["mount", "--rbind", source, target], what)
        _run(["mount", "--make-rslave", target], what)
    else:  # pragma: no cover - a programming error
        raise ValueError(how)


def _umount(target):
    """Unmount ``target`` and what is below it; [target] if it stays mounted."""
    result = subprocess.run(["umount", "-R", str(target)], capture_output=True, text=True, timeout=60)
    if result.returncode != 0 and str(target) in mount_points():
        return [str(target)]
    return []
