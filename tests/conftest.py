"""Shared fixtures: one real local Slurm cluster per test session (and one with slurmdbd).

Tests that use ``slurm_cluster`` get the ``slurm`` marker, those that use ``slurm_cluster_dbd`` the
``slurmdbd`` marker, automatically, so ``-m 'not slurm and not slurmdbd'`` runs the unit tests only.
A machine that lacks the Slurm packages fails these tests with the list of what to install; it
never skips them, so CI cannot turn green without a real cluster.

``HORUS_LOCAL_SLURM=24.11`` (or ``26.05``; ``make test-slurm-newer`` sets it) runs every cluster of the
session on that Slurm, from its chroot (slurm_horus/localcluster/chroot.py), and puts that Slurm's
commands first on ``PATH`` for the whole session, so that a test's own ``sbatch`` or ``sacct`` talks
to the cluster in the chroot as it would on a site running that version.
"""

import os

import pytest

from slurm_horus.localcluster import LocalCluster, prerequisite_problems
from slurm_horus.localcluster.chroot import slurm_install


def pytest_configure(config):
    install = slurm_install()
    if install.bin_dir is not None:
        install.prepare()  # builds the chroot the first time (1-3 minutes)
        os.environ.update(install.env({"PATH": os.environ.get("PATH", os.defpath)}))


def pytest_report_header(config):
    return f"local clusters run {slurm_install().describe()}"


@pytest.fixture(scope="session", autouse=True)
def chroot_released():
    """After the last cluster of the session is down, a chroot's mounts are gone too (unless another
    session still runs something inside it)."""
    yield
    install = slurm_install()
    if install.root is not None and not install.in_use():
        assert install.mounted() == [], "mounts left behind in the Slurm chroot"


def pytest_collection_modifyitems(items):
    for item in items:
        if "slurm_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.slurm)
        if "slurm_cluster_dbd" in item.fixturenames:
            item.add_marker(pytest.mark.slurmdbd)


def local_cluster(with_dbd=False, **options):
    """A started LocalCluster (``options`` as LocalCluster takes them), stopped again after the
    ``yield``: the body of a cluster fixture of any scope (``yield from local_cluster(...)``)."""
    problems = prerequisite_problems(with_dbd=with_dbd, install=slurm_install())
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)
    cluster = LocalCluster(with_dbd=with_dbd, **options).up()
    try:
        yield cluster
    finally:
        survivors = cluster.down()
        assert not survivors, f"processes left behind by the test cluster: {survivors}"


def horus_cluster(**settings):
    """A 2-node x 4-GPU cluster with horusd and the placing job_submit.lua (site ``settings`` for it),
    torn down with no process left behind: the body of a module-scoped fixture."""
    yield from local_cluster(nodes=2, gpus=4, horus=True, horus_settings=settings)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running 4-node x 4-GPU cluster without accounting (``SLURM_CONF`` in ``cluster.env``)."""
    yield from local_cluster(with_dbd=False)


@pytest.fixture(scope="session")
def slurm_cluster_dbd():
    """A running 4-node x 4-GPU cluster with slurmdbd + MariaDB, so sacct works."""
    yield from local_cluster(with_dbd=True)


def horusd_sees_now(cluster, timeout=30.0):
    """Wait until horusd's cluster state was read after this call began (its ping says how old the
    state is): a fixed sleep is not enough on a loaded machine, where a refresh takes longer and
    horusd spaces refreshes out (20x their cost). The demo waits the same way."""
    from slurm_horus.localcluster.horus import wait_refreshed

    wait_refreshed(cluster, timeout)
