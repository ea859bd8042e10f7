"""job_submit.lua's socket path in the real Lua 5.1 with Debian's lua-socket, against horusd's front:
one kept connection for many submissions, a fresh one after horusd restarts, fail-open when gone."""

import contextlib
import os
import shutil
import subprocess
import sys
import time

import pytest

from slurm_horus.resources import resource_path
from slurm_horus.service.server import Frontend

LUA = shutil.which("lua5.1")
pytestmark = pytest.mark.skipif(LUA is None, reason="lua5.1 not installed (make test installs it)")

DRIVER = r"""
slurm = {SUCCESS = 0, log_info = function(fmt, ...) print(string.format(fmt, ...)) end}
dofile(arg[1])
local conf = HORUS.parse_config("socket = " .. arg[2] .. "\ntimeout_ms = 500\n")
for i = 1, tonumber(arg[3]) do
  local reply, err = HORUS.ask(conf, '{"op":"place","reply":"kv","uid":' .. i .. '}')
  print("reply " .. tostring(reply) .. " " .. tostring(err))
  io.stdout:flush()
  if arg[4] == "wait" then io.read("*l") end
end
"""


def start_front(path):
    def decide(message):
        return {"ok": True, "action": "unchanged", "reason": "test", "n": message.get("uid")}
    front = Frontend(decide, path)
    front.start()
    return front


@pytest.fixture
def paths(tmp_path):
    driver = tmp_path / "driver.lua"
    driver.write_text(DRIVER)
    return str(resource_path("job_submit_lua", "job_submit.lua")), str(driver), f"/tmp/horus-lua-{os.getpid()}.sock"


def test_one_kept_connection_for_many_asks(paths):
    script, driver, sock = paths
    front = start_front(sock)
    try:
        out = subprocess.run([LUA, driver, script, sock, "5"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        replies = [line for line in out.stdout.splitlines() if line.startswith("reply ")]
        assert replies == [f"reply action=unchanged;n={i};ok=1;reason=test nil" for i in range(1, 6)]
        assert front.accepted == 1
    finally:
        front.stop()


def test_reconnects_after_a_restart_and_fails_open_when_gone(paths):
    script, driver, sock = paths
    front = start_front(sock)
    lua = subprocess.Popen([LUA, driver, script, sock, "3", "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
    try:
        assert lua.stdout.readline() == "horus: job_submit.lua loaded\n"
        assert lua.stdout.readline().startswith("reply action=unchanged;n=1;")
        front.stop()  # horusd restarts: the kept connection is dead
        front = start_front(sock)
        lua.stdin.write("\n")
        lua.stdin.flush()
        assert lua.stdout.readline().startswith("reply action=unchanged;n=2;")
        front.stop()  # and now it is gone for good
        front = None
        lua.stdin.write("\n")
        lua.stdin.flush()
        line = lua.stdout.readline()
        assert line.startswith("reply nil connect " + sock), line
    finally:
        lua.stdin.close()
        lua.wait(10)
        if front is not None:
            front.stop()


SUBMITTER = r"""
slurm = {SUCCESS = 0, log_info = function(fmt, ...) print(string.format(fmt, ...)) io.stdout:flush() end}
dofile(arg[1])
for line in io.lines() do
  local job = {tres_per_node = "gres:gpu:1", comment = "class=" .. line, user_name = "u", name = "j"}
  slurm_job_submit(job, {}, 1000)
  print("comment " .. tostring(job.admin_comment))
  io.stdout:flush()
end
"""

PLACED = {"ok": True, "action": "place", "nodes": ["n1"], "tres": "gres:shard:g0:1", "mode": "shareable",
          "slowdown": 1.0, "class": "lm-bs20", "gpulist": "n1:0", "age": 0.1}


def write_offers(path, version, offer_id, claimed=""):
    import time

    from slurm_horus.service.protocol import encode_kv

    offer = encode_kv({**PLACED, "id": offer_id, "tres": "gres:shard:g3:1", "gpulist": "n1:3"})
    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        out.write(f"version={version};claimed={claimed};generated={time.time():.3f}\nlm-bs20\t{offer}\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def submitting_script(paths, tmp_path, versions_in_replies):
    """job_submit.lua loaded in a Lua 5.1 process next to a stand-in horusd front that records every
    message and answers each place request with a decision naming the next of ``versions_in_replies``
    (the offers version horusd had published when it replied). Yields (submit(job_class) -> the
    job's admin comment, the messages seen)."""
    script, _driver, sock = paths
    submitter = tmp_path / "submit.lua"
    submitter.write_text(SUBMITTER)
    conf = tmp_path / "horus.conf"
    conf.write_text(f"socket = {sock}\ntimeout_ms = 2000\n")
    seen, versions = [], iter(versions_in_replies)

    def decide(message):
        seen.append(message)
        if message.get("op") == "claim":
            return None
        return {**PLACED, "id": f"hask{len(seen)}", "offers_version": next(versions)}

    front = Frontend(decide, sock)
    front.start()
    lua = subprocess.Popen([LUA, submitter, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "HORUS_CONFIG": str(conf)})

    def submit(job_class="lm-bs20"):
        lua.stdin.write(job_class + "\n")
        lua.stdin.flush()
        while True:
            line = lua.stdout.readline()
            assert line, "the Lua script ended"
            if line.startswith("comment "):
                return line.split()[1]

    try:
        yield submit, seen
    finally:
        lua.stdin.close()
        lua.wait(10)
        front.stop()


def test_which_offers_the_script_may_take(paths, tmp_path):
    offers = f"{paths[2]}.offers"
    write_offers(offers, 100, "hold")  # published before this script was loaded: maybe taken already
    with submitting_script(paths, tmp_path, [100, 102, 106, 106]) as (submit, seen):
        assert submit() == "horus:hask1"  # version 100 may be spent: ask
        write_offers(offers, 101, "h101")
        assert submit() == "horus:h101"  # taken without asking; the claim follows on the connection
        write_offers(offers, 102, "h102")  # computed before horusd read that claim
        assert submit() == "horus:hask3"  # so not taken: ask (horusd reads the claim first)
        write_offers(offers, 103, "h103", claimed="h101")
        assert submit() == "horus:h103"
        write_offers(offers, 104, "h104", claimed="h103")
        assert submit() == "horus:h104"
        write_offers(offers, 105, "h105", claimed="h103")  # h104's claim not seen yet
        assert submit() == "horus:hask6"  # ask; this reply names version 106 ...
        write_offers(offers, 106, "h106", claimed="h104")
        assert submit() == "horus:hask7"  # ... so that one, computed before the decision, is spent
        write_offers(offers, 107, "h107", claimed="h104")
        assert submit() == "horus:h107"
    assert [m["op"] for m in seen] == ["place", "claim", "place", "claim", "claim", "place", "place", "claim"]
    assert [m["id"] for m in seen if m["op"] == "claim"] == ["h101", "h103", "h104", "h107"]


def write_joint_offers(path, version, ids, claimed="", joint=None):
    """An offers file with one offer per class (``ids``: {class: offer id}), the first ``joint`` (all,
    by default) joint."""
    import time

    from slurm_horus.service.protocol import encode_kv, format_offers_header

    lines = [format_offers_header(version, claimed, time.time(), len(ids) if joint is None else joint)]
    for gpu, (job_class, offer_id) in enumerate(ids.items()):
        lines.append(f"{job_class}\t" + encode_kv({**PLACED, "class": job_class, "id": offer_id,
                                                   "tres": f"gres:shard:g{gpu}:1", "gpulist": f"n1:{gpu}"}))
    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        out.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


def test_joint_offers_are_taken_together_one_per_class(paths, tmp_path):
    """Joint offers (the header's joint=K first lines): after taking one, the script takes another
    class's joint offer of the same version without waiting for its claim, never the same class's
    twice; an offer that is not joint only as the first of its version; an ask ends the run (its
    decision is not in those offers)."""
    offers = f"{paths[2]}.offers"
    write_joint_offers(offers, 100, {"lm": "hold"})  # published before this script was loaded
    with submitting_script(paths, tmp_path, [100, 201, 201, 203, 205, 207]) as (submit, seen):
        assert submit("lm") == "horus:hask1"  # version 100 may be spent: ask
        write_joint_offers(offers, 200, {"lm": "h200a", "resnet": "h200b", "vit": "h200c"})
        assert submit("lm") == "horus:h200a"
        assert submit("resnet") == "horus:h200b"  # same version, another class: no wait for h200a's claim
        assert submit("lm") == "horus:hask4"  # lm's offer of version 200 is taken
        assert submit("vit") == "horus:hask5"  # that ask ended the run: version 200 is spent
        write_joint_offers(offers, 202, {"lm": "h202a", "resnet": "h202b"}, joint=0)
        assert submit("lm") == "horus:h202a"
        assert submit("resnet") == "horus:hask7"  # not joint: wait for the claim, as before
        write_joint_offers(offers, 204, {"lm": "h204a", "resnet": "h204b", "vit": "h204c"}, claimed="h202a",
                           joint=2)
        assert submit("vit") == "horus:h204c"  # an offer computed alone may be the first of its version
        assert submit("lm") == "horus:hask9"  # ... and then nothing more from it
        write_joint_offers(offers, 206, {"lm": "h206a", "resnet": "h206b", "vit": "h206c"}, joint=2)
        assert submit("resnet") == "horus:h206b"
        assert submit("vit") == "horus:hask11"  # not joint: not after another offer of its version
    assert [m["id"] for m in seen if m["op"] == "claim"] == ["h200a", "h200b", "h202a", "h204c", "h206b"]


HUNG_HORUSD = r"""
import os, signal, socket, sys
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen(128)
print("listening", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)  # hung: the kernel still queues connections, nobody answers
"""

BREAKER_DRIVER = r"""
slurm = {SUCCESS = 0, log_info = function() end}
dofile(arg[1])
local socket = require("socket")
local conf = HORUS.parse_config("socket = " .. arg[2] .. "\ntimeout_ms = 100\nbreaker_timeouts = 3\n"
  .. "breaker_open_s = 0.5\nbreaker_max_open_s = 4\n")
local function ask(label)
  local reply, err = HORUS.ask(conf, '{"op":"ping"}')
  print(label .. " " .. tostring(err))
  io.stdout:flush()
end
for i = 1, 8 do ask("burst") end
socket.sleep(0.6)
ask("later")
ask("later")
"""


def test_a_hung_horusd_trips_the_circuit_breaker_in_real_lua(paths, tmp_path):
    script, _driver, sock = paths
    driver = tmp_path / "breaker.lua"
    driver.write_text(BREAKER_DRIVER)
    hung = subprocess.Popen([sys.executable, "-c", HUNG_HORUSD, sock], stdout=subprocess.PIPE, text=True)
    try:
        assert hung.stdout.readline() == "listening\n"
        out = subprocess.run([LUA, str(driver), script, sock], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        # three asks wait out the deadline; then none is made until the pause is over, when one
        # tries again, times out, and opens the breaker for twice as long
        assert lines == ["burst receive: timeout"] * 3 + ["burst circuit open"] * 5 + [
            "later receive: timeout", "later circuit open"], lines
    finally:
        hung.kill()
        hung.wait(10)
        if os.path.exists(sock):
            os.unlink(sock)


def test_a_breaker_waits_while_horusd_writes_no_heartbeat_in_real_lua(paths, tmp_path):
    """The same hung horusd, but its offers file was last written long ago: past the pause, the
    try is not made (it would cost the deadline again); written just now, it is."""
    script, _driver, sock = paths
    driver = tmp_path / "breaker.lua"
    driver.write_text(BREAKER_DRIVER)
    hung = subprocess.Popen([sys.executable, "-c", HUNG_HORUSD, sock], stdout=subprocess.PIPE, text=True)
    offers = sock + ".offers"
    try:
        assert hung.stdout.readline() == "listening\n"
        results = {}
        for label, age in (("stale", 100.0), ("fresh", -30.0)):  # fresh: still fresh 30 s from now
            with open(offers, "w") as out:
                out.write("version=5;claimed=;generated=%.3f\n" % (time.time() - age))
            run = subprocess.run([LUA, str(driver), script, sock], capture_output=True, text=True, timeout=30)
            assert run.returncode == 0, run.stderr
            results[label] = run.stdout.splitlines()
        burst = ["burst receive: timeout"] * 3 + ["burst circuit open"] * 5
        assert results["stale"] == burst + ["later circuit open: horusd silent"] * 2, results
        assert results["fresh"] == burst + ["later receive: timeout", "later circuit open"], results
    finally:
        hung.kill()
        hung.wait(10)
        for path in (sock, offers):
            if os.path.exists(path):
                os.unlink(path)


CLOCK = r"""
slurm = {SUCCESS = 0, log_info = function() end}
dofile(arg[1])
print(string.format("%.6f", HORUS.give_up_at(HORUS.parse_config("timeout_ms = 250\n"))))
"""


def test_give_up_at_is_the_wall_clock_horusd_compares_with(tmp_path, paths):
    """horusd expires a request read after the script's give_up_at (server.past_deadline compares
    it with time.time()): lua-socket's gettime must be that same clock, plus the timeout."""
    script = paths[0]
    driver = tmp_path / "clock.lua"
    driver.write_text(CLOCK)
    before = time.time()
    out = subprocess.run([LUA, str(driver), script], capture_output=True, text=True, timeout=30)
    after = time.time()
    assert out.returncode == 0, out.stderr
    assert before + 0.25 - 0.01 <= float(out.stdout) <= after + 0.25 + 0.01
