"""job_submit.lua's socket path in the real Lua 5.1 with Debian's lua-socket, against horusd's front:
one kept connection for many submissions, a fresh one after horusd restarts, fail-open when gone."""

import os
import shutil
import subprocess

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
