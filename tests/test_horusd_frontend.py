"""horusd's socket front: permissions, SO_PEERCRED, malformed input, key=value replies."""

import json
import logging
import os
import pwd
import socket
import stat
import subprocess
import sys
import time

import pytest

from slurm_horus.service import protocol
from slurm_horus.service.server import Frontend, authorize, past_deadline


@pytest.fixture
def frontend(tmp_path):
    seen = []

    def decide(message):
        seen.append(message)
        if message.get("op") == "boom":
            raise RuntimeError("deliberate")
        return {"ok": True, "action": "unchanged", "reason": "test", "uid": message.get("uid")}

    # a short path: AF_UNIX paths are limited to 108 bytes
    path = f"/tmp/horus-test-{os.getpid()}-{id(seen)}.sock"
    front = Frontend(decide, path)
    front.start()
    front.seen = seen
    yield front
    front.stop()


def raw_exchange(path, data):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect(path)
        sock.sendall(data)
        return sock.makefile("rb").readline()


def test_socket_modes(frontend):
    assert stat.S_IMODE(os.stat(frontend.socket_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(frontend.user_socket_path).st_mode) == 0o666
    assert stat.S_ISSOCK(os.stat(frontend.socket_path).st_mode)


def test_controller_request_answered(frontend):
    reply = protocol.ask({"op": "place", "uid": 1234}, frontend.socket_path, timeout_s=2)
    assert reply == {"ok": True, "action": "unchanged", "reason": "test", "uid": 1234}


def test_malformed_and_failing_requests_get_ok_false(frontend):
    reply = json.loads(raw_exchange(frontend.socket_path, b"not json\n"))
    assert reply["ok"] is False and reply["error"].startswith("malformed request")
    reply = json.loads(raw_exchange(frontend.socket_path, b'{"op": "boom"}\n'))
    assert reply["ok"] is False and "RuntimeError" in reply["error"]
    # and the client helper turns both into "no answer" (fail open)
    assert protocol.ask({"op": "boom"}, frontend.socket_path, timeout_s=2) is None


def test_kv_reply_for_lua(frontend):
    line = raw_exchange(frontend.socket_path, b'{"op": "place", "reply": "kv", "uid": 5}\n').decode()
    assert line == "action=unchanged;ok=1;reason=test;uid=5\n"


def test_ask_fails_open_without_daemon(tmp_path):
    assert protocol.ask({"op": "ping"}, str(tmp_path / "nothing.sock"), timeout_s=0.1) is None


def test_authorize_rules():
    assert authorize({"op": "place", "uid": 5}, 1000, controller=True) is None
    assert authorize({"op": "reload"}, None, controller=True) is None  # TCP: a controller peer
    message = {"op": "place", "uid": 1000, "user": "someone"}
    assert authorize(message, 1000, controller=False) is None
    assert message["uid"] == 1000 and message["peer"] == "user" and message["user"] != "someone"
    message = {"op": "place"}
    assert authorize(message, 1000, controller=False) is None and message["uid"] == 1000
    # on the user socket root is a user like any other: only its own uid
    assert "may not ask on behalf of uid 5" in authorize({"op": "place", "uid": 5}, 0, controller=False)
    assert "may not ask on behalf of uid 0" in authorize({"op": "place", "uid": 0}, 1000, controller=False)
    assert authorize({"op": "place", "uid": "x"}, 1000, controller=False) == "bad uid"
    for op in ("reload", "claim", "left", "ended", None, "boom"):  # "left", "ended": only the Lua tells it
        assert "user socket" in authorize({"op": op}, 1000, controller=False)


ORDINARY_USER_CLIENT = r"""
import json, os, socket, sys
os.setgid(65534); os.setuid(65534)
controller, user_socket = sys.argv[1], sys.argv[2]
out = {}
try:
    s = socket.socket(socket.AF_UNIX); s.connect(controller); out["controller"] = "connected"
except PermissionError:
    out["controller"] = "denied"
for name, uid in (("own", 65534), ("other", 0)):
    s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(user_socket)
    s.sendall((json.dumps({"op": "place", "uid": uid}) + "\n").encode())
    out[name] = json.loads(s.makefile().readline())
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_ordinary_user_cannot_write_controller_socket_nor_impersonate(frontend, caplog):
    pwd.getpwuid(65534)  # nobody exists on Debian
    caplog.set_level(logging.WARNING, logger="horusd")
    result = subprocess.run([sys.executable, "-c", ORDINARY_USER_CLIENT, frontend.socket_path,
                             frontend.user_socket_path], capture_output=True, text=True, timeout=20)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["controller"] == "denied"
    assert out["own"]["ok"] is True and out["own"]["uid"] == 65534
    assert out["other"] == {"ok": False, "error": "uid 65534 may not ask on behalf of uid 0"}
    assert any("refused request from uid 65534" in r.getMessage() for r in caplog.records)
    assert [m.get("uid") for m in frontend.seen] == [65534]


def test_a_silent_client_does_not_hold_up_the_others(frontend):
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(frontend.socket_path)
    silent.sendall(b'{"op": "pla')  # half a request, then nothing
    try:
        reply = protocol.ask({"op": "place", "uid": 7}, frontend.socket_path, timeout_s=1.0)
        assert reply is not None and reply["uid"] == 7
    finally:
        silent.close()


def test_oversized_request_is_dropped_not_buffered(frontend):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(frontend.socket_path)
        try:
            sock.sendall(b"x" * (protocol.MAX_LINE_BYTES + 65536))
        except OSError:
            pass  # the server may close while we still send
        try:
            assert sock.recv(100) == b""  # closed without an answer
        except ConnectionResetError:
            pass  # or reset, when our unread bytes were still queued
    assert protocol.ask({"op": "place", "uid": 8}, frontend.socket_path, timeout_s=1.0)["uid"] == 8


def test_several_requests_on_one_kept_connection(frontend):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect(frontend.socket_path)
        reader = sock.makefile("rb")
        for uid in (11, 12, 13):
            sock.sendall(protocol.encode({"op": "place", "uid": uid}))
            assert json.loads(reader.readline())["uid"] == uid


def test_a_request_read_past_its_deadline_is_answered_expired_and_not_decided(frontend):
    late = {"op": "place", "uid": 7, "give_up_at": time.time() - 0.5}
    reply = json.loads(raw_exchange(frontend.socket_path, (json.dumps(late) + "\n").encode()))
    assert reply == {"ok": False, "error": "expired: past its deadline"}
    assert not any(m.get("uid") == 7 for m in frontend.seen) and frontend.expired == 1
    # a claim is a fact, whenever it is read; a request in time is decided
    raw_exchange(frontend.socket_path, (json.dumps({"op": "claim", "give_up_at": 1.0}) + "\n").encode())
    raw_exchange(frontend.socket_path, (json.dumps({"op": "place", "uid": 8, "give_up_at": time.time() + 5}) + "\n").encode())
    assert [m["op"] for m in frontend.seen[-2:]] == ["claim", "place"] and frontend.expired == 1


def test_past_deadline_reads_only_a_number():
    assert past_deadline({"give_up_at": 100.0}, now=100.25) == pytest.approx(0.25)
    for value in (100.5, None, "99", True, float("nan")):
        assert past_deadline({"give_up_at": value}, now=100.25) is None
    assert past_deadline({}, now=1e12) is None


def test_ask_says_when_it_stops_waiting(frontend):
    before = time.time()
    assert protocol.ask({"op": "place", "uid": 9}, frontend.socket_path, timeout_s=2)["uid"] == 9
    sent = frontend.seen[-1]["give_up_at"]
    assert before + 2 <= sent <= time.time() + 2
