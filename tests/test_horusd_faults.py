"""horusd under faults (issue 15): a dead thread ends the process, a slow slurmctld does not stop refreshes.

The cluster snapshot comes from a hand-made reader (as in test_horusd_placer.py); the same faults on
real daemons are in test_horusd_attacks_live.py.
"""

import threading
import time

import pytest

from slurm_horus.config import load_config
from slurm_horus.errors import HorusError
from slurm_horus.service.app import MAX_REFRESH_INTERVAL_S, Horusd, refresh_interval
from slurm_horus.service.daemon import Snapshot

from slurm_horus.localcluster import poll as wait_until
from test_horusd_placer import MODEL, node, running


class WaitingReader:
    """Reads a fixed snapshot; ``wait_s`` > 0 makes a read wait first (slurmctld restarting)."""

    def __init__(self):
        self.wait_s = 0.0
        self.reads = 0

    def read(self):
        self.reads += 1
        time.sleep(self.wait_s)
        return Snapshot([node("n1")], [], taken_at=time.time())


def started_horusd(tmp_path, reader, **settings):
    config = load_config({"socket": f"/tmp/horus-faults-{id(reader)}.sock", "db": str(tmp_path / "h.db"),
                          **settings}, environ={})
    horusd = Horusd(config, reader=reader, predictor_factory=lambda kind: MODEL)
    horusd.start()
    return horusd


def test_the_refresh_back_off_is_bounded():
    assert refresh_interval(1.0, 0.0) == 1.0
    assert refresh_interval(1.0, 0.2) == pytest.approx(4.0)
    assert refresh_interval(1.0, 100.0) == MAX_REFRESH_INTERVAL_S
    assert refresh_interval(60.0, 100.0) == 60.0  # never below the configured period


def test_a_refresh_that_waited_on_slurmctld_does_not_stop_the_refreshes(tmp_path):
    """A refresh straddling a slurmctld restart once took ~4 s and stopped refreshes for ~90 s."""
    reader = WaitingReader()
    horusd = started_horusd(tmp_path, reader, refresh_s=0.5)
    try:
        reader.wait_s = 2.0
        horusd.wake.set()
        time.sleep(0.5)
        reader.wait_s = 0.0
        reads = reader.reads
        time.sleep(3.5)  # the slow read ends ~1.5 s in; then at most a refresh_s or two
        assert reader.reads >= reads + 2
        assert horusd.refresh_interval < 1.0
    finally:
        horusd.stop()


def test_a_vital_thread_that_dies_makes_horusd_exit_non_zero(tmp_path):
    horusd = started_horusd(tmp_path, WaitingReader(), offers="yes")

    def broken():
        raise RuntimeError("deliberate")

    horusd.placer.apply_claims = broken  # the offers thread calls it outside its own guard
    horusd.offers_changed.set()
    outcome = {}

    def run():
        try:
            horusd.run_until_stopped()
        except HorusError as exc:
            outcome["error"] = exc

    waiter = threading.Thread(target=run)
    waiter.start()
    waiter.join(10)
    assert not waiter.is_alive()
    assert outcome["error"].exit_code == 70 and "horusd-offers" in str(outcome["error"])


def test_a_dead_socket_front_is_noticed_even_without_an_exception(tmp_path):
    horusd = started_horusd(tmp_path, WaitingReader())
    horusd.frontend.stopping.set()  # the loop ends quietly: horusd must not live on deaf
    with pytest.raises(HorusError):
        horusd.run_until_stopped()


class EndingReader(WaitingReader):
    """Shows job 5 COMPLETING for the first ``completing`` reads after it is told, then gone."""

    def __init__(self):
        super().__init__()
        self.completing = 0

    def read(self):
        self.reads += 1
        jobs = [running(5, "n1", ["gpu:g0:1(IDX:0)"], state="COMPLETING")] if self.completing > 0 else []
        self.completing -= 1
        return Snapshot([node("n1")], jobs, taken_at=time.time())


def test_an_ended_notice_reads_the_queue_at_once_and_again_while_the_job_completes(tmp_path):
    """EpilogSlurmctld's word (op ended) wakes the refresher: with refreshes every 60 s, reads follow
    within a second, again while squeue still shows the job COMPLETING, and stop once it is gone."""
    reader = EndingReader()
    horusd = started_horusd(tmp_path, reader, refresh_s=60.0, cycle_s=60.0)
    try:
        assert wait_until(lambda: reader.reads >= 1, 10)  # the first read at start
        time.sleep(0.3)
        reads = reader.reads
        reader.completing = 3
        assert horusd.decide({"op": "ended", "job_id": 5, "peer": "controller"}) is None  # a notification
        assert wait_until(lambda: reader.reads >= reads + 4, 10), "not read again while the job completed"
        settled = reader.reads
        time.sleep(1.0)
        assert reader.reads == settled, "read again after the job was gone"
        assert horusd.decide({"op": "ping", "peer": "controller"})["ended_notices"] == 1
        # the same notice for a job squeue no longer shows: one read, no retries
        horusd.decide({"op": "ended", "job_id": 6, "peer": "controller"})
        assert wait_until(lambda: reader.reads >= settled + 1, 10)
        time.sleep(1.0)
        assert reader.reads == settled + 1
    finally:
        horusd.stop()
