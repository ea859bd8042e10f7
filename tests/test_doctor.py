"""horus doctor's offers and queue checks on hand-made files and jobs (the whole doctor runs against
the live cluster in test_live_placement.py and test_live_queue.py)."""

import os
import re
import time

import pytest

from slurm_horus.config import load_config
from slurm_horus.service.doctor import check_offers, check_queue
from slurm_horus.slurm.parse import QueueJob


def config(tmp_path, **values):
    return load_config({"socket": str(tmp_path / "h.sock"), **values}, environ={})


def write(tmp_path, text, mode=0o644):
    path = tmp_path / "h.sock.offers"
    path.write_text(text)
    os.chmod(path, mode)


def test_fresh_readable_offers_pass(tmp_path):
    write(tmp_path, "version=5;claimed=;generated=1000.0\n")
    assert check_offers(config(tmp_path), now=1001.0) == []


def test_missing_stale_unreadable_or_foreign_offers_are_named(tmp_path):
    assert "no such file" in check_offers(config(tmp_path))[0][1]
    write(tmp_path, "version=5;claimed=;generated=1000.0\n", mode=0o600)
    messages = [message for _level, message in check_offers(config(tmp_path), now=1010.0)]
    assert any("not world-readable" in m for m in messages)
    assert any("written 10 s ago" in m and "after 3 s" in m for m in messages)
    write(tmp_path, "hello\n")
    assert "no version header" in check_offers(config(tmp_path), now=1000.0)[0][1]


def test_offers_off_checks_nothing(tmp_path):
    assert check_offers(config(tmp_path, offers="no")) == []


def kept_job(job_id, submit, begin, token="mode=kept class=lm-bs20"):
    return QueueJob(job_id=job_id, name="j", state="PENDING", user="u", nodes="", required_nodes="", partition="gpu",
                    tres_per_node="gres:shard:1", comment="", admin_comment=f"horus:h{job_id} {token}",
                    submit_time=submit, start_time=begin, state_reason="BeginTime")


def test_the_queue_its_age_and_a_job_kept_past_the_lease(tmp_path):
    jobs = [kept_job(1, 900, 1020), kept_job(2, 950, 5000), kept_job(3, 990, 1000, token="mode=shared gpus=n1:0")]
    ping = {"lease_s": 30, "queue": {"kept": 2}}
    problems = check_queue(config(tmp_path), jobs, ping, now=1000.0)
    assert problems[0] == ("info", "queue: 2 jobs kept by horusd, the oldest for 100 s (lease 30 s)")
    assert [m for level, m in problems if level == "warning"] == [
        "job 2 is kept until " + time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(5000)) + ", past the 30 s lease: were horusd to stop, Slurm would not start it before then"]


def test_kept_jobs_horusd_does_not_count_or_a_silent_horusd_are_named(tmp_path):
    jobs = [kept_job(1, 900, 1020), kept_job(2, 900, 1020)]
    lost = check_queue(config(tmp_path), jobs, {"lease_s": 30, "queue": {"kept": 0}}, now=1000.0)
    assert ("warning", "squeue shows 2 kept jobs, horusd's queue 0") in lost
    silent = check_queue(config(tmp_path), jobs, None, now=1000.0)
    assert any("does not answer" in m for _level, m in silent)
    assert check_queue(config(tmp_path), [], None, now=1000.0) == [
        ("info", "queue: 0 jobs kept by horusd, the oldest for 0 s (lease 30 s)")]


@pytest.mark.parametrize("settings, says", [
    ({"policy": "nosuch"}, "unknown policy 'nosuch'"),
    ({"policy": "horus/min_tput=abc"}, "policy 'horus/min_tput=abc'"),
    ({"policy": "horus/no_such_option=1"}, "unknown option 'no_such_option'"),
    ({"policy": "horus-risk/oracle_pairs=true"}, "oracle_pairs read the simulator's truth"),
    ({"tcp": "nohost"}, "tcp: expected host:port"),
])
def test_doctor_refuses_what_serve_refuses(tmp_path, settings, says):
    from slurm_horus.errors import HorusError
    from slurm_horus.service.app import Horusd
    from slurm_horus.service.doctor import run_checks

    config = load_config(dict({"socket": str(tmp_path / "s.sock")}, **settings), environ={})
    problems = run_checks(config, tmp_path / "no-slurm.conf")
    assert any(level == "error" and says in message and "horus serve refuses it" in message
               for level, message in problems), problems
    with pytest.raises(HorusError, match=re.escape(says)):
        Horusd(config)


@pytest.mark.parametrize("binding", ["shard", "indexed", "node"])
def test_shipped_slurm_conf_snippets_are_complete(binding, tmp_path):
    from slurm_horus.resources import resource_path
    from slurm_horus.service.doctor import _check_slurm_conf, read_slurm_conf

    snippet = resource_path("hpc_configs", f"slurm.conf.{binding}")
    assert _check_slurm_conf(read_slurm_conf(snippet), binding) == []
