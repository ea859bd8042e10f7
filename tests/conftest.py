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


def horusd_sees_now(cluster, timeout=30.0):
    """Wait until horusd's cluster state was read after this call began (its ping says how old the
    state is): a fixed sleep is not enough on a loaded machine, where a refresh takes longer and
    horusd spaces refreshes out (20x their cost)."""
    import time

    from slurm_horus.service import protocol

    started = time.time()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = protocol.ask({"op": "ping"}, cluster.horus_socket, timeout_s=2.0)
        if reply is not None and time.time() - reply["state_age_s"] > started + 0.05:
            return
        time.sleep(0.1)
    raise AssertionError(f"horusd read no cluster state within {timeout} s")
