"""Fuzzers (issue 15): whatever the bytes, each input path answers, refuses in one line, or fails open.

* wire protocol: any line decodes to a dict or a ValueError; any decoded message, from either
  socket, gets a reply from horusd's own ``decide`` (never an exception); any byte stream on the
  user socket leaves the front alive and answering, with no traceback logged;
* ``#SBATCH`` parser: any script and any argv give horus-sbatch a plan (placed or unchanged);
* trace readers: any file, in every format, is jobs or an InputError;
* CSV loaders (profiles, observations): rows or an InputError.

``make test`` runs each for HORUS_FUZZ_EXAMPLES examples (default 60); ``bench/bench_fuzz.py`` runs
each for minutes and reports the examples tried and the tracebacks found.
"""

import atexit
import collections
import io
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_horus.errors import InputError
from slurm_horus.interference.io import load_observations_csv, load_profiles_csv
from slurm_horus.service import protocol
from slurm_horus.service.protocol import encode_kv as encode_kv_reply
from slurm_horus.service.server import authorize
from slurm_horus.sim.traces import FORMATS, read_trace

EXAMPLES = int(os.environ.get("HORUS_FUZZ_EXAMPLES", "60"))
COUNTS = collections.Counter()  # examples run per target (bench/bench_fuzz.py reports them)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
TMP = tempfile.mkdtemp(prefix="horus-fuzz-")
atexit.register(shutil.rmtree, TMP, True)


# ---- wire protocol --------------------------------------------------------------------------------
FIELDS = ["op", "uid", "user", "reply", "dry_run", "explain", "gpus_per_node", "num_nodes", "job_class", "hints",
          "comment", "partition", "tres_per_node", "tres_per_job", "tres_per_task", "min_nodes", "num_tasks",
          "time_limit_min", "id", "offer", "peer", "req_nodes", "exc_nodes", "gpu_type", "job_id", "job_ids"]
OPS = ["place", "ping", "confirm", "claim", "ended", "reload", "boom", "", None, 7, ["place"]]
HINTS = ["HORUS_CLASS", "HORUS_MODEL", "HORUS_BATCH_SIZE", "HORUS_AMP", "HORUS_EXPECTED_MINUTES"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=False),
                    st.text(max_size=30), st.sampled_from(["gres:gpu:2", "gpu:g1:1", "resnet50-bs64", "4294967294",
                                                           "1e400", "-1", "h0123456789", "kv", "n1:0"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=8) | st.sampled_from(HINTS), inner, max_size=4),
                           max_leaves=12)
messages = st.fixed_dictionaries({"op": st.sampled_from(OPS)},
                                 optional={name: json_values for name in FIELDS if name != "op"})

wire_lines = st.one_of(
    st.binary(max_size=300),
    messages.map(lambda m: json.dumps(m).encode()),
    st.integers(1, 5000).map(lambda n: b"[" * n),
    st.integers(1, 3000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.sampled_from([b'{"op":"place","gpus_per_node":NaN}', b'{"op":"place","uid":1e999}', b"\xff\xfe{}",
                     b'{"op":"place","num_nodes":' + b"9" * 5000 + b"}", b"", b"   ", b"\r"]),
)


def check_decode(line):
    try:
        message = protocol.decode(line)
    except ValueError:
        return
    assert isinstance(message, dict)


@FUZZ
@given(wire_lines)
def test_fuzz_wire_decode(line):
    COUNTS["wire-decode"] += 1
    check_decode(line)


_HORUSD = {}


def fuzz_horusd():
    """One horusd (real decide, real front) on a hand-made 2-node cluster, started once."""
    if "horusd" not in _HORUSD:
        from slurm_horus.config import load_config
        from slurm_horus.service.app import Horusd
        from slurm_horus.service.daemon import Snapshot

        from test_horusd_placer import MODEL, node

        class Reader:
            def read(self):
                import time
                return Snapshot([node("n1"), node("n2")], [], taken_at=time.time())

        config = load_config({"socket": f"{TMP}/h.sock", "db": f"{TMP}/h.db", "offers": "yes"}, environ={})
        horusd = Horusd(config, reader=Reader(), predictor_factory=lambda kind: MODEL)
        horusd.refresh_once()
        horusd.frontend.start()
        atexit.register(horusd.frontend.stop)
        errors = []

        class Tracebacks(logging.Handler):
            def emit(self, record):
                if record.exc_info or record.levelno >= logging.ERROR:
                    errors.append(self.format(record))

        logging.getLogger("horusd").addHandler(Tracebacks())
        _HORUSD.update(horusd=horusd, errors=errors)
    return _HORUSD["horusd"], _HORUSD["errors"]


def check_decide(message, controller):
    horusd, _ = fuzz_horusd()
    message = dict(message)
    try:
        protocol.check_fields(message)  # the front decodes every line so
    except ValueError:
        return
    if authorize(message, 4242, controller):
        return
    reply = horusd.decide(message)  # what the front would call: it must not raise
    assert reply is None or isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
    if reply is not None:
        encode_kv_reply(reply)
        protocol.encode(reply)


@FUZZ
@given(messages, st.booleans())
def test_fuzz_decide(message, controller):
    COUNTS["wire-decide"] += 1
    check_decide(message, controller)


def check_front(chunks):
    horusd, errors = fuzz_horusd()
    front = horusd.frontend
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect(front.user_socket_path)
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except OSError:
            pass  # the front may drop a client that sends junk
    reply = protocol.ask({"op": "ping"}, front.socket_path, timeout_s=5)
    assert reply is not None and reply["ok"] is True, "the front stopped answering"
    assert front.thread.is_alive()
    assert not errors, errors[:1]


@FUZZ
@given(st.lists(st.one_of(wire_lines.map(lambda b: b + b"\n"), st.binary(max_size=200)), max_size=6))
def test_fuzz_front(chunks):
    COUNTS["wire-front"] += 1
    check_front(chunks)


# ---- #SBATCH parser ------------------------------------------------------------------------------
script_lines = st.one_of(
    st.sampled_from(["#!/bin/bash", "#!/usr/bin/env python3", "#SBATCH --gres=gpu:1", "#SBATCH -G 2 -N 1",
                     "#SBATCH hetjob", "#SBATCH --wrap 'x'", "#HORUS --class resnet50-bs64", "#HORUS --off",
                     "#SBATCH --gres", "#SBATCH '", '#SBATCH "a\\"', "#SBATCH --time=1-00:00:00", "echo hi",
                     "#SBATCH --gpus-per-task=1 --ntasks=3", "#SBATCH -w n[1-3]", "#SBATCH --array=0-3%2"]),
    st.text(max_size=40).map(lambda t: "#SBATCH " + t),
    st.text(max_size=40).map(lambda t: "#HORUS " + t),
    st.text(max_size=40),
)
argv_words = st.lists(st.one_of(st.sampled_from(["-G", "2", "--gres=gpu:1", "--horus-class", "x", "--dry-run",
                                                 "--explain", "--horus-off", "--wrap", "-N", "3", "--", "-",
                                                 "--exclusive", "-w", "n1", "--time", "abc"]),
                                st.text(max_size=10)), max_size=8)
CONFIG = SimpleNamespace(socket="/nonexistent/horusd.sock", timeout_ms=100.0)


def check_sbatch(lines, tail, argv, reply):
    from slurm_horus.sbatch.cli import BadHorusOption, _Invocation, plan
    from slurm_horus.sbatch.script import read_directives

    from sbatch_fakes import place_reply

    script = "\n".join(lines).encode("utf-8", "surrogateescape") + b"\n" + tail
    found = read_directives(script)
    assert 0 <= found.block_end <= len(script)
    path = os.path.join(TMP, f"job-{threading.get_ident()}.sh")
    with open(path, "wb") as handle:
        handle.write(script)
    answer = {"none": None, "place": place_reply(), "junk": {"ok": True, "action": "place", "nodes": 7}}[reply]
    try:
        submission, _original = plan(_Invocation(list(argv) + [path], {}), {}, lambda text: None, CONFIG,
                                     stdin=io.BytesIO(script), asker=lambda request, address, timeout: answer)
    except BadHorusOption as exc:  # a bad --horus-class/#HORUS value: horus-sbatch's one error line
        assert "\n" not in str(exc) and str(exc)
        return
    assert submission.argv is not None


@FUZZ
@given(st.lists(script_lines, max_size=10), st.binary(max_size=60), argv_words, st.sampled_from(["none", "place", "junk"]))
def test_fuzz_sbatch_script(lines, tail, argv, reply):
    COUNTS["sbatch-script"] += 1
    check_sbatch(lines, tail, argv, reply)


# ---- trace readers and CSV loaders --------------------------------------------------------------
TRACE_COLUMNS = ["submit_time", "duration", "num_gpus", "gpus_per_node", "job_id", "job_class", "partition", "user",
                 "mem_mb", "timestamp", "gpu_time", "cluster", "name", "time", "application", "num_replicas",
                 "batch_size", "num_task", "num_gpu", "iterations", "model_name", "gpu_milli", "creation_time",
                 "deletion_time", "scheduled_time", "gpu_type", "corunner_class", "norm_tput", "gpu_util",
                 "mem_util", "gmem_mb", "solo_tput"]
cells = st.one_of(st.sampled_from(["", "0", "1", "-1", "1.5", "1e400", "-1e400", "nan", "inf", "abc", "2020-01-01 00:00:00",
                                   "resnet50-bs64", "v100", "infer-bert", " 4 ", "0x10", "1_000", "\x00", '"', "'"]),
                  st.text(max_size=12), st.integers(-10 ** 20, 10 ** 20).map(str), st.floats().map(repr))


@st.composite
def csv_files(draw):
    header = draw(st.lists(st.sampled_from(TRACE_COLUMNS), min_size=1, max_size=8))
    rows = draw(st.lists(st.lists(cells, min_size=0, max_size=len(header) + 1), max_size=5))
    text = "\n".join(",".join(row) for row in [header] + rows) + draw(st.sampled_from(["", "\n", "\r\n"]))
    raw = text.encode("utf-8", "surrogateescape")
    return draw(st.sampled_from([raw, raw.replace(b"\n", b"\r\n"), b"\xef\xbb\xbf" + raw, raw + b"\xff\n"]))


gavel_lines = st.lists(st.lists(cells, min_size=1, max_size=11).map("\t".join), max_size=5).map(
    lambda lines: "\n".join(lines).encode("utf-8", "surrogateescape"))
file_contents = st.one_of(st.binary(max_size=400), csv_files(), gavel_lines)


def _write(content, suffix):
    path = os.path.join(TMP, f"input-{threading.get_ident()}{suffix}")
    with open(path, "wb") as handle:
        handle.write(content)
    return path


def check_traces(content, suffix):
    path = _write(content, suffix)
    for fmt in FORMATS:
        try:
            jobs = read_trace(path, fmt, solo_tput=lambda job_class: 2.0, traces_dir=TMP)
        except InputError:
            continue
        assert all(job.duration >= 0 and job.num_gpus >= 0 for job in jobs)


@FUZZ
@given(file_contents, st.sampled_from([".csv", ".trace", ""]))
def test_fuzz_trace_readers(content, suffix):
    COUNTS["trace-readers"] += 1
    check_traces(content, suffix)


def check_csv_loaders(content):
    path = _write(content, ".csv")
    for load in (load_profiles_csv, load_observations_csv):
        try:
            load(path)
        except InputError:
            pass


@FUZZ
@given(file_contents)
def test_fuzz_csv_loaders(content):
    COUNTS["csv-loaders"] += 1
    check_csv_loaders(content)


# what bench/bench_fuzz.py runs, by name
TARGETS = {
    "wire-decode": test_fuzz_wire_decode, "wire-decide": test_fuzz_decide, "wire-front": test_fuzz_front,
    "sbatch-script": test_fuzz_sbatch_script, "trace-readers": test_fuzz_trace_readers,
    "csv-loaders": test_fuzz_csv_loaders,
}
