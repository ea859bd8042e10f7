"""job_submit.lua against its Python twin, in real Lua 5.1 (lupa), on the same cases."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_horus.resources import resource_path
from slurm_horus.service import lua_twin
from slurm_horus.tokens import parse_horus_tokens, sub_batching

lupa51 = pytest.importorskip("lupa.lua51")

NO_VAL = lua_twin.NO_VAL
LUA_LOG = []  # what the script logged through slurm.log_info


@pytest.fixture(scope="module")
def lua():
    runtime = lupa51.LuaRuntime(unpack_returned_tuples=True)
    runtime.execute("slurm = {SUCCESS = 0, ERROR = -1}")
    runtime.globals().slurm.log_info = lambda fmt, *args: LUA_LOG.append(str(fmt) % args)
    source = resource_path("job_submit_lua", "job_submit.lua").read_text()
    runtime.execute(source)
    return runtime


def to_lua(lua, value):
    if isinstance(value, dict):
        return lua.table_from({k: to_lua(lua, v) for k, v in value.items()})
    return value


def from_lua(value):
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return {k: from_lua(v) for k, v in value.items()}


def pair(result):
    """A Lua function returning (value) or (value, why) as a Python 2-tuple."""
    if isinstance(result, tuple):
        return (result + (None, None))[:2]
    return result, None


def normalize(value):
    """Lua numbers are doubles (2 == 2.0) and a Lua table cannot hold nil (drop None values)."""
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if v is not None}
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


NOW = 1_800_000_000  # the epoch the should_handle and keep twins are asked at

JOBS = [
    {},
    {"tres_per_node": "gres:gpu:2"},
    {"tres_per_node": "gres:gpu:1", "min_nodes": NO_VAL},
    {"tres_per_node": "gres:gpu:v100:2", "min_nodes": 2},
    {"tres_per_node": "gres:gpu:g1:1,gres:gpu:g3:1"},
    {"tres_per_node": "gres:gpu:g2:1"},
    {"tres_per_node": "gres:shard:2"},
    {"tres_per_node": "gres:gpu"},
    {"tres_per_node": "gres/gpu=4"},
    {"tres_per_job": "gres:gpu:4", "min_nodes": 2},
    {"tres_per_job": "gres:gpu:3", "min_nodes": 2},
    {"tres_per_job": "gres:gpu:a100:2"},
    {"tres_per_task": "gres:gpu:1", "num_tasks": 4, "min_nodes": 2},
    {"tres_per_task": "gres:gpu:1", "num_tasks": 3, "min_nodes": 2},
    {"tres_per_task": "gres:gpu:1", "num_tasks": NO_VAL},
    {"tres_per_node": "gres:gpu:1", "array_inx": "0-9"},
    {"tres_per_node": "gres:gpu:1", "het_job_offset": 1},
    {"tres_per_node": "gres:gpu:1", "het_job_offset": NO_VAL},
    {"tres_per_node": "gres:gpu:1", "req_nodes": "n2"},
    {"tres_per_node": "gres:gpu:1", "shared": 0},
    {"tres_per_node": "gres:gpu:1", "shared": 65534},
    {"tres_per_node": "gres:gpu:1,gres:gpu:v100:1"},
    # Slurm 24.11 / 26.05 spell requests with "gres/" (and tres_per_task as gres/gpu=1)
    {"tres_per_node": "gres/gpu:1"},
    {"tres_per_node": "gres/gpu:g2:1"},
    {"tres_per_node": "gres/shard:g1:1"},
    {"tres_per_job": "gres/gpu:2"},
    {"tres_per_task": "gres/gpu=1", "num_tasks": 2},
    {"tres_per_node": "gres:gpu:1", "dependency": "afterok:12"},
    {"tres_per_node": "gres:gpu:1", "dependency": ""},
    {"tres_per_node": "gres:gpu:1", "begin_time": NOW + 3600},
    {"tres_per_node": "gres:gpu:1", "begin_time": NOW - 5},
    {"tres_per_node": "gres:gpu:1", "begin_time": 0},
    {"tres_per_node": "gres:gpu:1", "reservation": "maint"},
    {"tres_per_node": "gres:gpu:a100:1"},
]

CONFIGS = [
    "",
    "offers = no\nmax_offer_age_s = 10\n",
    "socket = /tmp/h.sock\ntimeout_ms = 250\n",
    "handle_exclusive = yes\nhandle-nodelist=1  # comment\n",
    "max_state_age_s = 5\npolicy = sjf\nbogus line\n",
]

REPLIES = [
    "ok=1;action=place;id=h-1;nodes=n3;tres=gres:gpu:g2:1;mode=shared;slowdown=1.080;age=0.5",
    "ok=1;action=place;id=h-2;nodes=n1;tres=gres:shard:g0:1;age=3",
    "ok=1;action=place;id=h-3;nodes=n1;tres=gres:gpu:g0:1;age=999",
    "ok=1;action=place;id=h-4;nodes=n1;tres=gres:gpu:g0:1;age=0x10",
    "ok=1;action=place;id=h-5;nodes=n1 && rm;tres=gres:gpu:g0:1;age=1",
    "ok=1;action=place;id=h 6;nodes=n1;tres=gres:gpu:g0:1;age=1",
    "ok=1;action=place;id=h-7;nodes=n1;tres=gres:gpu:g0:1",
    "ok=1;action=unchanged;reason=nothing free",
    "ok=1;action=place;id=h-8;nodes=n2;tres=gres:shard:g1:1;age=1;class=resnet18-bs64;partition=infer-lend",
    "ok=1;action=place;id=h-9;nodes=n2;tres=gres:shard:g1:1;age=1;class=a b",
    "ok=1;action=place;id=h-10;nodes=n2;tres=gres:shard:g1:1;age=1;partition=x;y",
    "ok=1;action=keep;id=h-11;tres=gres:shard:1;mode=kept;class=lm-bs20;lease=30",
    "ok=1;action=keep;id=h-12;tres=gres:gpu:2;mode=kept;class=unknown;lease=30",
    "ok=1;action=keep;id=h-21;tres=gres/shard:1;mode=kept;class=lm-bs20;lease=30",
    "ok=1;action=keep;id=h-22;tres=gres/gpu:2;mode=kept;class=unknown;lease=30",
    "ok=1;action=keep;id=h-13;tres=gres:gpu:g1:1;mode=kept;lease=30",
    "ok=1;action=keep;id=h-14;tres=gres:shard:g2:1;mode=kept;lease=30",
    "ok=1;action=keep;id=h-15;tres=gres:gpu:1;mode=kept;lease=0",
    "ok=1;action=keep;id=h-16;tres=gres:gpu:1;mode=kept;lease=99999",
    "ok=1;action=keep;id=h-17;tres=gres:gpu:1;mode=kept",
    "ok=1;action=keep;id=h 18;tres=gres:gpu:1;mode=kept;lease=30",
    "ok=0;error=boom",
    "ok=1;action=explode",
    "garbage",
    "",
    ";;ok=1;action=unchanged",
    "ok=1;action=place;id=h-19;nodes=n1;tres=gres:shard:g0:1;age=1;micro_batch=64;grad_accum=2",
    "ok=1;action=place;id=h-20;nodes=n1;tres=gres:shard:g0:1;age=1;micro_batch=6$(x);grad_accum=2",
    "ok=1;action=place;id=h-21;nodes=n1;tres=gres:shard:g0:1;age=1;micro_batch=64;grad_accum=-1",
]


@pytest.mark.parametrize("config_text", CONFIGS)
def test_parse_config_twin(lua, config_text):
    lua_conf = from_lua(lua.globals().HORUS.parse_config(config_text))
    assert normalize(lua_conf) == normalize(lua_twin.parse_config(config_text))


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("config_text", CONFIGS[:3])
def test_should_handle_twin(lua, job, config_text):
    horus = lua.globals().HORUS
    conf = horus.parse_config(config_text)
    lua_ok, lua_detail = pair(horus.should_handle(to_lua(lua, job), conf, NOW))
    py_ok, py_detail = lua_twin.should_handle(job, lua_twin.parse_config(config_text), NOW)
    assert lua_ok == py_ok
    assert normalize(from_lua(lua_detail)) == normalize(py_detail)


def test_should_handle_cases_mean_what_they_say():
    conf = lua_twin.parse_config("")
    assert lua_twin.should_handle({}, conf) == (False, "no gpu")
    assert lua_twin.should_handle({"tres_per_node": "gres:gpu:1", "req_nodes": "n2"}, conf) == (False, "explicit nodelist")
    assert lua_twin.should_handle({"tres_per_node": "gres:gpu:1", "shared": 0}, conf) == (False, "explicit exclusive")
    ok, request = lua_twin.should_handle({"tres_per_job": "gres:gpu:4", "min_nodes": 2}, conf)
    assert ok and request["gpus_per_node"] == 2 and request["nodes"] == 2
    gpu = {"tres_per_node": "gres:gpu:1"}
    for extra, reason in (({"dependency": "afterany:3"}, "dependency"), ({"reservation": "r"}, "reservation"),
                          ({"begin_time": NOW + 60}, "begin time set by the user")):
        assert lua_twin.should_handle({**gpu, **extra}, conf, NOW) == (False, reason)
    assert lua_twin.should_handle({**gpu, "begin_time": NOW}, conf, NOW)[0]  # --begin=now: nothing to keep


@pytest.mark.parametrize("line", REPLIES)
def test_parse_reply_twin(lua, line):
    horus = lua.globals().HORUS
    conf_text = "max_state_age_s = 60"
    lua_reply, lua_why = pair(horus.parse_reply(line, horus.parse_config(conf_text)))
    py_reply, py_why = lua_twin.parse_reply(line, lua_twin.parse_config(conf_text))
    assert normalize(from_lua(lua_reply)) == normalize(py_reply)
    assert lua_why == py_why


def test_parse_reply_refuses_unsafe_and_stale():
    conf = lua_twin.parse_config("")
    assert lua_twin.parse_reply(REPLIES[-3], conf)[0]["micro_batch"] == "64"
    assert lua_twin.parse_reply(REPLIES[-2], conf) == (None, "bad micro_batch")
    assert lua_twin.parse_reply(REPLIES[-1], conf) == (None, "bad grad_accum")
    assert lua_twin.parse_reply(REPLIES[0], conf)[0]["nodes"] == "n3"
    assert lua_twin.parse_reply(REPLIES[2], conf) == (None, "stale state")
    assert lua_twin.parse_reply(REPLIES[4], conf) == (None, "bad nodes")
    assert lua_twin.parse_reply("garbage", conf) == (None, "malformed reply")


@pytest.mark.parametrize("admin_comment", [None, "", "JS1:abc"])
@pytest.mark.parametrize("job", [{"tres_per_node": "gres:gpu:1"}, {"tres_per_job": "gres:gpu:2"},
                                 {"tres_per_task": "gres:gpu:1", "num_tasks": 2},
                                 {"tres_per_node": "gres/gpu:1"}, {"tres_per_job": "gres/gpu:2"},
                                 {"tres_per_task": "gres/gpu=1", "num_tasks": 2}])
def test_apply_twin(lua, job, admin_comment):
    horus = lua.globals().HORUS
    job = dict(job, admin_comment=admin_comment) if admin_comment is not None else dict(job)
    reply = {"id": "h-9", "nodes": "n2", "tres": "gres:gpu:g1:1,gres:gpu:g2:1", "mode": "exclusive",
             "slowdown": "1.000", "class": "bert-bs8", "partition": "infer-lend"}
    if admin_comment is None:
        reply["gpulist"] = "n2:1+2"
    lua_job = to_lua(lua, job)
    lua_token = horus.apply(lua_job, to_lua(lua, reply))
    py_job = dict(job)
    py_token = lua_twin.apply(py_job, reply)
    assert lua_token == py_token
    assert normalize(from_lua(lua_job)) == normalize(py_job)
    assert py_job["req_nodes"] == "n2" and py_job["partition"] == "infer-lend"
    # the decision is written in the spelling of the Slurm the job came from (24.11 refuses "gres:")
    prefix = "gres/" if "gres/" in str(job) else "gres:"
    assert py_job["tres_per_node"] == f"{prefix}gpu:g1:1,{prefix}gpu:g2:1"
    if admin_comment:
        assert py_job["admin_comment"] == "JS1:abc horus:h-9 mode=exclusive slowdown=1.000 class=bert-bs8"
    expected = {"mode": "exclusive", "slowdown": "1.000", "class": "bert-bs8"}
    if "gpulist" in reply:
        expected["gpus"] = "n2:1+2"
    assert parse_horus_tokens(py_job["admin_comment"]) == ("h-9", expected)


def test_parse_keep_refuses_what_horusd_could_not_move():
    conf = lua_twin.parse_config("")
    kept = [lua_twin.parse_reply(line, conf) for line in REPLIES if "action=keep" in line]
    assert [why for _reply, why in kept] == [None, None, None, None, "bad kept tres", "bad kept tres", "bad lease",
                                            "bad lease", "bad lease", "bad id"]


@pytest.mark.parametrize("job", [{"tres_per_node": "gres:gpu:1"}, {"tres_per_job": "gres:gpu:2"},
                                 {"tres_per_task": "gres:gpu:1", "num_tasks": 2, "admin_comment": "JS1:x"},
                                 {"tres_per_node": "gres/gpu:1"}, {"tres_per_task": "gres/gpu=1", "num_tasks": 2}])
@pytest.mark.parametrize("tres", ["gres:shard:1", "gres:gpu:2", "gres/shard:1"])
def test_keep_twin(lua, job, tres):
    horus = lua.globals().HORUS
    reply = {"id": "h-20", "tres": tres, "mode": "kept", "class": "lm-bs20", "lease": "30"}
    lua_job = to_lua(lua, job)
    lua_token = horus.keep(lua_job, to_lua(lua, reply), NOW)
    py_job = dict(job)
    py_token = lua_twin.keep(py_job, reply, NOW)
    assert lua_token == py_token == "horus:h-20 mode=kept class=lm-bs20"
    assert normalize(from_lua(lua_job)) == normalize(py_job)
    # kept in the spelling of the Slurm the job came from, whatever horusd sent (24.11 refuses "gres:")
    prefix = "gres/" if "gres/" in str(job) else "gres:"
    assert py_job["begin_time"] == NOW + 30 and py_job["tres_per_node"] == prefix + tres[len("gres:"):]
    assert not py_job.get("tres_per_job") and not py_job.get("tres_per_task")
    assert parse_horus_tokens(py_job["admin_comment"]) == ("h-20", {"mode": "kept", "class": "lm-bs20"})


def test_build_request_is_json_with_the_request(lua):
    horus = lua.globals().HORUS
    job = {"tres_per_job": "gres:gpu:2", "name": 'my "job"\n', "user_name": "alice", "time_limit": 60,
           "min_nodes": NO_VAL}
    ok, request = lua_twin.should_handle(job, lua_twin.parse_config(""))
    line = horus.build_request(to_lua(lua, job), 1000, to_lua(lua, request))
    message = json.loads(line)
    assert message["op"] == "place" and message["reply"] == "kv"
    assert message["job_name"] == 'my "job"\n'
    assert message["gpus_per_node"] == 2 and message["num_nodes"] == 1
    assert message["time_limit_min"] == 60 and message["uid"] == 1000
    assert message["keep"] is True and message["held"] is False  # the script can keep the job
    held = json.loads(horus.build_request(to_lua(lua, dict(job, priority=0)), 1000, to_lua(lua, request)))
    assert held["held"] is True  # sbatch -H
    assert "give_up_at" not in message
    # no lua-socket here (test_lua_socket.py reads its clock in the real Lua 5.1)
    assert horus.give_up_at(horus.parse_config("")) is None
    timed = json.loads(horus.build_request(to_lua(lua, job), 1000, to_lua(lua, request), None, 1795000000.25))
    assert timed["give_up_at"] == 1795000000.25


def test_a_shard_job_is_sent_with_its_shards_and_never_kept(lua):
    """--gres=shard:3 is 3 shards of one GPU: horusd places it by capacity; the Lua never keeps it
    (the movable kept shape gres:shard:1 would change what it asks), and it takes no offer."""
    horus = lua.globals().HORUS
    job = {"tres_per_node": "gres:shard:3", "user_name": "alice", "min_nodes": NO_VAL}
    ok, request = lua_twin.should_handle(job, lua_twin.parse_config(""))
    assert ok and request["shards"] == 3 and request["gpus_per_node"] == 1
    message = json.loads(horus.build_request(to_lua(lua, job), 1000, to_lua(lua, request)))
    assert message["shards"] == 3 and message["gpus_per_node"] == 1 and message["keep"] is False
    from slurm_horus.service.protocol import parse_request
    assert parse_request(message).shards == 3 and not parse_request(message).problem
    conf = lua_twin.parse_config("")
    assert not lua_twin.offer_fits(job, request, conf)
    assert not horus.offer_fits(to_lua(lua, job), to_lua(lua, request), horus.parse_config(""))
    # typed shards name their GPU already, several nodes cannot hold one GPU's shards: left to Slurm
    for other in ({"tres_per_node": "gres:shard:g2:3"}, {"tres_per_node": "gres:shard:3", "min_nodes": 2}):
        assert lua_twin.gpu_request(other) == (None, None)
        assert pair(horus.gpu_request(to_lua(lua, other))) == (None, None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.builds(lambda n: f"gres:shard:{n}", st.integers(0, 9)),
                          st.builds(lambda n: f"gres/shard={n}", st.integers(0, 9)),
                          st.sampled_from(["shard", "gres:shard:g1:2", "gres:gpu:1", "shard:x", "shard:"]),
                          st.text(alphabet="shardgpu:/=,0123456789 ", max_size=16)), max_size=3).map(",".join))
def test_count_shards_twin_property(lua, tres):
    from slurm_horus.service.protocol import shard_count
    assert lua.globals().HORUS.count_shards(tres) == lua_twin.count_shards(tres) == shard_count(tres)


def test_encode_kv_reply_round_trips_through_lua(lua):
    horus = lua.globals().HORUS
    from slurm_horus.service.protocol import encode_kv

    line = encode_kv({"ok": True, "action": "place", "id": "h-1", "nodes": "n4",
                                     "tres": "gres:shard:g3:1", "mode": "shared", "slowdown": 1.1234,
                                     "age": 0.25, "reason": "pair; fits\nwell", "gpus": {"n4": [3]}})
    reply, why = pair(horus.parse_reply(line, horus.parse_config("")))
    assert why is None
    reply = from_lua(reply)
    assert reply["slowdown"] == "1.123" and reply["reason"] == "pair, fits well" and "gpus" not in reply


def test_submit_fails_open_without_horusd(lua, tmp_path, monkeypatch):
    """No socket library/daemon: the job is untouched and slurm.SUCCESS is returned."""
    conf = tmp_path / "horus.conf"
    conf.write_text(f"socket = {tmp_path}/none.sock\n")
    monkeypatch.setenv("HORUS_CONFIG", str(conf))
    job = to_lua(lua, {"tres_per_node": "gres:gpu:1", "name": "j"})
    assert lua.globals().slurm_job_submit(job, None, 1000) == 0
    assert job.tres_per_node == "gres:gpu:1" and job.req_nodes is None
    assert any(line.startswith("horus: job name=j") and "unchanged: horusd" in line for line in LUA_LOG)


wellformed_tres_items = st.one_of(
    st.builds(lambda n: f"gres:gpu:{n}", st.integers(0, 16)),
    st.builds(lambda t, n: f"gres:gpu:{t}:{n}", st.sampled_from(["v100", "a100", "g0", "g3"]), st.integers(0, 8)),
    st.builds(lambda n: f"gres/gpu={n}", st.integers(0, 8)),
    st.builds(lambda n: f"gres:shard:{n}", st.integers(0, 8)),
)
tres_items = st.one_of(wellformed_tres_items, st.text(alphabet="gpures:/=,0123456789 ", max_size=20))
FIELD_NODES_TASKS = (st.sampled_from(["tres_per_node", "tres_per_job", "tres_per_task"]),
                     st.sampled_from([NO_VAL, 1, 2, 3]), st.sampled_from([NO_VAL, 1, 2, 4, 6]))


@settings(max_examples=200, deadline=None)
@given(st.lists(tres_items, min_size=0, max_size=3).map(",".join),
       *FIELD_NODES_TASKS)
def test_gpu_request_twin_property(lua, tres, field, nodes, tasks):
    job = {field: tres, "min_nodes": nodes, "num_tasks": tasks}
    lua_request, lua_why = pair(lua.globals().HORUS.gpu_request(to_lua(lua, job)))
    py_request, py_why = lua_twin.gpu_request(job)
    assert normalize(from_lua(lua_request)) == normalize(py_request)
    assert lua_why == py_why


@settings(max_examples=200, deadline=None)
@given(st.lists(wellformed_tres_items, min_size=0, max_size=3).map(",".join),
       *FIELD_NODES_TASKS)
def test_horusd_reads_gpu_counts_as_the_lua_does(lua, tres, field, nodes, tasks):
    """Production (protocol.gpu_counts, for clients that send TRES strings) against the Lua itself."""
    from slurm_horus.service.protocol import gpu_counts

    job = {field: tres, "min_nodes": nodes, "num_tasks": tasks}
    lua_request, _why = pair(lua.globals().HORUS.gpu_request(to_lua(lua, job)))
    strings = [job.get(k, "") for k in ("tres_per_node", "tres_per_job", "tres_per_task")]
    try:
        counts = gpu_counts(*strings, None if nodes == NO_VAL else nodes, None if tasks == NO_VAL else tasks)
    except ValueError:
        counts = None
    if lua_request is None:
        assert counts is None or counts[0] == 0
    else:
        lua_request = from_lua(lua_request)
        if lua_request.get("shards"):  # --gres=shard:N on one node: N shards of one GPU
            from slurm_horus.service.protocol import shard_count
            assert counts[0] == 0 and shard_count(job.get("tres_per_node")) == lua_request["shards"]
            return
        assert counts == (lua_request["gpus_per_node"], lua_request["nodes"], lua_request.get("gpu_type"))


CONFIRMS = [
    ("ok=1;action=confirm;id=h1a;mode=shareable;slowdown=1.000;class=lm-bs20", "h1a"),
    ("ok=1;action=confirm;id=h1a;mode=shared;slowdown=1.250;class=lm-bs20", "h2b"),
    ("ok=1;action=unchanged;reason=no decision h1a in the ledger", "h1a"),
    ("ok=1;action=confirm;id=h1a;mode=shared;slowdown=1.2x;class=lm-bs20", "h1a"),
    ("ok=1;action=confirm;id=h1a;mode=sh ared;slowdown=1.2;class=lm", "h1a"),
    ("ok=1;action=confirm;id=h1a;mode=shared;slowdown=1.2;class=lm;gpulist=n1:0+1,n2:3", "h1a"),
    ("ok=1;action=confirm;id=h1a;mode=shared;slowdown=1.2;class=lm;gpulist=n1 rm", "h1a"),
    ("ok=0;error=x", "h1a"),
    ("junk", "h1a"),
]


@pytest.mark.parametrize("line, claimed", CONFIRMS)
def test_parse_confirm_twin(lua, line, claimed):
    lua_reply, lua_why = pair(lua.globals().HORUS.parse_confirm(line, claimed))
    py_reply, py_why = lua_twin.parse_confirm(line, claimed)
    assert normalize(from_lua(lua_reply)) == normalize(py_reply)
    assert lua_why == py_why


def test_parse_confirm_means_what_it_says():
    reply, why = lua_twin.parse_confirm(CONFIRMS[0][0], "h1a")
    job = {"admin_comment": "JS1:z"}
    assert lua_twin.append_token(job, reply) == "horus:h1a mode=shareable slowdown=1.000 class=lm-bs20"
    assert job["admin_comment"] == "JS1:z horus:h1a mode=shareable slowdown=1.000 class=lm-bs20"
    shard = {"id": "h2", "mode": "shared", "slowdown": "1.100", "class": "a3c", "gpulist": "n3:2"}
    assert parse_horus_tokens(lua_twin.append_token({}, shard)) == (
        "h2", {"mode": "shared", "slowdown": "1.100", "class": "a3c", "gpus": "n3:2"})
    assert lua_twin.parse_confirm(CONFIRMS[1][0], "h2b") == (None, "confirmed another decision")
    assert lua_twin.parse_confirm(CONFIRMS[2][0], "h1a") == (None, "decision h1a not confirmed")


def test_horus_sbatch_job_asks_for_confirmation_and_fails_open(lua, tmp_path, monkeypatch):
    conf = tmp_path / "horus.conf"
    conf.write_text(f"socket = {tmp_path}/none.sock\n")
    monkeypatch.setenv("HORUS_CONFIG", str(conf))
    job = to_lua(lua, {"tres_per_node": "gres:shard:g1:1", "name": "pre",
                       "environment": {"HORUS_DECISION": "h0abc"}})
    assert lua.globals().slurm_job_submit(job, None, 1000) == 0
    assert job.admin_comment is None and job.tres_per_node == "gres:shard:g1:1"
    assert "horus: job name=pre uid=1000 unchanged: horusd lua-socket not installed" in LUA_LOG[-1]
    forged = to_lua(lua, {"tres_per_node": "gres:gpu:1", "name": "forged",
                          "environment": {"HORUS_DECISION": "h1;rm -rf"}})
    lua.globals().slurm_job_submit(forged, None, 1000)
    assert "skip: malformed HORUS_DECISION" in LUA_LOG[-1]


CLASS_CASES = [
    ({}, None),
    ({"HORUS_CLASS": "bert-large"}, "x class=lm"),
    ({"HORUS_MODEL": "ResNet50", "HORUS_BATCH_SIZE": "64"}, None),
    ({"HORUS_MODEL": "ResNet50"}, None),
    ({"HORUS_CLASS": "", "HORUS_MODEL": "ResNet50"}, "class=lm"),
    ({"HORUS_CLASS": "", "HORUS_MODEL": ""}, "class=lm"),
    ({}, "exp 3, class=transformer-bs64"),
    ({}, "horus_class=a3c;x=1"),
    ({}, "classy=no class=ok"),
    ({}, "class=!bad class=good"),
    ({"HORUS_CLASS": "bad class"}, None),
    ({}, "nothing here"),
]


@pytest.mark.parametrize("env, comment", CLASS_CASES)
def test_job_class_twin(lua, env, comment):
    from slurm_horus.jobclass import job_class_of

    lua_class = lua.globals().HORUS.job_class(to_lua(lua, env), comment)
    assert lua_class == job_class_of(hints=env, comment=comment)


OFFERS = (
    "version=7;claimed=h0;generated=1000.5\n"
    "lm-bs20\taction=place;age=0.4;class=lm-bs20;gpulist=n1:2;id=h1;mode=shareable;nodes=n1;ok=1;"
    "slowdown=1.000;tres=gres:shard:g2:1\n"
    "unknown\taction=place;age=0.4;class=unknown;id=h2;mode=exclusive;nodes=n2;ok=1;slowdown=1.000;"
    "tres=gres:gpu:g0:1\n"
    "bad\taction=place;age=0.4;class=bad;id=h3;nodes=n1 rm;ok=1;tres=gres:gpu:g0:1\n"
)


@pytest.mark.parametrize("spent, awaiting", [(0, None), (6, None), (7, None), (1795323915191, None),
                                             (6, "h0"), (6, "h9"), (0, "")])
@pytest.mark.parametrize("text, job_class, now", [
    (OFFERS, "lm-bs20", 1001.0), (OFFERS, "unknown", 1001.0), (OFFERS, "bad", 1001.0),
    (OFFERS, "a3c", 1001.0), (OFFERS, "lm-bs20", 1100.0), ("", "lm-bs20", 1001.0),
    ("garbage", "lm-bs20", 1001.0), ("version=x;generated=1\nlm-bs20\tok=1", "lm-bs20", 1001.0),
    (OFFERS.replace("version=7;", "version=1795323915192;"), "lm-bs20", 1001.0),
    (OFFERS.replace("claimed=h0;", ""), "lm-bs20", 1001.0),
    (OFFERS.replace("claimed=h0;", "claimed=;"), "lm-bs20", 1001.0),
    (OFFERS.replace("claimed=h0;", "claimed=h 0;"), "lm-bs20", 1001.0),
])
def test_find_offer_twin(lua, text, job_class, now, spent, awaiting):
    horus = lua.globals().HORUS
    lua_offer, lua_version = pair(horus.find_offer(text, job_class, now, horus.parse_config(""), spent, awaiting))
    py_offer, py_version = lua_twin.find_offer(text, job_class, now, lua_twin.parse_config(""), spent, awaiting)[:2]
    assert normalize(from_lua(lua_offer)) == normalize(py_offer)
    assert lua_version == py_version


JOINT = OFFERS.replace("claimed=h0;", "claimed=h0;joint=1;")  # lm-bs20's offer is joint, the others not


@pytest.mark.parametrize("taken_version, taken", [(None, None), ("7", None), ("7", {}), ("7", {"lm-bs20": True}),
                                                  ("7", {"unknown": True}), ("6", {"unknown": True}), ("", {})])
@pytest.mark.parametrize("spent, awaiting", [(0, None), (7, None), (7, "h9"), (8, "h9")])
@pytest.mark.parametrize("text, job_class", [(JOINT, "lm-bs20"), (JOINT, "unknown"), (OFFERS, "lm-bs20"),
                                             (JOINT.replace("joint=1;", "joint=2;"), "unknown"),
                                             (JOINT.replace("joint=1;", "joint=0;"), "lm-bs20"),
                                             (JOINT.replace("joint=1;", "joint=x;"), "lm-bs20"),
                                             (JOINT.replace("version=7", "version=8"), "lm-bs20")])
def test_find_offer_joint_twin(lua, text, job_class, spent, awaiting, taken_version, taken):
    horus = lua.globals().HORUS
    lua_taken = None if taken is None else to_lua(lua, taken)
    lua_result = horus.find_offer(text, job_class, 1001.0, horus.parse_config(""), spent, awaiting, taken_version,
                                  lua_taken)
    py_result = lua_twin.find_offer(text, job_class, 1001.0, lua_twin.parse_config(""), spent, awaiting,
                                    taken_version, taken)
    lua_result = lua_result if isinstance(lua_result, tuple) else (lua_result,)
    assert len(lua_result) == len(py_result)
    assert normalize(from_lua(lua_result[0])) == normalize(py_result[0])
    assert lua_result[1:] == py_result[1:]


def test_find_offer_means_what_it_says():
    conf = lua_twin.parse_config("")
    offer, version, joint = lua_twin.find_offer(OFFERS, "lm-bs20", 1001.0, conf)
    assert version == "7" and offer["tres"] == "gres:shard:g2:1" and offer["id"] == "h1" and joint is False
    assert lua_twin.find_offer(OFFERS, "lm-bs20", 1100.0, conf) == (None, "stale offers")
    assert lua_twin.find_offer(OFFERS, "bad", 1001.0, conf) == (None, "bad nodes")
    assert lua_twin.find_offer(OFFERS, "lm-bs20", 1001.0, conf, spent=7) == (None, "offers spent")
    assert lua_twin.find_offer(OFFERS, "lm-bs20", 1001.0, conf, spent=6)[1] == "7"
    assert lua_twin.find_offer(OFFERS, "lm-bs20", 1001.0, conf, awaiting="h0")[1] == "7"
    assert lua_twin.find_offer(OFFERS, "lm-bs20", 1001.0, conf, awaiting="h5") == (None, "claim not seen yet")
    # joint offers: another class's joint offer of the version taken from, whatever is spent or awaited
    assert lua_twin.find_offer(JOINT, "lm-bs20", 1001.0, conf)[2] is True
    assert lua_twin.find_offer(JOINT, "lm-bs20", 1001.0, conf, 7, "h5", "7", {"unknown": True})[1:] == ("7", True)
    assert lua_twin.find_offer(JOINT, "lm-bs20", 1001.0, conf, 7, "h5", "7", {"lm-bs20": True}) == \
        (None, "offer taken")
    assert lua_twin.find_offer(JOINT, "unknown", 1001.0, conf, 7, None, "7", {"lm-bs20": True}) == \
        (None, "offer not joint")
    assert lua_twin.find_offer(OFFERS, "lm-bs20", 1001.0, conf, 7, None, "7", {}) == (None, "offer not joint")
    assert lua_twin.find_offer(JOINT, "lm-bs20", 1100.0, conf, 7, None, "7", {}) == (None, "stale offers")


def test_every_setting_the_lua_reads_is_a_site_setting_with_the_same_default(lua):
    # one site file serves horusd and job_submit.lua: a key the Lua knows must not be an error for
    # `horus serve`, and both must mean the same thing when it is absent
    from slurm_horus.config import SETTINGS

    lua_defaults = normalize(from_lua(lua.eval("HORUS.DEFAULTS")))
    assert lua_defaults == lua_twin.DEFAULTS
    for name, default in lua_defaults.items():
        assert name in SETTINGS, name
        assert SETTINGS[name].default == default, name


def test_the_shipped_site_file_reads_the_same_in_lua_and_in_horus(lua, tmp_path):
    from slurm_horus.config import load_config

    text = resource_path("hpc_configs", "horus.conf").read_text()
    path = tmp_path / "horus.conf"
    path.write_text(text)
    site = load_config({}, environ={"HORUS_CONFIG": str(path)})  # an unknown key would raise here
    lua_conf = normalize(from_lua(lua.globals().HORUS.parse_config(text)))
    assert lua_conf == normalize(lua_twin.parse_config(text))
    for name, value in lua_conf.items():
        assert normalize(getattr(site, name)) == value, name


@pytest.mark.parametrize("job, prefix", [
    ({}, None), ({"tres_per_node": "gres:gpu:1"}, "gres:"), ({"tres_per_node": "gres/gpu:g1:1"}, "gres/"),
    ({"tres_per_node": "", "tres_per_job": "gres/gpu:2"}, "gres/"), ({"tres_per_task": "gres/gpu=1"}, "gres/"),
    ({"tres_per_node": "gpu:1"}, None), ({"tres_per_node": 4294967294}, None),
])
def test_gres_prefix_twin_learns_the_spelling_from_the_job(lua, job, prefix):
    assert lua.globals().HORUS.gres_prefix(to_lua(lua, job)) == lua_twin.gres_prefix(job) == prefix


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["gres:gpu:g1:1", "gres/shard:g0:1", "gres:gpu:2", "gpu:1", "", "gres/gpu=1"]),
                max_size=4).map(",".join), st.sampled_from([None, "gres:", "gres/"]))
def test_respell_tres_twin_property(lua, tres, prefix):
    lua_text = lua.globals().HORUS.respell_tres(tres, prefix)
    assert lua_text == lua_twin.respell_tres(tres, prefix)
    if prefix is not None:
        assert all(item.startswith(prefix) and item.count("gres") == 1 for item in lua_text.split(",") if item)


def test_offer_taken_by_a_newer_slurm_job_is_respelled(lua):
    """An offer (spelled by horusd) applied to a 24.11 job comes out in 24.11's spelling."""
    offer, _version, _joint = lua_twin.find_offer(OFFERS, "lm-bs20", 1001.0, lua_twin.parse_config(""))
    job = to_lua(lua, {"tres_per_node": "gres/gpu:1"})
    lua.globals().HORUS.apply(job, to_lua(lua, offer))
    assert job.tres_per_node == "gres/shard:g2:1"

OPT_OUT_CASES = [
    ({}, None), ({"HORUS_OFF": "1"}, None), ({"HORUS_OFF": "yes"}, "class=lm"), ({"HORUS_OFF": " on "}, None),
    ({"HORUS_OFF": "0"}, None), ({"HORUS_OFF": ""}, "class=lm"), ({}, "class=lm horus=off"),
    ({}, "horus=OFF,class=lm"), ({}, "class=lm;horus=no"), ({}, "horus=on"), ({}, "xhorus=off"),
    ({}, "horus=off1"), ({}, "horus = off"), ({"HORUS_OFF": "false"}, "horus=off"),
]


@pytest.mark.parametrize("env, comment", OPT_OUT_CASES)
def test_opted_out_twin(lua, env, comment):
    assert lua.globals().HORUS.opted_out(to_lua(lua, env), comment) == lua_twin.opted_out(env, comment)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), st.sampled_from(["1", "0", "yes", "TRUE", " on", "off", ""])),
       st.one_of(st.none(), st.lists(st.sampled_from(["horus=off", "horus=no", "horus=On", "class=a", "horus=",
                                                     "x", "horus=off,", ";horus=no;"]), max_size=4).map(" ".join),
                 st.text(alphabet="horus=ofn ,;\t", max_size=20)))
def test_opted_out_twin_property(lua, off, comment):
    env = {} if off is None else {"HORUS_OFF": off}
    assert lua.globals().HORUS.opted_out(to_lua(lua, env), comment) == lua_twin.opted_out(env, comment)


def test_opted_out_means_what_it_says():
    assert lua_twin.opted_out({"HORUS_OFF": "1"}, None) and lua_twin.opted_out({}, "class=x horus=off")
    assert not lua_twin.opted_out({"HORUS_OFF": "0"}, "class=x") and not lua_twin.opted_out({}, "horus=on")


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("why", ["job array", "opted out (horus off)"])
def test_left_message_twin(lua, job, why):
    job = dict(job, user_name="alice")
    lua_line = lua.globals().HORUS.left_message(to_lua(lua, job), 1000, why)
    py_message = lua_twin.left_message(job, 1000, why)
    assert (None if lua_line is None else json.loads(lua_line)) == py_message
    assert (py_message is None) == (lua_twin.count_gpus(job.get("tres_per_node"))[0]
                                    + lua_twin.count_gpus(job.get("tres_per_job"))[0]
                                    + lua_twin.count_gpus(job.get("tres_per_task"))[0] == 0)


@pytest.mark.parametrize("job", JOBS + [{"tres_per_node": "gres:gpu:1", "partition": "p"},
                                        {"tres_per_node": "gres:gpu:1", "partition": ""}])
@pytest.mark.parametrize("config_text", ["", "offers = no\n"])
def test_offer_fits_twin(lua, job, config_text):
    horus = lua.globals().HORUS
    request, _ = lua_twin.gpu_request(job)
    if request is None:
        return
    lua_request, _ = pair(horus.gpu_request(to_lua(lua, job)))
    assert horus.offer_fits(to_lua(lua, job), lua_request, horus.parse_config(config_text)) == \
        lua_twin.offer_fits(job, request, lua_twin.parse_config(config_text))


def test_offer_fits_means_what_it_says():
    conf = lua_twin.parse_config("")
    fits = lua_twin.offer_fits
    assert fits({}, {"gpus_per_node": 1, "nodes": 1, "gpu_type": None}, conf)
    assert not fits({}, {"gpus_per_node": 1, "nodes": 1, "gpu_type": "a100"}, conf)  # a type is kept
    assert not fits({"partition": "p"}, {"gpus_per_node": 1, "nodes": 1, "gpu_type": None}, conf)
    assert not fits({}, {"gpus_per_node": 2, "nodes": 1, "gpu_type": None}, conf)


# ---- the circuit breaker (issue 15): a hung horusd must not cost every submission the deadline --
def run_breaker(allows, after, new, steps, conf):
    """Drive a breaker through ``steps`` [(time, timed out?, heartbeat age or None)]: asks only when
    allowed, noting when (as ``horus.ask`` does). Returns ([allowed?], final breaker as a dict)."""
    breaker, allowed = new(), []
    for now, timed_out, age in steps:
        ok, _why = pair(allows(breaker, now, None if age is None else now - age, conf))
        allowed.append(bool(ok))
        if ok:
            breaker["asked_at"] = now
            after(breaker, timed_out, now)
    return allowed, breaker


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 30, allow_nan=False), st.booleans(),
                          st.one_of(st.none(), st.floats(0, 90, allow_nan=False))), max_size=40),
       st.sampled_from(CONFIGS[:1] + ["breaker_timeouts = 1\nbreaker_open_s = 0.5\nbreaker_max_open_s = 2\n"]))
def test_breaker_twin_property(lua, steps, config_text):
    horus = lua.globals().HORUS
    steps = [(sum(s[0] for s in steps[:i + 1]), s[1], s[2]) for i, s in enumerate(steps)]  # times only grow
    lua_conf, py_conf = horus.parse_config(config_text), lua_twin.parse_config(config_text)
    lua_allowed, lua_breaker = run_breaker(horus.breaker_allows,
                                           lambda b, t, now: horus.breaker_after(b, t, now, lua_conf),
                                           lambda: lua.table_from({"timeouts": 0}), steps, lua_conf)
    py_allowed, py_breaker = run_breaker(lua_twin.breaker_allows,
                                         lambda b, t, now: lua_twin.breaker_after(b, t, now, py_conf),
                                         lambda: {"timeouts": 0}, steps, py_conf)
    assert lua_allowed == py_allowed
    assert normalize(from_lua(lua_breaker)) == normalize(py_breaker)


@pytest.mark.parametrize("err", [None, "timeout", "receive: timeout", "connect /x.sock: timeout",
                                 "connect /x.sock: connection refused", "send: closed", "circuit open"])
def test_is_timeout_twin(lua, err):
    assert lua.globals().HORUS.is_timeout(err) == lua_twin.is_timeout(err)


def test_breaker_means_what_it_says():
    conf = lua_twin.parse_config("")  # 3 timeouts, then 5 s; doubling to 60 s
    breaker = {"timeouts": 0}
    for now in (0.0, 0.1, 0.2):
        assert lua_twin.breaker_allows(breaker, now) == (True, None)
        lua_twin.breaker_after(breaker, True, now, conf)
    assert lua_twin.breaker_allows(breaker, 0.3) == (False, "circuit open")
    assert not lua_twin.breaker_allows(breaker, 5.1)[0] and lua_twin.breaker_allows(breaker, 5.3)[0]  # a try 5 s on
    lua_twin.breaker_after(breaker, True, 5.3, conf)
    assert not lua_twin.breaker_allows(breaker, 15.2)[0] and lua_twin.breaker_allows(breaker, 15.4)[0]  # then 10 s
    lua_twin.breaker_after(breaker, False, 15.4, conf)  # horusd answers again: closed
    assert breaker == {"timeouts": 0} and lua_twin.breaker_allows(breaker, 15.5)[0]
    lua_twin.breaker_after(breaker, True, 16, conf)
    lua_twin.breaker_after(breaker, False, 16.1, conf)  # a refused connection costs nothing: no count
    lua_twin.breaker_after(breaker, True, 16.2, conf)
    assert lua_twin.breaker_allows(breaker, 16.3)[0]


def test_breaker_waits_for_a_heartbeat_before_trying_again():
    """Past the pause, a stopped horusd (its offers header not rewritten for longer than
    max_offer_age_s) is not tried, so no submission pays the deadline for it, except once per
    breaker_max_open_s; a fresh header (horusd back) or none at all (no offers file) lets the try through."""
    conf = lua_twin.parse_config("")  # 3 timeouts, then 5 s; max_offer_age_s 3; at most 60 s
    breaker = {"timeouts": 0}
    for now in (0.0, 0.1, 0.2):
        breaker["asked_at"] = now
        lua_twin.breaker_after(breaker, True, now, conf)
    assert lua_twin.breaker_allows(breaker, 6.0, 0.0, conf) == (False, "circuit open: horusd silent")
    assert lua_twin.breaker_allows(breaker, 59.0, 0.0, conf)[0] is False
    assert lua_twin.breaker_allows(breaker, 60.3, 0.0, conf) == (True, None)  # once a minute whatever
    assert lua_twin.breaker_allows(breaker, 6.0, 5.5, conf) == (True, None)  # horusd wrote 0.5 s ago
    assert lua_twin.breaker_allows(breaker, 6.0, None, conf) == (True, None)  # no offers file: try
    assert lua_twin.breaker_allows(breaker, 3.0, 2.9, conf) == (False, "circuit open")  # the pause holds
    assert lua_twin.breaker_allows({"timeouts": 1}, 6.0, 0.0, conf) == (True, None)  # closed: ask


@pytest.mark.parametrize("text", [None, "", "version=5;claimed=;generated=1700000000.25\nc\tx=1\n",
                                  "version=5;claimed=;generated=17\n", "version=5;claimed=;generated=x\n",
                                  "version=5;claimed=;generated=12.\n", "junk", "generated=3\n;generated=4"])
def test_offers_generated_twin(lua, text):
    assert lua.globals().HORUS.offers_generated(text) == lua_twin.offers_generated(text)


def test_apply_twin_sub_batching_reaches_the_environment(lua):
    """SJF-BSBF's sub-batching: job_submit.lua sets HORUS_MICRO_BATCH / HORUS_GRAD_ACCUM through
    job_desc.environment (slurmctld's setter for the job's environment) and the token says it."""
    horus = lua.globals().HORUS
    job = {"tres_per_node": "gres:gpu:1", "environment": {"PATH": "/usr/bin"}}
    reply = {"id": "h-9", "nodes": "n1", "tres": "gres:shard:g0:1", "mode": "shared", "slowdown": "1.300",
             "class": "resnet50-bs128", "gpulist": "n1:0", "micro_batch": "64", "grad_accum": "2"}
    lua_job = to_lua(lua, {**job, "environment": to_lua(lua, job["environment"])})
    lua_token = horus.apply(lua_job, to_lua(lua, reply))
    py_job = {**job, "environment": dict(job["environment"])}
    assert lua_token == lua_twin.apply(py_job, reply)
    assert normalize(from_lua(lua_job)) == normalize(py_job)
    assert py_job["environment"] == {"PATH": "/usr/bin", "HORUS_MICRO_BATCH": "64", "HORUS_GRAD_ACCUM": "2"}
    _decision, fields = parse_horus_tokens(py_job["admin_comment"])
    assert sub_batching(fields) == (64, 2)
    plain = {"id": "h-9", "nodes": "n1", "tres": "gres:gpu:g0:1"}
    untouched = {**job, "environment": dict(job["environment"])}
    lua_twin.apply(untouched, plain)
    assert untouched["environment"] == {"PATH": "/usr/bin"} and sub_batching(parse_horus_tokens(untouched["admin_comment"])[1]) is None


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.integers(-5, 2 ** 33), st.text(alphabet=" \t0123456789x.e-+", max_size=12)))
def test_ended_message_twin(lua, job_id):
    """EpilogSlurmctld's SLURM_JOB_ID -> the line for horusd: the same in Lua 5.1 and its twin."""
    value = None if job_id is None else str(job_id)
    line = lua.globals().HORUS.ended_message(value)
    assert (None if line is None else json.loads(line)) == lua_twin.ended_message(value)


def test_ended_message_reads_a_job_id_only():
    assert lua_twin.ended_message("42") == {"op": "ended", "job_id": 42}
    assert lua_twin.ended_message(" 7\n") == {"op": "ended", "job_id": 7}
    for bad in (None, "", "0", "-3", "1.5", "0x10", "1e3", "4294967296", "x"):
        assert lua_twin.ended_message(bad) is None
