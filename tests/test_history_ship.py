"""Network shipping: a real receiver, real munged daemons (one per "host", each signing with its own
origin address), real HTTP. The node directory is a ``ship_nodes`` file, as on the local cluster."""

import hashlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from slurm_horus.collect import munge
from slurm_horus.collect.receiver import BodyChecker, NodeDirectory, Receiver, ReceiverServer, read_node_file
from slurm_horus.collect.sampler import Spool, ship_with
from slurm_horus.collect.shipping import CREDENTIAL_HEADER, PATH, NetworkShipper, ShipError, credential_payload
from slurm_horus.localcluster.prereq import find_program
from slurm_horus.store.db import open_db

pytestmark = pytest.mark.slurm  # starts munged daemons (the munge package)

NOW = time.time()


def _batch(node, ts, gpus=2, job=7001, util=60.0):
    return {"node": node, "ts": ts,
            "gpus": [{"node": node, "gpu_index": i, "ts": ts, "uuid": f"GPU-{node}-{i}", "gpu_name": "Tesla V100",
                      "gpu_util": util, "mem_util": 10.0, "mem_used_mb": 1000.0, "mem_total_mb": 16000.0,
                      "job_ids": str(job) if i == 0 else None} for i in range(gpus)],
            "jobs": [{"job_id": job, "node": node, "gpu_index": 0, "ts": ts, "sm_util": util, "mem_util": 5.0,
                      "mem_used_mb": 1000.0, "n_procs": 1, "shared": 0}]}


@pytest.fixture(scope="module")
def mungeds():
    """{"head": socket, "n1": socket, "n2": socket}: three munged with one key; n1 signs as 127.0.0.2,
    n2 as 127.0.0.3, the head as its host."""
    munged = find_program("munged")
    if munged is None:
        pytest.fail("munged not found (package munge)", pytrace=False)
    root = Path(tempfile.mkdtemp(prefix="hship-", dir="/tmp"))
    os.chmod(root, 0o755)
    key = root / "key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    sockets, pids = {}, []
    for name, origin in (("head", None), ("n1", "127.0.0.2"), ("n2", "127.0.0.3")):
        argv = [munged, f"--key-file={key}", f"--socket={root / name}", f"--pid-file={root / name}.pid",
                f"--log-file={root / name}.log", f"--seed-file={root / name}.seed", "--num-threads=1"]
        if origin:
            argv.append(f"--origin={origin}")
        subprocess.run(argv, check=True, timeout=30)
        deadline = time.time() + 10
        while not (root / f"{name}.pid").exists() or not (root / name).exists():
            assert time.time() < deadline, (root / f"{name}.log").read_text()
            time.sleep(0.02)
        pids.append(int((root / f"{name}.pid").read_text().split()[0]))
        sockets[name] = str(root / name)
    (root / "nodes").write_text("n1 127.0.0.2\nn2 127.0.0.3  # comment\n")
    sockets["nodes"] = str(root / "nodes")
    yield sockets
    for pid in pids:
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            pass
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def receiver(mungeds, tmp_path):
    """A running receiver on a free port; yields (url, db path, Receiver)."""
    db_path = tmp_path / "h.db"
    rec = Receiver(str(db_path), NodeDirectory(mungeds["nodes"]), {0}, munge_socket=mungeds["head"])
    server = ReceiverServer(rec, "127.0.0.1:0").start()
    yield f"http://127.0.0.1:{server.port}", db_path, rec
    server.stop()


def _count(db_path, table="gpu_samples"):
    return open_db(db_path).execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def _post(url, body, credential):
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {"Content-Type": "application/x-ndjson"}
    if credential is not None:
        headers[CREDENTIAL_HEADER] = credential
    conn.request("POST", PATH, body=body, headers=headers)
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    return response.status, reply


def _body(*batches):
    return b"".join(json.dumps(b).encode() + b"\n" for b in batches)


def test_a_spool_ships_once_however_often_it_is_sent(receiver, mungeds, tmp_path):
    url, db_path, _ = receiver
    spool = Spool(tmp_path / "spool.db")
    for k in range(3):
        spool.append(_batch("n1", NOW - 100 + k))
    shipper = NetworkShipper(url, munge_socket=mungeds["n1"])
    pending = [b for _, b in spool.pending()]
    shipper.deliver(pending)  # delivered, then "killed" before the spool marked them shipped
    assert ship_with(spool, shipper.deliver) == 3  # sent again: stored once
    assert spool.count() == 0
    db = open_db(db_path)
    assert db.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 6
    assert db.execute("SELECT count(*) FROM job_gpu_use").fetchone()[0] == 3
    # the rollups count each sample once too
    assert db.execute("SELECT samples, sm_n FROM job_gpu_summary").fetchall() == [(3, 3)]
    assert db.execute("SELECT sum(samples) FROM cluster_hourly").fetchone()[0] == 6
    assert db.execute("SELECT count(*), max(gpu_name) FROM gpus").fetchone() == (2, "Tesla V100")


def test_a_node_cannot_ship_another_nodes_samples(receiver, mungeds):
    url, db_path, _ = receiver
    with pytest.raises(ShipError, match="127.0.0.2 may not ship samples of node n2") as refused:
        NetworkShipper(url, munge_socket=mungeds["n1"]).deliver([_batch("n2", NOW)])
    assert refused.value.permanent
    # the claim inside the credential is n1, but a batch in the body names n2
    body = _body(_batch("n1", NOW), _batch("n2", NOW))
    status, reply = _post(url, body, munge.encode(credential_payload("n1", body), mungeds["n1"]))
    assert status == 400 and "names node 'n2'" in reply["error"]
    # an unknown node, a host that is no node (the head's own munged)
    for node, socket_path in (("n9", mungeds["n1"]), ("n1", mungeds["head"])):
        with pytest.raises(ShipError, match="HTTP 403"):
            NetworkShipper(url, munge_socket=socket_path).deliver([_batch(node, NOW)])
    assert _count(db_path) == 0


def test_only_ship_users_may_ship(mungeds, tmp_path):
    rec = Receiver(str(tmp_path / "h.db"), NodeDirectory(mungeds["nodes"]), {54321}, munge_socket=mungeds["head"])
    server = ReceiverServer(rec, "127.0.0.1:0").start()
    try:
        with pytest.raises(ShipError, match="uid 0 may not ship"):
            NetworkShipper(f"http://127.0.0.1:{server.port}", munge_socket=mungeds["n1"]).deliver(
                [_batch("n1", NOW)])
    finally:
        server.stop()
    assert _count(tmp_path / "h.db") == 0


def test_a_credential_covers_one_body_once(receiver, mungeds):
    url, db_path, _ = receiver
    body = _body(_batch("n1", NOW))
    credential = munge.encode(credential_payload("n1", body), mungeds["n1"])
    tampered = body.replace(b"60.0", b"99.0")
    status, reply = _post(url, tampered, credential)
    assert status == 400 and "not the one the credential was made for" in reply["error"]
    fresh = munge.encode(credential_payload("n1", body), mungeds["n1"])
    assert _post(url, body, fresh)[0] == 200
    status, reply = _post(url, body, fresh)  # a replayed credential
    assert status == 401 and "Replayed" in reply["error"]
    foreign = munge.encode(b"horus-ship/1 node=n1 bytes=1 sha256=" + b"0" * 64, mungeds["n1"])
    assert _post(url, body, foreign)[0] == 400
    assert _count(db_path) == 2


@pytest.mark.parametrize("body, status, message", [
    (b"not json\n", 400, "not JSON"),
    (b"[" * 100000 + b"\n", 400, "not JSON"),
    (b'{"node": "n1", "ts": NaN, "gpus": []}\n', 400, "ts must be a number"),
    (b'{"node": "n1", "ts": 1, "gpus": [{"node": "n1", "gpu_index": "0"}]}\n', 400, "gpu_index must be an integer"),
    (b'{"node": "n1", "ts": 1, "gpus": [], "jobs": [{"job_id": -1}]}\n', 400, "job_id must be"),
    (b'{"node": "n1", "ts": 1, "gpus": [{"node": "n1", "gpu_index": 0, "ts": 1, "gpu_util": 1e999}]}\n', 400,
     "gpu_util must be a number"),
    (b'{"node": "n1", "ts": 1, "gpus": [{"node": "n1", "gpu_index": 0, "ts": 1, "job_ids": "1;drop"}]}\n', 400,
     "job_ids"),
    (b'{"node": "n1", "ts": 99999999999, "gpus": []}\n', 400, "ts must be a number"),
    (b"\n\n", 400, "no batch"),
])
def test_hostile_bodies_get_one_line_and_store_nothing(receiver, mungeds, body, status, message):
    url, db_path, _ = receiver
    got, reply = _post(url, body, munge.encode(credential_payload("n1", body), mungeds["n1"]))
    assert got == status and message in reply["error"] and "\n" not in reply["error"]
    assert reply["ok"] is False and "Traceback" not in reply["error"]
    assert _count(db_path) == 0


def test_malformed_requests_are_refused_and_the_receiver_goes_on(receiver, mungeds):
    url, db_path, _ = receiver
    host, port = url.split("//")[1].split(":")
    assert _post(url, b"{}\n", None)[0] == 401
    assert _post(url, b"{}\n", "MUNGE:garbage:")[0] == 401
    assert _post(url, b"{}\n", "x" * 10000)[0] == 401
    # too large, no length, silent clients, raw garbage: each answered or dropped, never fatal
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", PATH)
    conn.putheader("Content-Length", str(64 << 20))
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()
    import socket as socketlib
    for payload in (b"GARBAGE\r\n\r\n", b"POST /v1/batches HTTP/1.1\r\n\r\n", b"\x00" * 70000, b""):
        with socketlib.create_connection((host, int(port)), timeout=15) as sock:
            sock.sendall(payload)
            sock.shutdown(socketlib.SHUT_WR)
            sock.recv(65536)
    NetworkShipper(url, munge_socket=mungeds["n1"]).deliver([_batch("n1", NOW)])
    assert _count(db_path) == 2


def test_the_collector_command_ships_without_any_database(receiver, mungeds, tmp_path):
    url, db_path, _ = receiver
    env = dict(os.environ, HORUS_DB=str(tmp_path / "nowhere" / "never.db"), HORUS_CONFIG=os.devnull)
    base = [sys.executable, "-m", "slurm_horus", "collect", "--backend", "standin", "--gpus", "2",
            "--spool", str(tmp_path / "spool.db"), "--ship-to", url]
    done = subprocess.run(base + ["--node", "n1", "--count", "2", "--interval", "0.05",
                                  "--munge-socket", mungeds["n1"]], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert _count(db_path) == 4
    assert not (tmp_path / "nowhere").exists()
    other = subprocess.run(base[:-2] + ["--node", "n2", "--once", "--ship-every", "0"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr
    refused = subprocess.run(base + ["--ship", "--munge-socket", mungeds["n1"]], env=env, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"horus: receiver {url} refused the batches (HTTP 403): a credential from 127.0.0.2 may not ship samples "
        f"of node n2; 1 batches kept in the spool"]
    down = subprocess.run(base[:-1] + ["http://127.0.0.1:9", "--ship", "--munge-socket", mungeds["n2"]], env=env,
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "unreachable" in down.stderr and "Traceback" not in down.stderr
    assert _count(db_path) == 4


def test_body_checker_keeps_only_clean_rows():
    checker = BodyChecker(clock=lambda: 1000.0)
    body = _body(_batch("n1", 900.0))
    batches = checker.batches(body, "n1")
    assert batches[0]["gpus"][0]["gpu_util"] == 60.0 and batches[0]["jobs"][0]["job_id"] == 7001
    with pytest.raises(ValueError, match="ts must be"):
        checker.batches(_body(_batch("n1", 2000.0)), "n1")  # stamped well ahead of the receiver's clock
    with pytest.raises(ValueError, match="shared must be 0 or 1"):
        bad = _batch("n1", 900.0)
        bad["jobs"][0]["shared"] = 2
        checker.batches(_body(bad), "n1")


def test_node_file_is_read_with_errors_naming_the_line(tmp_path):
    path = tmp_path / "nodes"
    path.write_text("# site nodes\nn1 127.0.0.2 127.0.0.9\n\nn2 localhost\n")
    nodes = read_node_file(path)
    assert nodes["n1"] == {"127.0.0.2", "127.0.0.9"} and "127.0.0.1" in nodes["n2"]
    path.write_text("n1\n")
    from slurm_horus.errors import InputError
    with pytest.raises(InputError, match=f"{path}:1"):
        read_node_file(path)


def test_digest_in_the_payload_is_of_the_exact_body():
    body = b'{"a": 1}\n'
    assert credential_payload("n1", body).decode().endswith(hashlib.sha256(body).hexdigest())
