"""horusd's socket front under attack by one local user (issue 15): it must not die, stall or be fooled.

The hostile client runs as the ordinary user ``horustest`` (tests/unprivileged.py) and talks to the
world-writable user socket, as any local user can; job_submit.lua's side is played on the controller
socket. Each test is a defect that was reproduced first.
"""

import json
import os
import socket
import threading
import time

import pytest

from slurm_horus.service import protocol
from slurm_horus.service.server import Frontend

from unprivileged import IDLE_CONNECTIONS, ensure_user, popen_python_as, requests_as


class Recorder:
    """``decide`` for the front: records what reached it; ``slow`` sleeps, ``reload`` counts overlaps."""

    def __init__(self):
        self.seen = []
        self.lock = threading.Lock()
        self.reloading = 0
        self.most_reloading = 0

    def __call__(self, message):
        with self.lock:
            self.seen.append(dict(message))
        op = message.get("op")
        if op == "slow":
            time.sleep(float(message.get("s", 0.3)))
        if op == "claim":
            return None
        if op == "reload":
            with self.lock:
                self.reloading += 1
                self.most_reloading = max(self.most_reloading, self.reloading)
            time.sleep(1.0)  # a reload rebuilds models: slow
            with self.lock:
                self.reloading -= 1
            return {"ok": True, "reloaded": True}
        return {"ok": True, "action": "unchanged", "reason": "test", "uid": message.get("uid"),
                "user": message.get("user"), "n": message.get("n")}

    def ops(self):
        with self.lock:
            return [m.get("op") for m in self.seen]


@pytest.fixture
def front():
    decide = Recorder()
    path = f"/tmp/horus-attack-{os.getpid()}-{id(decide)}.sock"
    frontend = Frontend(decide, path)
    frontend.start()
    frontend.decide_calls = decide
    yield frontend
    frontend.stop()


@pytest.fixture(scope="module")
def user():
    return ensure_user()


def exchange(path, data, lines=1, timeout=2.0):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(data)
        reader = sock.makefile("rb")
        return [json.loads(reader.readline()) for _ in range(lines)]


def answered_quickly(frontend, n=1, limit_s=1.0):
    started = time.monotonic()
    reply = protocol.ask({"op": "place", "uid": 5, "n": n}, frontend.socket_path, timeout_s=limit_s)
    return reply is not None and reply["n"] == n, time.monotonic() - started


def test_a_deeply_nested_line_does_not_kill_the_frontend(front):
    reply = exchange(front.socket_path, b"[" * 100_000 + b"\n")[0]
    assert reply["ok"] is False
    assert front.thread.is_alive()
    assert answered_quickly(front)[0]


def test_every_line_of_one_write_is_answered(front):
    replies = exchange(front.socket_path, protocol.encode({"op": "place", "n": 1}) + protocol.encode(
        {"op": "place", "n": 2}) + protocol.encode({"op": "claim", "id": "h1"}) + protocol.encode(
        {"op": "place", "n": 3}), lines=3)
    assert [r["n"] for r in replies] == [1, 2, 3]
    assert front.decide_calls.ops() == ["place", "place", "claim", "place"]


def test_a_request_whose_client_has_gone_is_not_decided(front):
    busy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    busy.connect(front.socket_path)
    busy.sendall(protocol.encode({"op": "slow", "s": 0.5}))  # the front is busy meanwhile
    time.sleep(0.1)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as gone:
        gone.connect(front.socket_path)
        # a claim is a fact (job_submit.lua applied the offer): it counts even when the client is gone
        gone.sendall(protocol.encode({"op": "claim", "id": "h9"}) + protocol.encode({"op": "place", "n": 9}))
    busy.makefile("rb").readline()
    busy.close()
    assert answered_quickly(front, n=10)[0]
    assert front.decide_calls.ops() == ["slow", "claim", "place"]
    assert [m.get("n") for m in front.decide_calls.seen] == [None, None, 10]


def test_reloads_run_one_at_a_time_and_requests_are_answered_meanwhile(front):
    clients = []
    for _ in range(20):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(front.socket_path)
        sock.sendall(protocol.encode({"op": "reload"}))
        clients.append(sock)
    try:
        ok, took = answered_quickly(front, limit_s=2.0)
        assert ok and took < 0.5  # not behind a reload (1 s each)
        time.sleep(1.5)
        assert front.decide_calls.most_reloading == 1
        assert threading.active_count() < 10
    finally:
        for sock in clients:
            sock.close()


def hostile(user, front, *messages):
    return requests_as(user, front.user_socket_path, *messages)


def test_the_user_socket_refuses_reload_and_claim(user, front):
    replies = hostile(user, front, {"op": "reload"}, {"op": "reload", "uid": user.pw_uid},
                      {"op": "claim", "id": "h123"}, {"op": "place", "uid": 0})
    assert all(r["ok"] is False for r in replies), replies
    assert front.decide_calls.ops() == []


def test_on_the_user_socket_the_user_is_who_the_kernel_says(user, front):
    replies = hostile(user, front, {"op": "place", "user": "alice"}, {"op": "place", "user": "root\nforged line",
                                                                     "uid": user.pw_uid},
                      {"op": "place", "dry_run": True}, {"op": "confirm", "id": "h1"})
    assert [(r["uid"], r["user"]) for r in replies] == [(user.pw_uid, user.pw_name)] * 4
    assert [m["user"] for m in front.decide_calls.seen] == [user.pw_name] * 4


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_idle_connections_of_one_user_are_capped(user, front):
    before = open_fds()
    attacker = popen_python_as(user, IDLE_CONNECTIONS, front.user_socket_path, 1100)
    try:
        assert attacker.stdout.readline() == "ready\n"
        time.sleep(0.3)
        assert open_fds() - before <= Frontend.MAX_CONNECTIONS_PER_UID + 2
        assert answered_quickly(front)[0]
    finally:
        attacker.stdin.close()
        attacker.wait(20)


FLOOD_WITHOUT_READING = r"""
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
line = json.dumps({"op": "place", "comment": "x" * 3000}).encode() + b"\n"
sent = 0
try:
    for _ in range(2000):
        s.sendall(line); sent += 1
except OSError:
    pass
print(sent, flush=True)
time.sleep(3)
"""


def test_a_user_who_floods_and_never_reads_cannot_stall_the_frontend(user, front):
    attacker = popen_python_as(user, FLOOD_WITHOUT_READING, front.user_socket_path)
    try:
        time.sleep(0.5)
        worst = max(answered_quickly(front, n=i, limit_s=3.0)[1] for i in range(5))
        assert worst < 0.5  # a reply the flooder does not read once stalled the front 1 s
        decided = sum(1 for m in front.decide_calls.seen if m.get("user") == user.pw_name)
        assert decided <= Frontend.USER_BURST + 5
    finally:
        attacker.wait(20)
