"""horusd's Placer on hand-made cluster snapshots (no Slurm): ledger, bindings, classes, staleness."""

import dataclasses
import re

import pytest

from slurm_horus.interference import build_model
from slurm_horus.placement.cycle import PendingQueue, run_cycle
from slurm_horus.placement.policies import PolicyModels, make_policy
from slurm_horus.service.app import Horusd
from slurm_horus.jobclass import job_class_of
from slurm_horus.service.daemon import Placer
from slurm_horus.service.protocol import parse_request
from slurm_horus.service.snapshot import Snapshot
from slurm_horus.slurm.gres import parse_gres
from slurm_horus.slurm.parse import NodeInfo, QueueJob
from slurm_horus.slurm.partitions import Preemption

from shard_packing import packing_by_the_simulators_cycle

MODEL = build_model("chain")


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def node(name, gpus=4, partitions=("gpu",), state="idle"):
    gres = ",".join(f"gpu:g{i}:1" for i in range(gpus)) + "," + ",".join(f"shard:g{i}:2" for i in range(gpus))
    return NodeInfo(name=name, state=state, state_flags=(), cpus=8, alloc_cpus=0, real_memory=4000,
                    alloc_memory=0, partitions=partitions, gres=parse_gres(gres), gres_used=[])


def running(job_id, nodes, details, admin_comment="", comment="", state="RUNNING"):
    return QueueJob(job_id=job_id, name="j", state=state, user="u", nodes=nodes, required_nodes="",
                    partition="gpu", tres_per_node="", comment=comment, admin_comment=admin_comment,
                    submit_time=900, start_time=950, gres_requested=parse_gres("gpu:1") if state == "PENDING" else [],
                    gres_allocated=[], end_time=5000, time_limit=60, gres_detail=tuple(details))


def make_placer(binding="shard", policy="horus", clock=None, nodes=None, jobs=()):
    clock = clock or Clock()
    placer = Placer(None, binding=binding, gpu_type="v100", clock=clock)
    placer.policy = make_policy(policy, PolicyModels(placer.classes, lambda kind: MODEL))
    placer.load_snapshot(Snapshot(nodes or [node("n1"), node("n2")], list(jobs), taken_at=clock()))
    return placer


def ask(placer, job_class=None, gpus=1, nodes=1, **extra):
    message = {"op": "place", "gpus_per_node": gpus, "num_nodes": nodes, **extra}
    if job_class:
        message["job_class"] = job_class
    return place(placer, message)


def place(placer, message):
    """What horusd does with one request line: read it once, decide, send the wire form."""
    return placer.place(parse_request(message)).wire()


def confirm(placer, **message):
    return placer.confirm(parse_request({"op": "confirm", **message})).wire()


def claim(placer, **message):
    placer.claim(parse_request({"op": "claim", **message}))


def offers_of(placer):
    offers, generation, last_claim, _joint = placer.compute_offers()
    return {k: v.wire() for k, v in offers.items()}, generation, last_claim


def test_ledger_keeps_a_burst_from_piling_onto_one_gpu():
    placer = make_placer()
    chosen = [(",".join(r["nodes"]), r["tres"]) for r in (ask(placer, "resnet50-bs64") for _ in range(8))]
    assert len(set(chosen)) == 8  # 8 free GPUs, 8 decisions, no two alike
    assert len(placer.ledger.entries) == 8


def test_ledger_entry_ends_when_squeue_shows_its_token():
    clock = Clock()
    placer = make_placer(clock=clock)
    reply = ask(placer, "resnet50-bs64")
    gpu = int(reply["tres"].split(":g")[1].split(":")[0])
    seen = running(7, ",".join(reply["nodes"]), [f"shard:g{gpu}:1(IDX:{gpu})"],
                   admin_comment=f"JS1:x horus:{reply['id']} mode=shareable slowdown=1.000 class=resnet50-bs64")
    clock.now += 1
    placer.load_snapshot(Snapshot([node("n1"), node("n2")], [seen], taken_at=clock()))
    assert placer.ledger.entries == {}
    job = placer.state.jobs["7"]
    assert job.job_class == "resnet50-bs64" and not job.exclusive  # class read back from the token


def test_ledger_entry_expires_when_slurm_never_shows_the_job():
    clock = Clock()
    placer = make_placer(clock=clock)
    ask(placer, "resnet50-bs64")
    clock.now += placer.ledger_ttl_s + 1
    placer.load_snapshot(Snapshot([node("n1"), node("n2")], [], taken_at=clock()))
    assert placer.ledger.entries == {} and placer.state.jobs == {}


def test_shard_binding_for_known_class_whole_gpu_for_unknown():
    placer = make_placer()
    known = ask(placer, "resnet18-bs32")
    assert known["tres"].startswith("gres:shard:g") and known["mode"] == "shareable" and known["class"] == "resnet18-bs32"
    assert not {"gres", "job_class", "decision_id", "predicted_slowdown"} & set(known)  # one name per field
    unknown = ask(placer)
    assert unknown["tres"].startswith("gres:gpu:g") and unknown["mode"] == "exclusive"
    assert unknown["binding"] == "indexed" and unknown["class"] == "unknown"


def test_indexed_and_node_bindings():
    indexed = ask(make_placer(binding="indexed"), "resnet18-bs32", gpus=2)
    assert indexed["tres"].count("gres:gpu:g") == 2 and indexed["mode"] == "exclusive"
    node_only = ask(make_placer(binding="node"), "resnet18-bs32", gpus=2)
    assert node_only["tres"] == "gres:gpu:2" and node_only["nodes"] in (["n1"], ["n2"])


def test_multi_node_job_with_different_indices_falls_back_to_node_binding():
    busy = running(1, "n1", ["gpu:g0:1(IDX:0)"])
    placer = make_placer(binding="indexed", jobs=[busy])
    reply = ask(placer, "resnet18-bs32", gpus=3, nodes=2)
    assert reply["action"] == "place" and sorted(reply["nodes"]) == ["n1", "n2"]
    # n1 can only offer 1,2,3 and n2 offers 0,1,2: one tres_per_node string cannot say both
    assert reply["binding"] == "node" and reply["tres"] == "gres:gpu:3"


def test_complementary_pair_shares_heavy_pair_waits_under_pressure():
    jobs = [running(i, f"n{1 + i // 4}", [f"gpu:g{i % 4}:1(IDX:{i % 4})"]) for i in range(7)]
    placer = make_placer(jobs=jobs)
    first = ask(placer, "resnet18-bs32")
    assert first["action"] == "place"
    second = ask(placer, "resnet18-bs64")
    assert (second["nodes"], second["tres"]) == (first["nodes"], first["tres"]) and second["mode"] == "shared"
    heavy = make_placer(jobs=jobs)
    ask(heavy, "recommendation-bs2048")
    refused = ask(heavy, "recommendation-bs2048")
    assert refused["action"] == "unchanged" and "no pair predicted worth sharing" in refused["reason"]


def test_after_leaving_a_job_to_slurm_nothing_is_pinned_until_a_fresh_state():
    clock = Clock()
    jobs = [running(i, f"n{1 + i // 4}", [f"gpu:g{i % 4}:1(IDX:{i % 4})"]) for i in range(8)]
    woken = []
    placer = make_placer(clock=clock, jobs=jobs)
    placer.on_left_to_slurm = lambda: woken.append(True)
    assert ask(placer, "resnet50-bs64")["action"] == "unchanged"  # full
    assert woken == [True]
    clock.now += 0.1
    placer.load_snapshot(Snapshot([node("n1"), node("n2")], [], taken_at=clock() - 0.5))  # older: still uncertain
    assert "fresh cluster state" in ask(placer, "resnet50-bs64")["reason"]  # left to Slurm too
    placer.load_snapshot(Snapshot([node("n1"), node("n2")], [], taken_at=clock() + 0.01))  # read after both
    assert ask(placer, "resnet50-bs64")["action"] == "place"


def test_down_and_drained_nodes_get_nothing():
    placer = make_placer(nodes=[node("n1", state="down"), node("n2", state="drained"), node("n3")])
    replies = [ask(placer, "resnet50-bs64") for _ in range(5)]
    assert {",".join(r["nodes"]) for r in replies if r["action"] == "place"} == {"n3"}


def test_dry_run_records_nothing():
    placer = make_placer()
    reply = ask(placer, "resnet50-bs64", dry_run=True, explain=True)
    assert reply["action"] == "place" and placer.ledger.entries == {} and reply["candidates"]


def test_no_gpu_request_is_left_alone():
    placer = make_placer()
    assert ask(placer, gpus=0)["action"] == "unchanged"
    assert place(placer, {"op": "place", "tres_per_node": "gres:shard:g1:1"})["action"] == "unchanged"  # typed: pinned
    assert place(placer, {"op": "place", "tres_per_node": "gres:mps:50"})["action"] == "unchanged"
    assert place(placer, {"op": "place", "tres_per_job": "gres:gpu:2", "job_class": "lm-bs20"})["action"] == "place"
    assert place(placer, {"op": "place", "tres_per_job": "gres/gpu=4", "num_nodes": 2, "job_class": "lm-bs20"})[
        "gpus"].keys() == {"n1", "n2"}
    assert place(placer, {"op": "place", "tres_per_job": "gres:gpu:3", "num_nodes": 2})["reason"] == \
        "gpus per job not divisible by nodes"


@pytest.mark.parametrize("known, expected", [
    ({"hints": {"HORUS_CLASS": "bert-large"}}, "bert-large"),
    ({"hints": {"HORUS_MODEL": "ResNet50", "HORUS_BATCH_SIZE": "64"}}, "resnet50-bs64"),
    ({"requested": "lm-bs20"}, "lm-bs20"),
    ({"requested": "unknown", "comment": "class=lm-bs20"}, "lm-bs20"),
    ({"comment": "exp 3, class=transformer-bs64"}, "transformer-bs64"),
    ({"comment": "nothing here"}, "unknown"),
    ({"hints": {"HORUS_CLASS": "bad class; rm"}}, "unknown"),
    ({"admin_comment": "JS1:x horus:h1 mode=kept class=a3c", "comment": "class=lm-bs20"}, "a3c"),
    ({"admin_comment": "horus:h1 mode=kept", "comment": "class=lm-bs20"}, "lm-bs20"),
])
def test_job_class_of(known, expected):
    assert job_class_of(**known) == expected
    if "hints" in known or "requested" in known:  # what horusd reads from a request
        request = parse_request({"op": "place", "gpus_per_node": 1, "hints": known.get("hints"),
                                 "job_class": known.get("requested"), "comment": known.get("comment")})
        assert request.job_class == expected


class FixedReader:
    def __init__(self, snapshot):
        self.snapshot = snapshot

    def read(self):
        return self.snapshot


def test_horusd_answers_unchanged_on_stale_state(tmp_path):
    from slurm_horus.config import load_config

    config = load_config({"socket": str(tmp_path / "s.sock"), "refresh_s": 1.0}, environ={})
    horusd = Horusd(config, reader=FixedReader(Snapshot([node("n1")], [], taken_at=0.0)),
                    predictor_factory=lambda kind: MODEL)
    horusd.refresh_once()  # a snapshot taken at the epoch: hopelessly old
    reply = horusd.decide({"op": "place", "gpus_per_node": 1, "job_class": "lm-bs20"})
    assert reply == {"ok": True, "action": "unchanged", "reason": "cluster state is stale"}
    assert horusd.decide({"op": "bogus"})["ok"] is False


def test_confirm_returns_the_token_fields_to_the_same_user_only():
    placer = make_placer()
    reply = ask(placer, "resnet18-bs32", uid=1000)
    confirmed = confirm(placer, id=reply["id"], uid=1000)
    assert confirmed == {"ok": True, "action": "confirm", "id": reply["id"], "mode": "shareable",
                         "slowdown": reply["slowdown"], "class": "resnet18-bs32", "gpulist": reply["gpulist"]}
    assert reply["gpulist"] == f"{reply['nodes'][0]}:{reply['gpus'][reply['nodes'][0]][0]}"
    assert confirm(placer, id=reply["id"], uid=1001)["action"] == "unchanged"
    assert confirm(placer, id="hnothere", uid=1000)["action"] == "unchanged"


def test_nonsense_sizes_are_left_to_slurm_with_a_reason():
    placer = make_placer()
    assert place(placer, {"op": "place", "gpus_per_node": "two"}) == {
        "ok": True, "action": "unchanged", "reason": "bad gpus_per_node or num_nodes"}
    assert place(placer, {"op": "place", "gpus_per_node": 1, "num_nodes": 0})["reason"] == "no gpu requested"


def test_a_pair_over_the_slowdown_limit_is_left_to_slurm_and_pins_nothing_until_a_refresh():
    jobs = [running(i, f"n{1 + i // 4}", [f"gpu:g{i % 4}:1(IDX:{i % 4})"]) for i in range(7)]
    placer = make_placer(jobs=jobs)
    placer.slowdown_limit = 1.01  # any real sharing is over it
    ask(placer, "resnet50-bs64")  # the last free GPU
    over = ask(placer, "lm-bs20")
    assert over["action"] == "unchanged" and placer.left_to_slurm_since is not None


def test_offers_for_requested_classes_and_a_claim_records_the_offer():
    changes = []
    placer = make_placer()
    placer.on_change = lambda: changes.append(1)
    assert offers_of(placer) == ({}, placer.generation, "")  # nobody asked yet
    ask(placer, "lm-bs20")
    ask(placer)  # unknown class
    offers, generation, _last_claim = offers_of(placer)
    assert generation == placer.generation
    assert set(offers) == {"lm-bs20", "unknown"}
    offer = offers["lm-bs20"]
    assert offer["action"] == "place" and offer["id"] not in placer.ledger
    busy_before = placer.state.busy_gpus()
    claimed = []
    placer.on_claimed = lambda request, reply: claimed.append(reply.id)
    claim(placer, id=offer["id"], uid=5)
    assert changes and offer["id"] not in placer.ledger  # queued: applied by the next reader
    claim(placer, id=offer["id"])  # spent
    claim(placer, id="hbogus")
    next_offers, _, last_claim = offers_of(placer)
    assert claimed == [offer["id"]] and last_claim == offer["id"]
    assert offer["id"] in placer.ledger and placer.ledger.get(offer["id"]).uid == 5
    assert placer.state.busy_gpus() == busy_before + 1
    assert placer.generation > generation  # the offers computed before the claim are void
    # the next offer for the class has moved on to another GPU
    assert next_offers["lm-bs20"]["gpulist"] != offer["gpulist"]


@pytest.mark.parametrize("taken", [(0, 1, 2), (0, 2), (1, 2), (2,), (0,)])
def test_offers_are_joint_any_of_them_may_be_taken_together(taken):
    """Each class's offer is computed as if the offers before it were taken (job_submit.lua takes
    several of one version without waiting for its claims): three free GPUs go to three classes;
    whichever of them are claimed, no GPU holds more than the policy allows, and computing them
    leaves the state as it was."""
    placer = make_placer(nodes=[node("n1", gpus=3)])
    classes = ["resnet50-bs64", "lm-bs20", "transformer-bs64"]
    for job_class in classes:
        placer.offers.note_class(job_class)
    jobs_before, version_before = dict(placer.state.jobs), placer.state.version
    offers, _generation, _last = offers_of(placer)
    assert placer.state.jobs == jobs_before and placer.state.busy_gpus() == 0  # the phantoms are gone
    assert placer.state.version > version_before  # (they were there: caches keyed on it see a change)
    assert list(offers) == classes
    assert len({offers[c]["gpulist"] for c in classes}) == 3  # each knew those before it were taken
    assert not placer.policy.fragmentation.counts  # the phantoms did not run: the workload is unchanged
    for i in taken:
        claim(placer, id=offers[classes[i]]["id"])
    placer.apply_claims()
    assert all(offers[classes[i]]["id"] in placer.ledger for i in taken)
    njobs = placer.state.gpu_njobs
    assert max(njobs) <= 1 and sum(njobs) == len(taken)


def test_no_joint_offer_shares_a_gpu_only_because_the_offers_before_it_took_the_free_ones():
    placer = make_placer(nodes=[node("n1", gpus=2)])
    for job_class in ["resnet50-bs64", "lm-bs20", "transformer-bs64"]:
        placer.offers.note_class(job_class)
    offers, _generation, _last, joint = placer.compute_offers()
    # transformer-bs64 would pair with a phantom: its offer is computed on the state alone, after the
    # joint ones (job_submit.lua takes it only as the first of its version)
    assert list(offers) == ["resnet50-bs64", "lm-bs20", "transformer-bs64"] and joint == 2
    assert {offer.mode for offer in offers.values()} == {"shareable"}
    assert offers["transformer-bs64"].gpulist in (offers["resnet50-bs64"].gpulist, offers["lm-bs20"].gpulist)
    assert len(placer.offers.offered) == 3  # the dropped joint offer cannot be claimed
    # on a full cluster (nothing free to waste) joint offers may share
    ask(placer, "resnet50-bs64")
    ask(placer, "lm-bs20")
    offers, _generation, _last, joint = placer.compute_offers()
    assert joint == len(offers) > 0 and all(offer.mode == "shared" for offer in offers.values())


def test_a_decision_applies_the_queued_claims_first():
    placer = make_placer(nodes=[node("n1", gpus=3)])
    first = ask(placer, "lm-bs20")
    offer = offers_of(placer)[0]["lm-bs20"]
    claim(placer, id=offer["id"])
    reply = ask(placer, "resnet50-bs64")
    assert offer["id"] in placer.ledger and reply["gpulist"] not in (offer["gpulist"], first["gpulist"])


def test_no_offers_while_a_job_left_to_slurm_may_be_starting():
    jobs = [running(i, f"n{1 + i // 4}", [f"gpu:g{i % 4}:1(IDX:{i % 4})"]) for i in range(8)]
    placer = make_placer(jobs=jobs)
    ask(placer, "lm-bs20")  # full: left to Slurm
    assert placer.left_to_slurm_since is not None and offers_of(placer)[0] == {}


def test_a_pinned_job_still_pending_at_a_refresh_keeps_its_gpu():
    # squeue shows the token while Slurm has not started the job yet: the ledger entry ends, so the
    # reservation must come from the queue itself (this also survives a restart of horusd)
    clock = Clock()
    placer = make_placer(clock=clock, nodes=[node("n1", gpus=2)])
    first = ask(placer, "resnet50-bs64")
    token = (f"horus:{first['id']} mode={first['mode']} slowdown={first['slowdown']} class=resnet50-bs64 "
             f"gpus={first['gpulist']}")
    queued = running(7, "", [], admin_comment=token, state="PENDING")
    clock.now += 1
    placer.load_snapshot(Snapshot([node("n1", gpus=2)], [queued], taken_at=clock()))
    assert placer.ledger.entries == {}
    assert placer.state.jobs["7"].gpus == (int(first["gpulist"].split(":")[1]),)
    second = ask(placer, "resnet50-bs64")
    assert second["gpulist"] != first["gpulist"]  # a free GPU, not the one the pending job will get


def test_held_or_dependent_pending_jobs_reserve_nothing():
    token = "horus:h1 mode=shareable slowdown=1.000 class=resnet50-bs64 gpus=n1:0"
    held = dataclasses.replace(running(7, "", [], admin_comment=token, state="PENDING"), state_reason="JobHeldUser")
    bogus = running(8, "", [], admin_comment="horus:h2 mode=shareable gpus=n9:0,n1:77", state="PENDING")
    placer = make_placer(nodes=[node("n1", gpus=2)], jobs=[held, bogus])
    assert placer.state.jobs == {}


def read_offers(path):
    header, *lines = path.read_text().splitlines()
    assert re.match(r"^version=\d+;claimed=[\w-]*;joint=\d+;generated=\d+\.\d+$", header), header
    return int(header.split(";")[0].split("=")[1]), dict(line.split("\t", 1) for line in lines)


def offering_horusd(tmp_path, jobs=()):
    from slurm_horus.config import load_config

    config = load_config({"socket": str(tmp_path / "s.sock"), "offers": "yes"}, environ={})
    horusd = Horusd(config, reader=FixedReader(Snapshot([node("n1"), node("n2")], list(jobs), taken_at=1e12)),
                    predictor_factory=lambda kind: MODEL)
    horusd.placer.clock = lambda: 1e12
    horusd.refresh_once()
    return horusd, tmp_path / "s.sock.offers"


def test_a_decision_spends_the_offers_published_before_it(tmp_path):
    horusd, offers_file = offering_horusd(tmp_path)
    first = horusd.decide({"op": "place", "gpus_per_node": 1, "job_class": "lm-bs20"})
    assert horusd.publish_offers()
    version, offers = read_offers(offers_file)
    assert "lm-bs20" in offers and first["gpulist"] not in offers["lm-bs20"]
    # job_submit.lua asks (a reply in key=value form): its reply names the newest version, which the
    # Lua then never takes from; nothing is written on the decision path
    lua = horusd.decide({"op": "place", "reply": "kv", "gpus_per_node": 1, "job_class": "resnet50-bs64"})
    assert lua["action"] == "place" and lua["offers_version"] == version
    assert read_offers(offers_file) == (version, offers)
    # another client (horus-sbatch): the submissions that follow never see its reply, so the offers
    # are withdrawn before the reply exists
    other = horusd.decide({"op": "place", "gpus_per_node": 1, "job_class": "resnet50-bs64"})
    withdrawn_version, withdrawn = read_offers(offers_file)
    assert withdrawn == {} and withdrawn_version > version and other["action"] == "place"
    assert horusd.publish_offers()
    _version, fresh = read_offers(offers_file)
    assert all(reply["gpulist"] not in fresh["lm-bs20"] for reply in (first, lua, other))


def test_offers_computed_on_a_state_that_changed_meanwhile_are_not_written(tmp_path):
    horusd, offers_file = offering_horusd(tmp_path)
    horusd.decide({"op": "place", "gpus_per_node": 1, "job_class": "lm-bs20"})
    placer = horusd.placer
    compute = placer.compute_offers

    def compute_then_decision_lands():
        computed = compute()
        horusd.decide({"op": "place", "gpus_per_node": 1, "job_class": "lm-bs20"})
        return computed

    placer.compute_offers = compute_then_decision_lands
    before = offers_file.read_text() if offers_file.exists() else ""
    assert horusd.publish_offers() is False
    assert (offers_file.read_text() if offers_file.exists() else "") == before


def test_offer_versions_grow_across_a_restart(tmp_path):
    first, offers_file = offering_horusd(tmp_path)
    first.publish_offers()
    old_version, _ = read_offers(offers_file)
    second, _ = offering_horusd(tmp_path)
    second.publish_offers()
    assert read_offers(offers_file)[0] > old_version


def test_unclaimed_offers_are_forgotten_after_the_ledger_ttl():
    clock = Clock()
    placer = make_placer(clock=clock)
    ask(placer, "lm-bs20")
    first = offers_of(placer)[0]
    for _ in range(50):
        offers_of(placer)
    assert len(placer.offers.offered) == 51
    clock.now += placer.ledger_ttl_s + 1
    latest = offers_of(placer)[0]
    assert list(placer.offers.offered) == [latest["lm-bs20"]["id"]]
    claim(placer, id=first["lm-bs20"]["id"])
    offers_of(placer)
    assert first["lm-bs20"]["id"] not in placer.ledger  # too old to be claimed


def test_the_offers_file_names_the_last_claim_its_offers_know(tmp_path):
    horusd, offers_file = offering_horusd(tmp_path)
    horusd.decide({"op": "place", "gpus_per_node": 1, "job_class": "lm-bs20"})
    assert horusd.publish_offers()
    _version, offers = read_offers(offers_file)
    offer_id = re.search(r";id=(h[0-9a-f]+);", offers["lm-bs20"]).group(1)
    assert ";claimed=;" in offers_file.read_text()
    assert horusd.decide({"op": "claim", "id": offer_id}) is None  # queued, no answer
    assert horusd.publish_offers()
    assert f";claimed={offer_id};" in offers_file.read_text()
    assert offer_id in horusd.placer.ledger


def test_a_reload_keeps_queued_claims_the_ledger_and_the_last_claim(tmp_path, monkeypatch):
    horusd, offers_file = offering_horusd(tmp_path)
    site = tmp_path / "horus.conf"
    site.write_text(f"socket = {tmp_path / 's.sock'}\ndb = {tmp_path / 'h.db'}\n")
    monkeypatch.setenv("HORUS_CONFIG", str(site))
    first = horusd.decide({"op": "place", "gpus_per_node": 1, "job_class": "lm-bs20"})
    horusd.publish_offers()
    offer = read_offers(offers_file)[1]["lm-bs20"]
    offer_id = re.search(r";id=(h[0-9a-f]+);", offer).group(1)
    offer_gpus = re.search(r";gpulist=([^;]+);", offer).group(1)
    horusd.decide({"op": "claim", "id": offer_id})  # queued when the reload comes
    old = horusd.placer
    horusd.reload()
    assert horusd.placer is not old
    assert offer_id in horusd.placer.ledger and horusd.placer.offers.last_claim == offer_id
    horusd.placer.clock = lambda: 1e12
    assert horusd.publish_offers()
    _version, offers = read_offers(offers_file)
    assert f";claimed={offer_id};" in offers_file.read_text()
    fresh_gpus = re.search(r";gpulist=([^;]+);", offers["lm-bs20"]).group(1)
    assert fresh_gpus not in (first["gpulist"], offer_gpus)  # the new placer knows both jobs


# ---- issue 18: what users hit first -------------------------------------------------------------

def test_a_gpu_type_the_user_asked_for_is_kept():
    clock = Clock()
    placer = Placer(None, binding="indexed", gpu_type="v100", clock=clock)
    placer.policy = make_policy("horus", PolicyModels(placer.classes, lambda kind: MODEL))
    placer.load_snapshot(Snapshot([node("n1"), node("n2")], [], taken_at=clock(), features={"n2": "p100"}))
    for _ in range(4):  # only n2's GPUs are P100s: every P100 job goes there, until they are taken
        assert ask(placer, "resnet50-bs64", gpu_type="P100")["nodes"] == ["n2"]
    assert ask(placer, "resnet50-bs64", gpu_type="p100")["action"] == "unchanged"
    absent = ask(placer, "resnet50-bs64", gpu_type="a100")
    assert absent["action"] == "unchanged" and "no GPU of type a100" in absent["reason"]
    assert ask(placer, "resnet50-bs64", gpu_type="bad type;x")["reason"] == "bad gpu_type"
    # from the TRES string (horus-sbatch), and node binding keeps the type in what it writes
    node_placer = make_placer(binding="node")
    reply = place(node_placer, {"op": "place", "tres_per_node": "gres:gpu:v100:2", "job_class": "resnet50-bs64"})
    assert reply["action"] == "place" and reply["tres"] == "gres:gpu:v100:2"


def test_an_opted_out_request_is_left_unchanged():
    placer = make_placer()
    for extra in ({"hints": {"HORUS_OFF": "yes"}}, {"comment": "class=lm-bs20 horus=off"}):
        reply = ask(placer, "lm-bs20", **extra)
        assert reply["action"] == "unchanged" and "opted out" in reply["reason"]
    assert len(placer.ledger) == 0


def test_a_class_the_model_does_not_know_runs_alone_and_gets_suggestions():
    placer = make_placer()
    placer.known_classes = set(MODEL.index.names)
    reply = ask(placer, "resnet5-bs64")
    assert reply["class_known"] is False and "resnet50-bs64" in reply["class_suggestions"]
    assert reply["mode"] == "exclusive" and reply["tres"].startswith("gres:gpu:g")  # no shard: nobody joins
    known = ask(placer, "resnet50-bs64")
    assert known["class_known"] is True and known["mode"] == "shareable"


def queued_array(job_id, tasks, per_node=1, required="", reason="None"):
    job = running(job_id, "", [], state="PENDING")
    return dataclasses.replace(job, tasks=tasks, required_nodes=required, state_reason=reason,
                               gres_requested=parse_gres(f"gpu:{per_node}"))


def test_pending_jobs_horusd_did_not_pin_hold_the_gpus_slurm_will_give_them():
    # an array of 3 and a 2-GPU job on n2, queued but not started: Slurm takes n1's GPUs 0-2 and two
    # of n2's first; a pinned job must go elsewhere
    placer = make_placer(binding="indexed", jobs=[queued_array(5, 3), queued_array(6, 1, per_node=2, required="n2")])
    held = sorted(g for job in placer.state.jobs.values() for g in job.gpus)
    assert held == [0, 1, 2, 4, 5]
    assert all(job.exclusive for job in placer.state.jobs.values())
    reply = ask(placer, "resnet50-bs64")
    assert (reply["nodes"], reply["tres"]) in ((["n1"], "gres:gpu:g3:1"), (["n2"], "gres:gpu:g2:1"),
                                               (["n2"], "gres:gpu:g3:1"))
    # held and dependent jobs will not start soon: they hold nothing
    assert make_placer(jobs=[queued_array(5, 3, reason="Dependency")]).state.jobs == {}


def test_a_job_left_to_slurm_pauses_pinning_until_the_next_refresh():
    clock = Clock()
    placer = make_placer(clock=clock)
    placer.note_left_to_slurm()
    assert "fresh cluster state" in ask(placer, "resnet50-bs64")["reason"]
    clock.now += 1
    placer.load_snapshot(Snapshot([node("n1"), node("n2")], [], taken_at=clock()))
    assert ask(placer, "resnet50-bs64")["action"] == "place"


def test_explain_candidates_carry_counts_real_scores_and_the_corunner_slowdown():
    placer = make_placer(nodes=[node("n1", gpus=2)])
    free = ask(placer, "resnet18-bs32", explain=True)
    assert free["candidates_total"] == 2 and free["gpus_total"] == 2
    assert all("score 1.000" in c["why"] for c in free["candidates"]), free["candidates"]
    assert "shared via shard" in free["reason"] and "exclusive" not in free["reason"]
    ask(placer, "resnet18-bs32")  # the second GPU taken too: the next job must share
    shared = ask(placer, "resnet18-bs64", explain=True)
    sharing = [c for c in shared["candidates"] if c["corunner_slowdown"] is not None]
    assert sharing and all(c["corunner_slowdown"] >= 1.0 for c in sharing)


def test_a_job_answered_during_the_pause_extends_it_to_a_state_read_after_it():
    # three jobs left to Slurm in a row: a refresh read between the first and the third does not
    # show the third, which Slurm may start on any free GPU: pinning must wait for a newer read
    clock = Clock()
    placer = make_placer(clock=clock, nodes=[node("n1", gpus=1)])
    ask(placer, "resnet50-bs64")
    ask(placer, "recommendation-bs2048")  # no room: left to Slurm, pinning paused
    clock.now += 0.5
    assert "fresh cluster state" in ask(placer, "resnet50-bs64")["reason"]  # left to Slurm as well
    placer.load_snapshot(Snapshot([node("n1", gpus=1)], [], taken_at=clock() - 0.2))  # read before it
    assert placer.left_to_slurm_since is not None
    placer.load_snapshot(Snapshot([node("n1", gpus=1)], [], taken_at=clock() + 0.1))
    assert placer.left_to_slurm_since is None


# ---- issue 15: what one user may hold through the user socket ----------------------------------
def test_decisions_asked_on_the_user_socket_hold_few_gpus_for_a_short_time():
    """16 recorded requests of one user once held all 16 GPUs for 60 s, and real jobs went to Slurm."""
    clock = Clock()
    placer = make_placer(clock=clock, nodes=[node(f"n{i}") for i in range(1, 5)])
    replies = [ask(placer, "resnet50-bs64", peer="user", uid=999, user="horustest") for _ in range(16)]
    held = [r for r in replies if r["action"] == "place"]
    assert 0 < len(held) <= 4
    assert "unconfirmed" in replies[-1]["reason"]
    assert ask(placer, "resnet50-bs64", peer="user", uid=1000)["action"] == "place"  # another user
    assert ask(placer, "resnet50-bs64", peer="user", uid=999, dry_run=True)["action"] == "place"
    # job_submit.lua's requests (the controller socket) are not limited
    assert all(ask(placer, "lm-bs20", peer="controller", uid=999)["action"] == "place" for _ in range(8))
    clock.now += 20  # horus-sbatch submits at once; a decision nobody submitted lapses soon
    placer.load_snapshot(Snapshot([node(f"n{i}") for i in range(1, 5)], [], taken_at=clock()))
    assert all(not entry.from_user for entry in placer.ledger.entries.values())
    assert ask(placer, "resnet50-bs64", peer="user", uid=999)["action"] == "place"


def test_junk_classes_from_users_take_no_offer_slot_and_old_classes_make_room():
    placer = make_placer()
    for i in range(64):
        ask(placer, f"junk{i}", peer="user", uid=999)
    assert list(placer.offers.requested_classes) == []  # horus-sbatch's requests do not ask for offers
    for i in range(70):
        ask(placer, f"old{i}", peer="controller", dry_run=True)  # not recorded: no offer either
        ask(placer, f"cls{i}", peer="controller")
        placer.ledger.entries.clear()
        placer.load_snapshot(Snapshot([node("n1"), node("n2")], [], taken_at=placer.clock()))
    ask(placer, "cls3", peer="controller")
    classes = list(placer.offers.requested_classes)
    assert len(classes) == 64 and classes[-1] == "cls3" and "cls69" in classes and "cls5" not in classes


def test_only_the_horusd_beside_the_controller_in_control_answers(tmp_path):
    """Failover: horusd follows `scontrol ping` (the first controller that answers is in control)."""
    from slurm_horus.config import load_config
    from slurm_horus.slurm.parse import parse_ping

    pings = {"now": "Slurmctld(primary) at ctl1 is UP\nSlurmctld(backup) at ctl2 is UP\n"}
    jobs = [running(0, "n1", ["gpu:g0:1(IDX:0)"])]
    config = load_config({"socket": str(tmp_path / "s.sock"), "controller_host": "ctl2", "db": str(tmp_path / "h.db")},
                         environ={})
    horusd = Horusd(config, reader=FixedReader(Snapshot([node("n1")], jobs, taken_at=1e12)),
                    predictor_factory=lambda kind: MODEL, controllers=lambda: parse_ping(pings["now"]))
    horusd.placer.clock = lambda: 1e12
    assert horusd.check_controller() is False  # the backup beside ctl2 waits
    assert horusd.decide({"op": "place", "gpus_per_node": 1, "job_class": "lm-bs20"}) == {
        "ok": True, "action": "unchanged", "reason": "standby: slurmctld on ctl2 is not in control (ctl1 is)"}
    assert horusd.decide({"op": "ping"})["active"] is False and horusd.placer.state is None
    assert horusd.decide({"op": "claim", "id": "x"}) is None
    pings["now"] = "Slurmctld(primary) at ctl1 is DOWN\nSlurmctld(backup) at ctl2 is UP\n"
    assert horusd.check_controller() is True  # the primary is gone: ctl2 is in control
    ping = horusd.decide({"op": "ping"})
    assert ping["active"] and ping["in_control"] == "ctl2" and ping["jobs"] == 1  # rebuilt from squeue
    placed = horusd.decide({"op": "place", "gpus_per_node": 1, "job_class": "lm-bs20"})
    assert placed["action"] == "place" and placed["gpulist"] != "n1:0"
    pings["now"] = "Slurmctld(primary) at ctl1 is UP\nSlurmctld(backup) at ctl2 is UP\n"
    assert horusd.check_controller() is False  # the primary is back and takes control again
    assert (tmp_path / "s.sock.offers").read_text().count("\n") == 1  # offers withdrawn: a header only
    # a single controller (or one this horusd does not serve): always answer
    pings["now"] = "Slurmctld(primary) at ctl1 is UP\n"
    assert horusd.check_controller() is True


def test_a_shard_binding_places_nothing_where_slurm_offers_no_shards():
    """After a backup controller took over, Slurm 22.05 reported shard:gK:0 and refused shard jobs:
    placing one there would cost the user the submission, so the job is left to Slurm instead."""
    shardless = NodeInfo(name="n1", state="idle", state_flags=(), cpus=8, alloc_cpus=0, real_memory=4000,
                         alloc_memory=0, partitions=("gpu",), gres=parse_gres("gpu:g0:1,gpu:g1:1,shard:g0:0,shard:g1:0"),
                         gres_used=[])
    placer = make_placer(nodes=[shardless])
    assert ask(placer, "resnet18-bs32")["action"] == "unchanged"
    assert ask(make_placer(binding="indexed", nodes=[shardless]), "resnet18-bs32")["action"] == "place"


def deepboot_placer(clock):
    """n1 trains, n2 serves inference; two training jobs borrow n2's GPUs (the older on g0)."""
    nodes = [node("n1", gpus=2, partitions=("train",)), node("n2", gpus=2, partitions=("infer", "infer-lend"))]
    older = dataclasses.replace(running(1, "n2", ["gpu:g0:1(IDX:0)"]), partition="infer-lend", start_time=900)
    younger = dataclasses.replace(running(2, "n2", ["gpu:g1:1(IDX:1)"]), partition="infer-lend", start_time=960)
    busy = [dataclasses.replace(running(10 + i, "n1", [f"gpu:g{i}:1(IDX:{i})"]), partition="train") for i in range(2)]
    placer = Placer(None, binding="indexed", gpu_type="v100", clock=clock)
    placer.policy = make_policy("deepboot", PolicyModels(placer.classes, lambda kind: MODEL))
    placer.load_snapshot(Snapshot(nodes, [older, younger, *busy], taken_at=clock(),
                                  preemption=Preemption(frozenset({"infer"}))))
    return placer


def test_deepboot_reclaim_in_horusd_is_the_simulator_cycles_decision():
    """An inference job that finds no free GPU: horusd reclaims through the scheduling cycle's own
    step (what the simulator runs) and pins the job to the victim's GPU, so that Slurm's preemption
    takes that job (the most recently started borrower), not one of its own choosing."""
    clock = Clock()
    sim = deepboot_placer(clock)
    req = sim.job_request(parse_request({"op": "place", "partition": "infer", "gpus_per_node": 1,
                                         "num_nodes": 1, "job_class": "lm-bs20"}), "q1")
    queue = PendingQueue(sim.policy)
    queue.add(req)
    preempted, started = [], []
    run_cycle(sim.state, sim.policy, queue, clock(), lambda r, d: started.append(d) or True,
              preempt=lambda job_id: preempted.append(sim.state.release(job_id).job_id))
    assert preempted == ["2"] and started[0].gpus == {"n2": [1]}

    placer = deepboot_placer(clock)
    dry = ask(placer, "lm-bs20", partition="infer", dry_run=True)
    assert dry["action"] == "unchanged" and set(placer.state.jobs) == {"1", "2", "10", "11"}  # nothing taken
    other = deepboot_placer(clock)  # the user socket is not trusted to take jobs off the state
    assert ask(other, "lm-bs20", partition="infer", peer="user", uid=1000)["action"] == "unchanged"
    assert set(other.state.jobs) == {"1", "2", "10", "11"}
    reply = ask(placer, "lm-bs20", partition="infer")
    assert reply["nodes"] == ["n2"] and "gres:gpu:g1:1" in reply["tres"]  # the GPU of job 2
    assert "2" not in placer.state.jobs and "1" in placer.state.jobs and "reclaimed the GPUs of job 2" in reply["reason"]
    # training asks for no reclaim: it waits (or is left to Slurm)
    assert ask(placer, "resnet50-bs64", partition="train")["action"] != "place"
    assert {"1", "10", "11"} <= set(placer.state.jobs) and "2" not in placer.state.jobs


@pytest.mark.parametrize("policy", ["horus", "fgd"])
def test_shard_requests_are_placed_on_one_gpus_free_shards_as_the_simulator_says(policy):
    """--gres=shard:3 of 8-shard GPUs: each job gets 3 shards of one GPU (gres:shard:gK:3), never
    more than 8 on a GPU, exactly where the simulator's scheduling cycle puts the same requests."""
    eight = [NodeInfo(name=n, state="idle", state_flags=(), cpus=8, alloc_cpus=0, real_memory=4000,
                      alloc_memory=0, partitions=("gpu",), gres=parse_gres(
                          ",".join(f"gpu:g{i}:1" for i in range(4)) + ",shard:32"), gres_used=[])
             for n in ("n1", "n2")]
    placer = make_placer(policy=policy, nodes=eight)
    got = []
    for _ in range(8):
        reply = place(placer, {"op": "place", "tres_per_node": "gres:shard:3", "partition": "gpu"})
        assert reply["action"] == "place" and reply["mode"] == "fraction", reply
        node = reply["nodes"][0] if isinstance(reply["nodes"], list) else reply["nodes"]
        (index,) = reply["gpus"][node]
        assert reply["tres"] == f"gres:shard:g{index}:3"
        got.append((node, index))
    assert got == packing_by_the_simulators_cycle(policy, [3] * 8, lambda kind: MODEL)
    assert max(got.count(g) for g in set(got)) * 3 <= 8  # never over a GPU's 8 shards
    # a ninth job that fits nowhere whole... fits: 2 x 3 of 8 leaves 2 per GPU; shard:3 now fails open
    for _ in range(16 - len(got)):
        place(placer, {"op": "place", "tres_per_node": "gres:shard:3", "partition": "gpu"})
    reply = place(placer, {"op": "place", "tres_per_node": "gres:shard:3", "partition": "gpu"})
    assert reply["action"] == "unchanged"  # no GPU has 3 shards left: left to Slurm, never kept


def store_observations(db_path, rows):
    """(gpu type, class, co-runner class, norm_tput) per observation, each of its own job pair."""
    from slurm_horus.store.db import open_db

    db = open_db(db_path)
    db["observations"].insert_all(
        {"cluster": "c", "job_id": 100 + i, "corunner_job_id": 500 + i, "gpu_type": g, "job_class": a,
         "corunner_class": b, "norm_tput": t} for i, (g, a, b, t) in enumerate(rows))
    db.conn.close()


def site_horusd(tmp_path, monkeypatch, policy, db_path, nodes=("n1",)):
    """A Horusd reading the site file ``tmp_path/horus.conf`` (what a reload re-reads), returned with it."""
    from slurm_horus.config import load_config

    site = tmp_path / "horus.conf"
    site.write_text(f"socket = {tmp_path / 's.sock'}\ndb = {db_path}\npolicy = {policy}\n")
    monkeypatch.setenv("HORUS_CONFIG", str(site))
    horusd = Horusd(load_config(), reader=FixedReader(Snapshot([node(n) for n in nodes], [], taken_at=1e12)),
                    predictor_factory=lambda kind: MODEL)
    return horusd, site


def test_a_rebuilt_policy_counts_the_sites_measured_pairs_and_keeps_what_it_learned(tmp_path, monkeypatch):
    """horusd builds its policy afresh at start and at every reload (an hourly refit reloads); the
    simulator keeps one policy and tells it each measured pair. Live must agree: the pairs measured
    on this cluster are measured (known) for the new policy, and horus-risk's exploration budget spent,
    its pairs explored and not measured yet, and the workload shapes it counted survive the reload."""
    db_path = tmp_path / "h.db"
    prior = MODEL.predict("lm-bs20", ["resnet50-bs64"], "v100")
    store_observations(db_path, [("v100", "lm-bs20", "resnet50-bs64", prior + 0.02),
                                 ("v100", "resnet50-bs64", "lm-bs20", 0.5),
                                 ("v100", "a3c", "cyclegan", 0.95)])  # one user, far from Gavel's: held
    horusd, _site = site_horusd(tmp_path, monkeypatch, "horus-risk/explore_once=true", db_path, ("n1", "n2"))
    policy = horusd.placer.policy
    ids, kn = policy.pairs.classes.id, policy.pairs.known("v100")
    assert kn[ids("lm-bs20"), ids("resnet50-bs64")] and kn[ids("resnet50-bs64"), ids("lm-bs20")]
    assert policy.pairs.tput("v100", "lm-bs20", "resnet50-bs64") == pytest.approx(prior + 0.02)
    a3c, cyclegan = ids("a3c"), ids("cyclegan")
    assert not policy.pairs.known("v100")[a3c, cyclegan]
    # what it learned while it ran: a budget spent, two pairs explored (one measured since), shapes
    policy.explored["v100"] = 5
    policy._pending["v100"] = {tuple(sorted((a3c, cyclegan))),
                               tuple(sorted((ids("lm-bs20"), ids("resnet50-bs64"))))}
    policy._exploring["j9"] = ("v100", tuple(sorted((a3c, ids("transformer-bs32")))))
    policy.fragmentation.counts[(1000, 1)] += 7
    horusd.reload()
    rebuilt = horusd.placer.policy
    assert rebuilt is not policy and rebuilt.pairs is not policy.pairs
    names = rebuilt.pairs.classes.names
    assert rebuilt.explored == {"v100": 5}
    assert {(g, frozenset((names[a], names[b]))) for g, pairs in rebuilt._pending.items() for a, b in pairs} \
        == {("v100", frozenset(("a3c", "cyclegan")))}  # the measured one is no longer pending
    gpu_type, (a, b) = rebuilt._exploring["j9"]
    assert gpu_type == "v100" and {names[a], names[b]} == {"a3c", "transformer-bs32"}
    assert rebuilt.fragmentation.counts[(1000, 1)] == 7
    assert rebuilt.pairs.known("v100")[rebuilt.pairs.classes.id("lm-bs20"), rebuilt.pairs.classes.id("resnet50-bs64")]
    ping = horusd.decide({"op": "ping"})  # what an admin sees: two measured pairs, the budget spent
    assert ping["pairs_measured"] == 2 and ping["policy_counters"] == {"explored:v100": 5} and ping["reloads"] == 1


def test_the_feed_rebuilds_the_policy_when_the_pairs_measured_here_change(tmp_path, monkeypatch):
    import time

    from slurm_horus.store.db import open_db

    db_path = tmp_path / "h.db"
    store_observations(db_path, [])
    horusd, _site = site_horusd(tmp_path, monkeypatch, "horus", db_path)
    before = horusd.placer
    ids = before.policy.pairs.classes.id
    a, b = ids("lm-bs20"), ids("resnet50-bs64")
    assert not before.policy.pairs.known("v100")[a, b]
    assert not horusd.history.learn_pairs(open_db(db_path))  # nothing measured: no rebuild
    store_observations(db_path, [("v100", "lm-bs20", "resnet50-bs64", 0.4)])  # (as an ingest then a feed)
    assert horusd.history.learn_pairs(open_db(db_path))
    deadline = time.monotonic() + 10
    while horusd.placer is before and time.monotonic() < deadline:
        time.sleep(0.01)
    table = horusd.placer.policy.pairs
    assert horusd.placer is not before
    assert table.known("v100")[table.classes.id("lm-bs20"), table.classes.id("resnet50-bs64")]
    assert table.tput("v100", "lm-bs20", "resnet50-bs64") == pytest.approx(0.4)


def test_a_reload_that_fails_in_the_background_is_one_warning_and_the_running_policy_stays(
        tmp_path, monkeypatch, caplog):
    import logging
    import threading
    import time

    horusd, site = site_horusd(tmp_path, monkeypatch, "horus", tmp_path / "h.db")
    before = horusd.placer
    escaped = []
    monkeypatch.setattr(threading, "excepthook", lambda info: escaped.append(info))
    site.write_text(site.read_text() + "policy = no-such-policy\n")  # an admin halfway through an edit
    with caplog.at_level(logging.WARNING, logger="horusd"):
        horusd.history.on_pairs()  # the feed found new pairs: horusd reloads in the background
        deadline = time.monotonic() + 10
        while not any("reload after" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.01)
    warnings = [r.getMessage() for r in caplog.records if "reload after" in r.getMessage()]
    assert len(warnings) == 1 and "new pairs measured" in warnings[0] and "no-such-policy" in warnings[0]
    assert not escaped and horusd.placer is before and horusd.placer.policy.name == "horus"
    answer = horusd.decide({"op": "reload"})  # the controller socket's reload says why
    assert answer["ok"] is False and "reload failed" in answer["error"] and "no-such-policy" in answer["error"]
    assert horusd.placer is before


@pytest.mark.parametrize("learn", [True, False])
def test_the_site_setting_learn_pairs_turns_the_feeds_pair_learning_on_and_off(tmp_path, learn):
    import time

    from slurm_horus.config import load_config
    from slurm_horus.service.history import History

    db_path = tmp_path / "h.db"
    store_observations(db_path, [("v100", "lm-bs20", "resnet50-bs64", 0.4)])
    config = load_config({"db": str(db_path), "learn_pairs": "yes" if learn else "no"}, environ={})
    told = []
    history = History(str(db_path), durations_s=0.05, on_pairs=lambda: told.append(1),
                      learn_pairs=config.learn_pairs)
    history.start()
    deadline = time.monotonic() + (10 if learn else 1)
    while not told and time.monotonic() < deadline:
        time.sleep(0.02)
    history.stop()
    assert bool(told) is learn


def test_ping_says_how_many_pairs_a_job_may_join_under_the_slowdown_limit_and_doctor_warns(tmp_path):
    """A GPU type whose pairs the model lacks: its guesses keep every pair over slowdown_limit 1.5, so
    nothing would share and no pair would ever be measured. horusd's ping tells the share of (job
    class, resident class) pairs a job may join, per GPU type (a pair measured here counts as measured);
    `horus doctor` warns below a quarter, and says the share otherwise."""
    from slurm_horus.config import load_config
    from slurm_horus.interference import builtin_priors
    from slurm_horus.service.doctor import check_sharing

    profiles, observations = builtin_priors()
    held_out = build_model("chain", profiles, [o for o in observations if o.gpu_type != "v100"])
    shares = {}
    for name, model, limit in (("priors", MODEL, "1.5"), ("held out", held_out, "1.5"), ("held out", held_out, "2.5")):
        config = load_config({"socket": str(tmp_path / "s.sock"), "db": str(tmp_path / f"{name}{limit}.db"),
                              "slowdown_limit": limit}, environ={})
        horusd = Horusd(config, reader=FixedReader(Snapshot([node("n1")], [], taken_at=1e12)),
                        predictor_factory=lambda kind, _m=model: _m)
        horusd.placer.clock = lambda: 1e12
        horusd.refresh_once()
        ping = horusd.decide({"op": "ping"})
        assert ping["slowdown_limit"] == float(limit)
        shares[name, limit] = ping["joinable_under_slowdown_limit"]["v100"]
        lines = check_sharing(ping)
        assert len(lines) == 1 and "v100" in lines[0][1]
        assert lines[0][0] == ("warning" if shares[name, limit] < 0.25 else "info"), lines
        if name == "held out" and limit == "1.5":
            assert "slowdown_limit 2.0" in lines[0][1] and "model-refit" in lines[0][1]
            # a pair measured on this cluster counts as measured: one more pair a job may join
            names = sorted(horusd.placer.known_classes)
            horusd.placer.policy.observe("v100", names[0], names[1], 0.9)
            after = horusd.decide({"op": "ping"})["joinable_under_slowdown_limit"]["v100"]
            assert after == pytest.approx(shares[name, limit] + 1 / len(names) ** 2, abs=1e-3)
    assert shares["held out", "1.5"] == 0.0  # collaborative filtering's guesses from other GPU types
    assert 0.4 < shares["priors", "1.5"] < 0.6  # Gavel's V100 pairs measured: about half
    assert shares["held out", "2.5"] > 0.25
    assert check_sharing(None) == [] and check_sharing({"ok": True}) == []
