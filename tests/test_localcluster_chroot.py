"""Which Slurm a local cluster runs (localcluster/chroot.py), without building or mounting anything.

The chroot itself is exercised by the whole Slurm-backed suite under ``make test-slurm-newer``
(HORUS_LOCAL_SLURM=24.11 / 26.05): every cluster, wrapper and mount of those runs goes through here.
"""

import os
import stat
import time

import pytest

from slurm_horus.errors import InputError
from slurm_horus.localcluster.chroot import (
    CLIENT_COMMANDS, MARKER, RELEASES, ChrootSlurm, SystemSlurm, default_slurm, mount_points, slurm_install,
)
from slurm_horus.localcluster.cluster import accounting_failure
from slurm_horus.localcluster.prereq import missing_prerequisites


def fake_root(base, release="24.11"):
    """A chroot-shaped tree: sinfo and sbatch, and slurmctld behind Debian's alternatives links."""
    root = base / f"slurm-{release}" / "root"
    for directory in ("usr/bin", "usr/sbin", "etc/alternatives"):
        (root / directory).mkdir(parents=True)
    for name in ("usr/bin/sinfo", "usr/bin/sbatch", "usr/sbin/slurmctld-wlm"):
        (root / name).write_text("#!/bin/sh\n")
        os.chmod(root / name, 0o755)
    os.symlink("/etc/alternatives/slurmctld", root / "usr/sbin/slurmctld")
    os.symlink("../../usr/sbin/slurmctld-wlm", root / "etc/alternatives/slurmctld")
    return ChrootSlurm(RELEASES[release], base)


def test_names_pick_the_install_and_unknown_ones_are_one_clear_error(tmp_path):
    assert isinstance(slurm_install("system"), SystemSlurm)
    install = slurm_install("26.05", environ={"HORUS_SLURM_CHROOTS": str(tmp_path)})
    assert install.root == tmp_path / "slurm-26.05" / "root" and install.release_info.suite == "sid"
    assert default_slurm({}) == "system" and default_slurm({"HORUS_LOCAL_SLURM": "24.11"}) == "24.11"
    with pytest.raises(InputError, match="unknown Slurm '23.02': choose one of system, 24.11, 26.05"):
        slurm_install("23.02")


def test_programs_are_found_inside_and_their_alternatives_resolved_there(tmp_path):
    install = fake_root(tmp_path)
    assert install.program("slurmctld") == "/usr/sbin/slurmctld"
    # resolved inside the chroot, not on the host (where /etc/alternatives/slurmctld is 22.05's)
    assert install.real_program("slurmctld") == "/usr/sbin/slurmctld-wlm"
    assert install.program("slurmdbd") is None and install.real_program("slurmdbd") is None
    assert install.host_path("/usr/bin/sinfo") == install.root / "usr/bin/sinfo"
    assert install.command(["/usr/bin/sinfo", "-h"])[1:] == [str(install.root), "/usr/bin/sinfo", "-h"]


def test_client_wrappers_run_the_chroot_command_in_the_callers_directory(tmp_path):
    install = fake_root(tmp_path)
    install._write_wrappers()
    wrappers = sorted(p.name for p in install.bin_dir.iterdir())
    assert wrappers == ["sbatch", "sinfo"] and set(wrappers) <= set(CLIENT_COMMANDS)
    text = (install.bin_dir / "sinfo").read_text()
    assert os.stat(install.bin_dir / "sinfo").st_mode & stat.S_IXUSR
    assert f"root={install.root}" in text and '/usr/bin/env -C "$PWD" /usr/bin/sinfo "$@"' in text
    # inside the chroot (the marker is there) a wrapper runs the command itself, before any chroot
    assert 0 < text.index(f'[ -e {MARKER} ] && exec /usr/bin/sinfo "$@"') < text.index('"$root" /usr/bin/env -C')
    before = os.stat(install.bin_dir / "sinfo").st_mtime_ns
    install._write_wrappers()  # idempotent: unchanged wrappers are not rewritten
    assert os.stat(install.bin_dir / "sinfo").st_mtime_ns == before
    env = install.env({"PATH": "/usr/bin"})
    assert env["PATH"] == f"{install.bin_dir}:/usr/bin"


def test_the_chroot_gets_the_hosts_name_files_and_the_marker(tmp_path):
    install = fake_root(tmp_path)
    (install.root / "etc").mkdir(exist_ok=True)
    os.symlink("../run/systemd/resolve/stub-resolv.conf", install.root / "etc/resolv.conf")
    install._write_hosts()
    hosts = (install.root / "etc/hosts").read_text()
    assert hosts.startswith(open("/etc/hosts").read()) and "localhost" in hosts
    if os.path.exists("/etc/resolv.conf"):
        assert not (install.root / "etc/resolv.conf").is_symlink()
        assert (install.root / "etc/resolv.conf").read_text() == open("/etc/resolv.conf").read()
    assert (install.root / MARKER.lstrip("/")).exists()


def test_a_chroot_cluster_needs_only_lua_chroot_mount_and_mariadb_on_the_host(tmp_path):
    install = fake_root(tmp_path)
    missing = missing_prerequisites(with_dbd=True, path=str(tmp_path / "empty"), install=install)
    assert sorted(item for item, _ in missing) == ["chroot", "luac5.1", "mariadb", "mariadb-install-db",
                                                   "mariadbd", "mount"]


def test_the_known_slurmdbd_mariadb_mismatch_reads_as_one_line():
    log = ("[2026-11-23T13:03:14.333] accounting_storage/as_mysql: _check_mysql_concat_is_sane: MySQL server "
           "version is: 11.8.9-MariaDB-0+deb13u1 from Debian\n[2026-11-23T13:03:14.334] error: mysql_query "
           "failed: 5027 Number of columns in result (=1) set execeeds maxmimum allowed number of columns (=0)\n"
           "[2026-11-23T13:03:14.334] fatal: _check_mysql_concat_is_sane: null result from query "
           "`select @var := concat('');`\n")
    why = accounting_failure(log)
    assert why.startswith("accounting unavailable:") and "MariaDB 11.8.9-MariaDB-0+deb13u1" in why
    assert "\n" not in why and accounting_failure("fatal: something else") is None


def test_mount_points_lists_this_namespace():
    points = mount_points()
    assert "/" in points and "/proc" in points


def test_leases_of_gone_or_dead_clusters_do_not_keep_the_mounts(tmp_path):
    install = fake_root(tmp_path)
    leases = install.home / "leases"
    leases.mkdir()
    alive_dir, dead_dir = tmp_path / "starting", tmp_path / "killed"
    alive_dir.mkdir()
    dead_dir.mkdir()
    for name, directory in (("a", alive_dir), ("b", dead_dir), ("c", tmp_path / "removed")):
        (leases / name).write_text(str(directory))
    old = time.time() - 3600
    os.utime(leases / "b", (old, old))  # an hour old, and no process of that cluster runs: stale
    assert install._other_leases() == [str(alive_dir)]  # a fresh lease counts: its cluster is starting
    assert sorted(p.name for p in leases.iterdir()) == ["a"]
    assert install.in_use()
