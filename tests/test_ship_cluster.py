"""Network shipping on the local cluster: an unprivileged collector with --ship-to and no database
access ships samples that ``horus report cluster --json`` counts; a collector claiming another node
is refused. The cluster runs the receiver and one munged per node (see localcluster/horus.py)."""

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import click
import pytest

import slurm_horus
from slurm_horus.localcluster import LocalCluster

pytestmark = pytest.mark.slurm

UNPRIVILEGED = "nobody"


@pytest.fixture(scope="module")
def cluster():
    cluster = LocalCluster(nodes=2, gpus=2, horus=True).up()
    try:
        yield cluster
    finally:
        assert not cluster.down()


def _runs_as(user, argv):
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def unprivileged():
    """(user, argv prefix running ``python -m slurm_horus`` as that user): slurm-horus installed where the
    user can read it (a copy of the package and of click, its one import on the shipping path), run by
    an interpreter the user may execute."""
    if os.getuid() != 0:
        pytest.skip("running a collector as another user needs root")
    try:
        pwd.getpwnam(UNPRIVILEGED)
    except KeyError:
        pytest.fail(f"no user {UNPRIVILEGED!r} on this machine", pytrace=False)
    site = Path(tempfile.mkdtemp(prefix="hship-site-", dir="/tmp"))
    shutil.copytree(Path(slurm_horus.__file__).parent, site / "slurm_horus",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(click.__file__).parent, site / "click", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "horus.conf").write_text("")  # no site file with a db for this user
    subprocess.run(["chmod", "-R", "a+rX", str(site)], check=True)
    os.chmod(site, 0o755)
    python = None
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        if _runs_as(UNPRIVILEGED, [candidate, "-c", "pass"]).returncode == 0:
            python = candidate
            break
    if python is None:
        pytest.fail(f"no Python interpreter that {UNPRIVILEGED} may run", pytrace=False)
    prefix = ["env", "-i", "PATH=/usr/bin:/bin", f"PYTHONPATH={site}", f"HORUS_CONFIG={site / 'horus.conf'}",
              # a database it could neither create nor open: shipping must not need one
              "HORUS_DB=/root/.horus-never/horus.db", python, "-m", "slurm_horus"]
    yield UNPRIVILEGED, prefix, site
    shutil.rmtree(site, ignore_errors=True)


def _report(cluster):
    env = dict(cluster.env, HORUS_CONFIG=str(cluster.horus_config))
    done = subprocess.run([sys.executable, "-m", "slurm_horus", "report", "cluster", "--json"], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_an_unprivileged_collector_ships_what_report_cluster_counts(cluster, unprivileged):
    user, prefix, site = unprivileged
    spool_dir = Path(tempfile.mkdtemp(prefix="hship-spool-", dir="/tmp"))
    shutil.chown(spool_dir, user=user)
    assert cluster.ship_to and f"HORUS_SHIP_TO={cluster.ship_to}" in cluster.export_line().split()
    before = _report(cluster)["gpu_samples"]
    try:
        done = _runs_as(user, prefix + [
            "collect", "--backend", "standin", "--gpus", "2", "--node", "n1", "--count", "3", "--interval", "0.1",
            "--spool", str(spool_dir / "n1.db"), "--ship-to", cluster.ship_to,
            "--munge-socket", str(cluster.layout.node_munge_socket("n1"))])
        assert done.returncode == 0, done.stderr
        assert "0 batches unshipped" in done.stderr
        assert _report(cluster)["gpu_samples"] == before + 3 * 2
        rows = _node_samples(cluster)
        assert rows == {"n1": 6}

        # the same collector claims to be n2: its munged signs with n1's address, so it is refused
        claim = _runs_as(user, prefix + [
            "collect", "--backend", "standin", "--gpus", "2", "--node", "n2", "--once", "--ship-every", "0",
            "--spool", str(spool_dir / "n2.db")])
        assert claim.returncode == 0, claim.stderr
        refused = _runs_as(user, prefix + [
            "collect", "--ship", "--spool", str(spool_dir / "n2.db"), "--ship-to", cluster.ship_to,
            "--munge-socket", str(cluster.layout.node_munge_socket("n1"))])
        assert refused.returncode == 1
        assert "may not ship samples of node n2" in refused.stderr and "1 batches kept" in refused.stderr
        assert _report(cluster)["gpu_samples"] == before + 6
        assert "may not ship samples of node n2" in (cluster.layout.log / "receiver.log").read_text()

        # n2's own collector, with n2's munged, ships the very same spool
        own = _runs_as(user, prefix + [
            "collect", "--ship", "--spool", str(spool_dir / "n2.db"), "--ship-to", cluster.ship_to,
            "--munge-socket", str(cluster.layout.node_munge_socket("n2"))])
        assert own.returncode == 0, own.stderr
        assert _node_samples(cluster) == {"n1": 6, "n2": 2}
    finally:
        shutil.rmtree(spool_dir, ignore_errors=True)


def _node_samples(cluster):
    from slurm_horus.store.db import open_db

    db = open_db(cluster.root / "horus.db")
    return dict(db.execute("SELECT node, count(*) FROM gpu_samples GROUP BY node").fetchall())
