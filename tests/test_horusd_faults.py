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

from test_horusd_placer import MODEL, node


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
