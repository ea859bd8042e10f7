"""Shared fixtures: one real local Slurm cluster per test session (and one with slurmdbd).

Tests that use ``slurm_cluster`` get the ``slurm`` marker, those that use ``slurm_cluster_dbd`` the
``slurmdbd`` marker, automatically, so ``-m 'not slurm and not slurmdbd'`` runs the unit tests only.
A machine that lacks the Slurm packages fails these tests with the list of what to install; it
never skips them, so CI cannot turn green without a real cluster.
"""

import pytest

from slurm_horus.localcluster import LocalCluster, prerequisite_problems


def pytest_collection_modifyitems(items):
    for item in items:
        if "slurm_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.slurm)
        if "slurm_cluster_dbd" in item.fixturenames:
            item.add_marker(pytest.mark.slurmdbd)


def local_cluster(with_dbd=False, **options):
    """A started LocalCluster (``options`` as LocalCluster takes them), stopped again after the
    ``yield``: the body of a cluster fixture of any scope (``yield from local_cluster(...)``)."""
    problems = prerequisite_problems(with_dbd=with_dbd)
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
