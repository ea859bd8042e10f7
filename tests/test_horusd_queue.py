"""horusd's queue on hand-made snapshots (no Slurm): keeping, the queue rebuilt from squeue, the cycle.

The real-daemon side of the same path is tests/test_live_queue.py.
"""

import dataclasses

import pytest

from slurm_horus.service import lua_twin
from slurm_horus.service.daemon import MAX_KEPT
from slurm_horus.service.mover import _start_lines
from slurm_horus.service.protocol import encode_kv
from slurm_horus.service.snapshot import Snapshot
from slurm_horus.slurm.gres import parse_gres
from slurm_horus.slurm.parse import QueueJob
from slurm_horus.tokens import format_token, parse_horus_tokens, replace_token
from test_horusd_placer import Clock, ask, make_placer, node, offers_of, running


def kept(job_id, job_class="lm-bs20", tres="gres:shard:1", decision="", reason="BeginTime", nodes=1,
         submit=900, admin_comment=None, tres_per_job=""):
    token = f"horus:{decision or f'hk{job_id}'} mode=kept class={job_class}"
    return QueueJob(job_id=job_id, name="j", state="PENDING", user="u", nodes="", required_nodes="",
                    partition="gpu", tres_per_node=tres, comment="", admin_comment=admin_comment or token,
                    submit_time=submit, start_time=1030, gres_requested=parse_gres(tres), gres_allocated=[],
                    end_time=0, time_limit=60, gres_detail=(), state_reason=reason, node_count=nodes,
                    tres_per_job=tres_per_job)


def full(n=8):
    """n running exclusive 1-GPU jobs on n1 (4 GPUs) and n2 (4 GPUs)."""
    return [running(100 + i, f"n{1 + i // 4}", [f"gpu:g{i % 4}:1(IDX:{i % 4})"]) for i in range(n)]


def lua_ask(placer, job_class="lm-bs20", gpus=1, nodes=1):
    return ask(placer, job_class, gpus=gpus, nodes=nodes, keep=True, reply="kv")


def test_a_job_that_cannot_be_placed_is_kept_in_a_shape_horusd_can_move():
    placer = make_placer(jobs=full())
    shard = lua_ask(placer, "lm-bs20")
    assert shard["action"] == "keep" and shard["tres"] == "gres:shard:1" and shard["lease"] == 30
    assert shard["mode"] == "kept" and shard["class"] == "lm-bs20" and "GPU" in shard["reason"]
    whole = lua_ask(placer, None, gpus=2)  # unknown class, 2 GPUs: whole GPUs, untyped
    assert whole["action"] == "keep" and whole["tres"] == "gres:gpu:2"
    # the Lua accepts both replies as they travel
    conf = lua_twin.parse_config("")
    for reply in (shard, whole):
        parsed, why = lua_twin.parse_reply(encode_kv(reply), conf)
        assert why is None and parsed["action"] == "keep"
    assert placer.queue_waiting() and placer.kept_decisions == 2


def test_a_held_job_is_kept_without_making_the_next_ones_wait():
    clock = Clock()
    placer = make_placer(clock=clock, jobs=full(8))
    assert ask(placer, "lm-bs20", keep=True, reply="kv", held=True)["action"] == "keep"
    assert not placer.queue_waiting()
    clock.now += 1
    placer.load_snapshot(Snapshot([node("n1"), node("n2")], full(7), taken_at=clock()))  # a GPU frees
    assert lua_ask(placer, "lm-bs20")["action"] == "place"  # nobody waits before it


def test_other_clients_and_dry_runs_are_never_kept():
    placer = make_placer(jobs=full())
    assert ask(placer, "lm-bs20")["action"] == "unchanged"  # horus-sbatch cannot keep a job
    assert lua_ask(placer)["action"] == "keep"
    overtaking = ask(placer, "lm-bs20")  # nor jump the queue
    assert overtaking["action"] == "unchanged" and "joins them when submitted" in overtaking["reason"]
    assert ask(placer, "lm-bs20", keep=True, dry_run=True)["action"] == "unchanged"
    placer.queue_on = False
    assert lua_ask(placer)["action"] == "unchanged"


def test_a_new_job_joins_the_waiting_jobs_instead_of_overtaking_them():
    clock = Clock()
    placer = make_placer(clock=clock, jobs=full(7))  # one GPU free
    placer.load_snapshot(Snapshot([node("n1"), node("n2")], full(7) + [kept(7, "resnet50-bs64")], taken_at=clock()))
    assert len(placer.queue) == 1
    assert lua_ask(placer, "lm-bs20")["action"] == "keep"  # it would fit, but job 7 waits first
    assert offers_of(placer)[0] == {}  # no offer may be taken while jobs wait


def test_the_queue_is_rebuilt_from_squeue_and_the_shared_cycle_places_it():
    clock = Clock()
    waiting = [kept(1, "resnet18-bs32"), kept(2, "resnet18-bs64"), kept(3, None, tres="gres:gpu:2"),
               kept(4, "lm-bs20", reason="JobHeldUser")]
    placer = make_placer(clock=clock, jobs=full(4) + waiting)  # n2 free, n1 busy
    assert set(placer.kept) == {"1", "2", "3", "4"} and len(placer.queue) == 3  # held: kept, not placeable
    moves = placer.cycle()
    started = {m.kept.job_id: m.reply for m in moves}
    assert set(started) == {"1", "2", "3"} and len(placer.queue) == 0 and set(placer.kept) == {"4"}
    assert started["3"].tres.count("gres:gpu:g") == 2 and started["3"].mode == "exclusive"
    assert all(r.nodes == ("n2",) for r in started.values())
    assert started["1"].tres.startswith("gres:shard:g") and started["2"].tres.startswith("gres:shard:g")
    # every placement is in the state and the ledger under the kept decision id
    assert {m.reply.id for m in moves} == {"hk1", "hk2", "hk3"} <= set(placer.ledger.entries)
    # squeue still shows them kept (the moves are on their way): the ledger holds them, not the queue
    clock.now += 1
    placer.load_snapshot(Snapshot([node("n1"), node("n2")], full(4) + waiting, taken_at=clock()))
    assert len(placer.queue) == 0 and placer.cycle() == []
    assert placer.state.n_free == 8 - 4 - len({g for m in moves for g in placer.ledger.get(m.reply.id).job.gpus})


def test_a_restarted_horusd_finds_its_queue_in_squeue():
    waiting = [kept(i, "resnet50-bs64") for i in range(1, 4)]
    fresh = make_placer(jobs=full(8) + waiting)  # as a new horusd would read it
    assert [req.job_id for req in fresh.queue] == ["1", "2", "3"] and fresh.kept_job_ids() == ["1", "2", "3"]
    assert fresh.cycle() == []  # full: they wait
    assert fresh.queue_summary()["kept"] == 3 and fresh.queue_summary()["oldest_s"] == 100.0


def test_a_cycle_never_shares_over_the_slowdown_limit():
    placer = make_placer(jobs=full(7) + [kept(1, "recommendation-bs2048"), kept(2, "recommendation-bs2048")])
    placer.slowdown_limit = 1.01
    moves = placer.cycle()
    assert len(moves) == 1 and len(placer.queue) == 1  # the second one waits for a GPU of its own


def test_a_kept_job_without_a_gpu_request_is_given_its_shard_back():
    cut_short = kept(5, tres="")  # a shard move interrupted between its two updates
    halfway = kept(6, None, tres="", tres_per_job="gres:gpu:2")  # whole GPUs, per job for a moment
    placer = make_placer(jobs=[cut_short, halfway])
    assert placer.take_unshaped() == ["5"] and placer.take_unshaped() == []
    assert placer.kept["6"].request.gpus_per_node == 2 and placer.kept["6"].request.exclusive


def test_a_job_read_in_the_middle_of_its_move_is_not_given_its_shard_back():
    """squeue read between the mover's two updates shows the job asking for no GPU; restoring it then
    undid the move (seen on 26.05 under load: placed on GPU 3, ran on GPU 0)."""
    clock = Clock()
    placer = make_placer(clock=clock, jobs=full(7) + [kept(5, "lm-bs20")])
    moves = placer.cycle()
    assert [m.kept.job_id for m in moves] == ["5"]
    clock.now += 1
    placer.load_snapshot(Snapshot([node("n1"), node("n2")], full(7) + [kept(5, "lm-bs20", tres="")], taken_at=clock()))
    assert placer.take_unshaped() == []
    assert placer.ledger.get(moves[0].reply.id) is not None  # still placed where the cycle put it


def test_the_moves_in_scontrol_form():
    placer = make_placer(jobs=[kept(1, "lm-bs20"), kept(2, None, tres="gres:gpu:2")])
    moves = {m.kept.job_id: m for m in placer.cycle()}
    shard, whole = _start_lines(moves["1"]), _start_lines(moves["2"])
    reply = moves["1"].reply
    assert shard == [(["1"], {"TresPerNode": ""}),
                     (["1"], {"TresPerNode": reply.tres, "NodeList": reply.nodes[0], "StartTime": "now"})]
    assert whole[0] == (["2"], {"TresPerNode": "", "TresPerJob": "gres:gpu:2"})  # never without GPUs
    assert whole[1][1]["TresPerJob"] == "" and whole[1][1]["TresPerNode"].count("gres:gpu:g") == 2
    # as horusd sends them: the first update also renews the lease, so that the job cannot start in between
    held = [_start_lines(moves[j], hold_s=30) for j in ("1", "2")]
    assert [lines[0][1]["StartTime"] for lines in held] == ["now+30", "now+30"]
    assert [lines[1] for lines in held] == [shard[1], whole[1]] and held[0][0][1]["TresPerNode"] == ""
    # the placed token replaces the kept one, as job_submit.lua would have written it
    token = format_token(reply.id, reply.mode, reply.job_class, reply.slowdown, reply.gpulist)
    admin = replace_token("JS1:x " + moves["1"].kept.admin_comment, reply.id, token)
    lua_job = {"admin_comment": "JS1:x"}
    lua_twin.append_token(lua_job, {k: encode_kv({k: v}).split("=", 1)[1] for k, v in reply.wire().items()
                                    if k in ("id", "mode", "slowdown", "class", "gpulist")})
    assert admin == lua_job["admin_comment"]
    assert parse_horus_tokens(admin) == (reply.id, {"mode": reply.mode, "slowdown": f"{reply.slowdown:.3f}",
                                                    "class": "lm-bs20", "gpus": reply.gpulist})


def test_on_a_newer_slurm_keeps_and_moves_are_spelled_gres_slash():
    """24.11+ spell requests gres/ (and 24.11 refuses gres: from job_submit.lua): horusd answers, keeps
    and moves in the spelling of the Slurm its snapshot names; kept jobs read back in that spelling."""
    from slurm_horus.slurm.version import SlurmVersion

    newer = SlurmVersion(24, 11, 5)
    placer = make_placer(jobs=full())
    placer.load_snapshot(Snapshot(placer_nodes(), full(), taken_at=placer.clock(), slurm_version=newer))
    assert lua_ask(placer, "lm-bs20")["tres"] == "gres/shard:1"
    assert lua_ask(placer, None, gpus=2)["tres"] == "gres/gpu:2"
    jobs = [kept(1, "lm-bs20", tres="gres/shard:1"), kept(2, None, tres="gres/gpu:2")]
    placer.load_snapshot(Snapshot(placer_nodes(), jobs, taken_at=placer.clock(), slurm_version=newer))
    assert placer.kept["1"].request.gpus_per_node == 1 and not placer.kept["1"].request.exclusive
    assert placer.kept["2"].request.gpus_per_node == 2 and placer.kept["2"].request.exclusive
    moves = {m.kept.job_id: m for m in placer.cycle()}
    shard, whole = _start_lines(moves["1"]), _start_lines(moves["2"])
    assert shard[0] == (["1"], {"TresPerNode": ""}) and shard[1][1]["TresPerNode"].startswith("gres/shard:g")
    assert whole[0] == (["2"], {"TresPerNode": "", "TresPerJob": "gres/gpu:2"})
    assert whole[1][1]["TresPerNode"].count("gres/gpu:g") == 2 and "gres:" not in whole[1][1]["TresPerNode"]


def placer_nodes():
    from test_horusd_placer import node

    return [node("n1"), node("n2")]


def test_node_binding_moves_by_node_only():
    placer = make_placer(binding="node", jobs=[kept(1, "lm-bs20", tres="gres:gpu:1")])
    (move,) = placer.cycle()
    assert _start_lines(move) == [(["1"], {"NodeList": move.reply.nodes[0], "StartTime": "now"})]


def test_kept_jobs_are_capped():
    placer = make_placer(jobs=full())
    placer.unseen_keeps = {f"h{i}": 1e18 for i in range(MAX_KEPT)}
    assert lua_ask(placer)["action"] == "unchanged"


@pytest.mark.parametrize("reason", ["JobHeldAdmin", "Dependency"])
def test_held_or_dependent_kept_jobs_wait_outside_the_queue(reason):
    placer = make_placer(jobs=[dataclasses.replace(kept(1), state_reason=reason)])
    assert placer.kept_job_ids() == ["1"] and not placer.queue and placer.cycle() == []


PARTITIONS = """PartitionName=train Default=YES Nodes=n1 PriorityTier=1 State=UP
PartitionName=infer Default=NO Nodes=n[2-3] PriorityTier=10 State=UP
PartitionName=infer-lend Default=NO Nodes=n2 PriorityTier=1 State=UP
"""


def test_jobs_slurm_may_start_by_preempting_are_never_kept():
    from slurm_horus.slurm.partitions import parse_partitions, parse_preempt_type, preemption

    parts = parse_partitions(PARTITIONS)
    assert [(p.name, p.nodes, p.tier, p.default) for p in parts][1] == ("infer", ("n2", "n3"), 10, False)
    lending = preemption(parse_preempt_type("PreemptMode = REQUEUE\nPreemptType = preempt/partition_prio\n"), parts)
    assert lending.preemptors == {"infer"} and lending.default_partition == "train"
    assert lending.may_preempt("infer") and lending.may_preempt("train,infer") and not lending.may_preempt("")
    assert preemption("preempt/qos", parts).may_preempt("train")
    assert preemption(parse_preempt_type("PreemptType = preempt/none"), parts).preemptors == frozenset()
    placer = make_placer(jobs=full())
    placer.preemption = lending
    assert ask(placer, "lm-bs20", keep=True, reply="kv", partition="infer")["action"] == "unchanged"  # Slurm preempts
    assert ask(placer, "lm-bs20", keep=True, reply="kv", partition="train")["action"] == "keep"


def test_the_jobs_horusd_decides_about_carry_the_duration_estimate_of_the_history():
    """One estimator (placement/duration.py) fed with the history store's finished jobs: kept jobs,
    submissions and running jobs all carry its answer (the user's runs of that class, else the class's,
    capped by the time limit); before any history, the time limit."""
    from slurm_horus.placement.duration import estimator_from_records
    from slurm_horus.service.protocol import parse_request

    jobs = full() + [kept(1, "lm-bs20"), kept(2, "resnet18-bs32")]
    placer = make_placer(jobs=jobs)
    assert {r.job_id: r.predicted_duration for r in placer.queue} == {"1": 3600.0, "2": 3600.0}  # the limit
    assert placer.state.jobs["100"].expected_end == 950.0 + 3600.0  # its start + the limit
    rows = [{"user": "u", "job_class": "lm-bs20", "elapsed_s": s, "end_time": 100 + s, "n_gpus": 0, "shards": 1}
            for s in (500, 600, 700)]
    rows += [{"user": "w", "job_class": "resnet18-bs32", "elapsed_s": 7200, "end_time": 50, "n_gpus": 1}]
    placer.set_durations(estimator_from_records(rows))
    placer.load_snapshot(Snapshot([node("n1"), node("n2")], jobs, taken_at=placer.clock()))
    # user+class: the median of u's lm-bs20 runs; class: w's run, capped by the 60-minute limit
    assert {r.job_id: r.predicted_duration for r in placer.queue} == {"1": 600.0, "2": 3600.0}
    # a running job of u (class unknown): u's runs, from its start (950), before Slurm's end (5000)
    assert placer.state.jobs["100"].expected_end == 950.0 + 600.0
    request = parse_request({"op": "place", "job_class": "lm-bs20", "user": "u", "time_limit_min": 5})
    assert placer.job_request(request, "d1").predicted_duration == 300.0  # capped by its own 5 minutes


def test_horusd_reads_the_run_times_of_the_history_store(tmp_path):
    """The edge: history.py reads the store's finished GPU jobs (whole GPUs or shards; not CPU jobs, not
    running ones) and hands a fed estimator over."""
    from slurm_horus.service.history import History
    from slurm_horus.store.db import open_db

    db_path = tmp_path / "h.db"
    db = open_db(db_path)
    base = {"cluster": "c", "user": "u", "job_class": "lm-bs20", "state": "COMPLETED"}
    db["jobs"].insert_all([
        {**base, "job_id": 1, "elapsed_s": 400, "end_time": 1000, "n_gpus": 1, "shards": 0},
        {**base, "job_id": 2, "elapsed_s": 600, "end_time": 2000, "n_gpus": 0, "shards": 1},
        {**base, "job_id": 3, "elapsed_s": 9000, "end_time": 3000, "n_gpus": 0, "shards": 0},  # CPU only
        {**base, "job_id": 4, "elapsed_s": 50, "end_time": None, "n_gpus": 1, "shards": 0},  # still running
        {**base, "job_id": 5, "elapsed_s": 800, "end_time": 4000, "n_gpus": 1, "shards": 0, "state": "NODE_FAIL"},
    ])
    got = []
    history = History(str(db_path), on_durations=got.append)
    estimator = history.load_durations()
    assert got == [estimator] and estimator.observed == 2
    assert estimator.estimate("u", "lm-bs20").seconds == 500.0
    assert History(str(tmp_path / "nothere" / "x" / "\0bad")).duration_estimator() is None  # unreadable: None


def _site_fed_from(tmp_path, rows):
    """A history store holding ``rows`` and an empty site file: (the site file, ``fed(environ)`` ->
    (the config those settings give, the duration estimator horusd feeds from the store with it))."""
    from slurm_horus.config import load_config
    from slurm_horus.service.app import duration_settings
    from slurm_horus.service.history import History
    from slurm_horus.store.db import open_db

    open_db(tmp_path / "h.db")["jobs"].insert_all(rows)
    site_file = tmp_path / "horus.conf"
    site_file.write_text("")

    def fed(environ):
        config = load_config(environ=dict(environ, HORUS_DB=str(tmp_path / "h.db")), path=str(site_file))
        return config, History(config.db, duration_settings=duration_settings(config)).duration_estimator()
    return site_file, fed


def test_duration_levels_site_setting_reaches_horusds_estimator(tmp_path):
    """``duration_levels = measured``: the estimator horusd feeds from its store tries the history that
    follows the run times best first (here the user: the class is drawn at random); ``fixed`` (the
    default) keeps user+class > class > user > site on the same history; another value is an error
    line that names the setting."""
    import random

    from slurm_horus.config import load_config
    from slurm_horus.errors import ConfigError
    from slurm_horus.service.app import build_placer

    rng = random.Random(3)
    rows = []
    for k in range(300):
        who, cls = rng.randrange(4), rng.randrange(6)
        rows.append({"cluster": "c", "job_id": k, "user": f"u{who}", "job_class": f"c{cls}", "state": "COMPLETED",
                     "elapsed_s": round(100 * 3 ** who * rng.lognormvariate(0, 0.3)), "end_time": 1000 + k,
                     "n_gpus": 1, "shards": 0})
    site_file, fed = _site_fed_from(tmp_path, rows)
    orders = {}
    for levels in ("fixed", "measured"):
        config, estimator = fed({"HORUS_DURATION_LEVELS": levels})
        assert config.duration_levels == levels
        placer = build_placer(config)
        assert placer.durations.order_text == "user+class > class > user > site"  # nothing learned yet
        orders[levels] = estimator.order_text
    assert orders["fixed"] == "user+class > class > user > site"
    assert orders["measured"].startswith("user >")
    with pytest.raises(ConfigError, match="duration_levels"):
        load_config(environ={"HORUS_DURATION_LEVELS": "best"}, path=str(site_file))


def test_duration_recent_site_setting_reaches_horusds_estimator(tmp_path):
    """``duration_recent = start``: horusd's estimator, fed from its store, takes the median of the runs
    that started last (the store's start times); ``end`` (the default) of those that ended last; another
    value is an error line that names the setting."""
    from slurm_horus.config import load_config
    from slurm_horus.errors import ConfigError

    # ten long runs that started first and ended last, and ten short ones started after them
    rows = [{"cluster": "c", "job_id": k, "user": "u", "job_class": "c", "state": "COMPLETED", "elapsed_s": 60,
             "start_time": 1000 + 100 * k, "end_time": 1060 + 100 * k, "n_gpus": 1, "shards": 0} for k in range(10)]
    rows += [{"cluster": "c", "job_id": 10 + k, "user": "u", "job_class": "c", "state": "COMPLETED",
              "elapsed_s": 20000, "start_time": 900 + k, "end_time": 20900 + k, "n_gpus": 1, "shards": 0}
             for k in range(10)]
    site_file, fed = _site_fed_from(tmp_path, rows)
    seconds = {}
    for recent in ("end", "start"):
        config, estimator = fed({"HORUS_DURATION_RECENT": recent})
        assert config.duration_recent == recent
        seconds[recent] = estimator.seconds("u", "c")[0]
    assert seconds == {"end": 20000.0, "start": 60.0}
    assert load_config(environ={}, path=str(site_file)).duration_recent == "end"
    with pytest.raises(ConfigError, match="duration_recent"):
        load_config(environ={"HORUS_DURATION_RECENT": "submit"}, path=str(site_file))


def test_a_pair_only_predicted_is_probed_once_until_horusd_learns_it():
    """horusd's cycle is the simulator's, ``probe_once`` included: with every GPU running a shareable
    resnet18-bs32 job and four more waiting, the pair (only predicted) is formed once (four times
    without the rule); the next refresh, which shows the probe running next to its resident in squeue,
    still holds it; once the pair is measured, the others join."""
    def residents():
        return [running(100 + i, f"n{1 + i // 4}", [f"shard:g{i % 4}:1(IDX:{i % 4})"],
                        admin_comment=f"horus:h{i} mode=shareable slowdown=1.000 class=resnet18-bs32") for i in range(8)]

    waiting = [kept(i, "resnet18-bs32", submit=900 + i) for i in range(1, 5)]
    assert len(make_placer(policy="horus/probe_once=false", jobs=residents() + waiting).cycle()) == 4
    clock = Clock()
    placer = make_placer(clock=clock, jobs=residents() + waiting)
    moves = placer.cycle()
    assert len(moves) == 1 and moves[0].kept.job_id == "1"
    (g,) = placer.ledger.get(moves[0].reply.id).job.gpus
    where, idx = placer.state.nodes[placer.state.gpu_node[g]].name, int(placer.state.gpu_index[g])
    probe = running(1, where, [f"shard:g{idx}:1(IDX:{idx})"],
                    admin_comment=f"horus:{moves[0].reply.id} mode=shareable slowdown=1.000 class=resnet18-bs32")
    clock.now += 1
    placer.load_snapshot(Snapshot([node("n1"), node("n2")], residents() + [probe] + waiting[1:], taken_at=clock()))
    assert placer.cycle() == [] and len(placer.queue) == 3
    assert placer.policy.counters() == {"explored:v100": 1}
    placer.policy.observe("v100", "resnet18-bs32", "resnet18-bs32", 0.7)  # measured (horusd: its feed, a reload)
    assert len(placer.cycle()) == 3
