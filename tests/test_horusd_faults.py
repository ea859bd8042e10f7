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
    """Shows job 5 on GPU 0 of n1: RUNNING, then COMPLETING once ``completing`` is set."""

    def __init__(self):
        super().__init__()
        self.completing = False

    def read(self):
        self.reads += 1
        job = running(5, "n1", ["gpu:g0:1(IDX:0)"], state="COMPLETING" if self.completing else "RUNNING")
        return Snapshot([node("n1")], [job], taken_at=time.time())


def gpu0_jobs(horusd):
    with horusd.placer.lock:
        return int(horusd.placer.state.gpu_njobs[0])


def test_an_ended_notice_frees_the_gpus_at_once_and_reads_the_queue(tmp_path):
    """EpilogSlurmctld's word (op ended): the job's GPU is free in horusd's state before the answer,
    stays free while squeue shows the job COMPLETING, and horusd reads the queue again at once
    (its own refreshes here: every 60 s)."""
    reader = EndingReader()
    horusd = started_horusd(tmp_path, reader, refresh_s=60.0, cycle_s=60.0)
    try:
        assert wait_until(lambda: reader.reads >= 1 and horusd.placer.state is not None, 10)
        assert gpu0_jobs(horusd) == 1
        reads = reader.reads
        reader.completing = True
        assert horusd.decide({"op": "ended", "job_id": 5, "peer": "controller"}) == {"ok": True, "moved": 0}
        assert gpu0_jobs(horusd) == 0
        assert wait_until(lambda: reader.reads > reads, 10), "the queue was not read again"
        assert gpu0_jobs(horusd) == 0  # squeue's COMPLETING record does not hold it again
        assert horusd.decide({"op": "ping", "peer": "controller"})["ended_notices"] == 1
        # a RUNNING record is Slurm's word: a notice never frees a GPU squeue shows in use
        reader.completing = False
        horusd.wake.set()
        assert wait_until(lambda: gpu0_jobs(horusd) == 1, 10)
    finally:
        horusd.stop()


def test_ended_lines_that_waited_together_are_answered_together():
    from slurm_horus.service.protocol import parse_request

    request = parse_request({"op": "ended", "job_ids": [7, "8", 7, None, -1, 2 ** 40, True, 1.5]})
    assert request.job_ids == [7, 8]
    assert parse_request({"op": "ended", "job_id": 9}).job_ids == [9]
    assert parse_request({"op": "ended"}).job_ids == []


class RenewalRacingMover:
    """A Mover whose lease renewal lets horusd's cycle move a kept job while it runs (the renewal's
    scontrol takes seconds for thousands of kept jobs); records what horusd asked of Slurm."""

    def __init__(self, horusd):
        self.horusd = horusd
        self.calls = []
        self.cycle_during_renewal = True

    def renew(self, job_ids, lease_s):
        self.calls.append(("renew", sorted(job_ids)))
        if self.cycle_during_renewal:
            self.horusd.run_cycle_once()

    def start(self, moves, hold_s=None):
        self.calls.append(("start", sorted(m.kept.job_id for m in moves)))
        return []

    def release(self, job_ids):
        self.calls.append(("release", sorted(job_ids)))

    def restore(self, shapes):
        self.calls.append(("restore", shapes))


def test_a_job_moved_while_its_lease_is_renewed_is_started_again_after_the_renewal(tmp_path):
    """The renewal's StartTime=now+lease can reach Slurm after the move's StartTime=now: the job would
    wait a whole lease on the GPU it was placed on. horusd starts such jobs again once the renewal is
    done; a renewal during which nothing moved sends nothing more."""
    from test_horusd_queue import kept

    config = load_config({"socket": f"/tmp/horus-renew-{id(tmp_path)}.sock", "db": str(tmp_path / "h.db")},
                         environ={})
    horusd = Horusd(config, reader=None, predictor_factory=lambda kind: MODEL)
    mover = horusd.mover = RenewalRacingMover(horusd)
    horusd.placer.load_snapshot(Snapshot([node("n1")], [kept(7, "resnet18-bs32")], taken_at=time.time()))
    assert horusd.placer.kept_job_ids() == ["7"]
    horusd.renew_leases()
    assert mover.calls == [("renew", ["7"]), ("start", ["7"]), ("release", ["7"])]
    mover.calls.clear()
    horusd.placer.load_snapshot(Snapshot([node("n1")], [kept(8, "resnet18-bs32")], taken_at=time.time()))
    mover.cycle_during_renewal = False
    horusd.renew_leases()
    assert mover.calls == [("renew", ["8"])]
    assert horusd.run_cycle_once() == 1 and mover.calls[-1] == ("start", ["8"])  # no renewal running: no release


def test_jobs_let_go_by_the_kill_switch_during_a_renewal_are_let_go_again_after_it(tmp_path):
    from test_horusd_queue import full, kept

    config = load_config({"socket": f"/tmp/horus-renew-{id(tmp_path)}.sock", "db": str(tmp_path / "h.db"),
                          "disable_file": str(tmp_path / "off")}, environ={})
    horusd = Horusd(config, reader=None, predictor_factory=lambda kind: MODEL)
    mover = horusd.mover = RenewalRacingMover(horusd)
    horusd.placer.load_snapshot(Snapshot([node("n1"), node("n2")], full(8) + [kept(7)], taken_at=time.time()))

    def switched_off_meanwhile(job_ids, lease_s):
        mover.calls.append(("renew", sorted(job_ids)))
        (tmp_path / "off").write_text("")
        horusd.run_cycle_once()

    mover.renew = switched_off_meanwhile
    horusd.renew_leases()
    assert mover.calls == [("renew", ["7"]), ("release", ["7"]), ("release", ["7"])]
