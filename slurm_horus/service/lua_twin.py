"""Python twin of every decision job_submit.lua makes (slurmjobpacker's rule).

Each function mirrors the Lua function of the same name in ``job_submit_lua/job_submit.lua``; the
tests run both on the same cases in real Lua 5.1 (lupa) and require identical answers. Production
code never imports this module: horusd's wire contract (what it reads and writes) is
``service/protocol.py``, and the tests hold the twin against it too.

A job is a plain dict with job_desc's field names (``tres_per_node``, ``min_nodes``...); unset
numbers carry Slurm's NO_VAL (4294967294).
"""

import re
import time

from .. import jobclass

NO_VAL = 4294967294
NO_VAL16 = 65534

DEFAULTS = {
    "socket": "/run/horus/horusd.sock",
    "timeout_ms": 100,
    "max_offer_age_s": 3,
    "disable_file": "/etc/horus/disabled",
    "max_state_age_s": 60,
    "handle_exclusive": False,
    "handle_nodelist": False,
    "offers": True,
    "breaker_timeouts": 3,
    "breaker_open_s": 5,
    "breaker_max_open_s": 60,
}
_BOOLEAN = {"handle_exclusive", "handle_nodelist", "offers"}
_NUMBER = {"timeout_ms", "max_state_age_s", "max_offer_age_s", "breaker_timeouts", "breaker_open_s",
           "breaker_max_open_s"}

_SAFE_NODES = re.compile(r"^[A-Za-z0-9\-.\[\],]+\Z")
_SAFE_TRES = re.compile(r"^[A-Za-z0-9:/=,_\-]+\Z")
_SAFE_ID = re.compile(r"^[A-Za-z0-9\-_]+\Z")
_SAFE_CLASS = re.compile(r"^[A-Za-z0-9\-_.]+\Z")
_INDEX_TYPE = re.compile(r"^g[0-9]+\Z")


def _to_number(text):
    """Lua's tonumber for the decimal forms the site file uses."""
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else value


def parse_config(text):
    conf = dict(DEFAULTS)
    for line in (text or "").split("\n"):
        stripped = line.split("#", 1)[0].strip()
        match = re.match(r"^([A-Za-z0-9_\-]+)\s*=\s*(.*)\Z", stripped)
        if not match:
            continue
        key = match.group(1).lower().replace("-", "_")
        value = match.group(2)
        if key not in DEFAULTS:
            continue
        if key in _BOOLEAN:
            conf[key] = value.lower() in ("1", "yes", "true", "on")
        elif key in _NUMBER:
            number = _to_number(value)
            conf[key] = DEFAULTS[key] if number is None else number
        else:
            conf[key] = value
    return conf


def _is_set(value):
    return isinstance(value, (int, float)) and value < NO_VAL


def count_gpus(tres):
    """GPUs in a TRES string; returns (count, type or None when untyped or mixed)."""
    if not tres:
        return 0, None
    total, gpu_type, mixed = 0, None, False
    for item in tres.split(","):
        item = re.sub(r"^gres[:/]", "", item.strip())
        match = re.match(r"^([A-Za-z0-9]+)[:=]?(.*)\Z", item, re.S)
        if not match or match.group(1) != "gpu":
            continue
        rest = match.group(2)
        kind = None
        typed = re.match(r"^([^:=]+)[:=]([0-9]+)\Z", rest)
        if typed:
            kind, count = typed.group(1), typed.group(2)
        elif re.match(r"^([0-9]+)\Z", rest):
            count = rest
        elif rest == "":
            count = "1"
        else:
            kind, count = rest, "1"
        total += int(count)
        if kind is not None:
            if gpu_type is not None and gpu_type != kind:
                mixed = True
            gpu_type = kind
    return total, (None if mixed else gpu_type)


def count_shards(tres):
    """Untyped shards in a TRES string (a typed shard names its GPU already: not counted)."""
    if not tres:
        return 0
    total = 0
    for item in tres.split(","):
        item = re.sub(r"^gres[:/]", "", item.strip())
        match = re.match(r"^([A-Za-z0-9]+)[:=]?(.*)\Z", item, re.S)
        if not match or match.group(1) != "shard":
            continue
        rest = match.group(2)
        if rest == "":
            total += 1
        elif re.match(r"^[0-9]+\Z", rest):
            total += int(rest)
    return total


def gpu_request(job):
    """(request dict or None, reason or None), like the Lua's two return values."""
    nodes = job.get("min_nodes") if _is_set(job.get("min_nodes")) else 1
    nodes = max(nodes, 1)
    per_node, per_node_type = count_gpus(job.get("tres_per_node"))
    if per_node > 0:
        return {"gpus_per_node": per_node, "nodes": nodes, "form": "tres_per_node", "gpu_type": per_node_type}, None
    per_job, per_job_type = count_gpus(job.get("tres_per_job"))
    if per_job > 0:
        if per_job % nodes:
            return None, "gpus per job not divisible by nodes"
        return {"gpus_per_node": per_job // nodes, "nodes": nodes, "form": "tres_per_job", "gpu_type": per_job_type}, None
    per_task, _ = count_gpus(job.get("tres_per_task"))
    if per_task > 0:
        tasks = job.get("num_tasks") if _is_set(job.get("num_tasks")) else 1
        if tasks % nodes:
            return None, "tasks not divisible by nodes"
        return {"gpus_per_node": per_task * tasks // nodes, "nodes": nodes, "form": "tres_per_task", "gpu_type": None}, None
    shards = count_shards(job.get("tres_per_node"))
    if shards > 0 and nodes == 1:
        return {"gpus_per_node": 1, "nodes": 1, "form": "tres_per_node", "gpu_type": None, "shards": shards}, None
    return None, None


def should_handle(job, conf, now=None):
    """(True, request) or (False, reason)."""
    request, why = gpu_request(job)
    if request is None:
        return False, why or "no gpu"
    if job.get("array_inx"):
        return False, "job array"
    if _is_set(job.get("het_job_offset")):
        return False, "heterogeneous job"
    if job.get("dependency"):
        return False, "dependency"
    if _is_set(job.get("begin_time")) and job["begin_time"] > (time.time() if now is None else now):
        return False, "begin time set by the user"
    if job.get("reservation"):
        return False, "reservation"
    if job.get("req_nodes") and not conf["handle_nodelist"]:
        return False, "explicit nodelist"
    if job.get("shared") == 0 and not conf["handle_exclusive"]:
        return False, "explicit exclusive"
    if request["gpu_type"] and _INDEX_TYPE.match(request["gpu_type"]):
        return False, "already pinned to a gpu index"
    return True, request


def opted_out(env, comment):
    """Twin of ``horus.opted_out``: the production reader is :func:`slurm_horus.jobclass.opted_out`."""
    return jobclass.opted_out(env, comment)


def left_message(job, submit_uid, why):
    """The notification for horusd when a GPU job is left to Slurm, as a dict (the Lua sends it as
    one JSON line); None for a job that asks for no GPU."""
    gpus = sum(count_gpus(job.get(k))[0] for k in ("tres_per_node", "tres_per_job", "tres_per_task"))
    if gpus == 0:
        return None
    message = {"op": "left", "uid": submit_uid, "user": job.get("user_name"), "reason": why}
    return {k: v for k, v in message.items() if v is not None}


def ended_message(job_id):
    """The notification for horusd when a job ended (EpilogSlurmctld's ``SLURM_JOB_ID``), as a
    dict; None when that is not a job id."""
    digits = re.fullmatch(r"[ \t\n\r\f\v]*([0-9]+)[ \t\n\r\f\v]*", "" if job_id is None else str(job_id))
    value = int(digits.group(1)) if digits else 0
    return {"op": "ended", "job_id": value} if 0 < value < 2 ** 32 else None


def offer_fits(job, request, conf):
    """Whether a job may take a published offer: one untyped GPU on one node, no partition named."""
    return (conf["offers"] is True and request["gpus_per_node"] == 1 and request["nodes"] == 1
            and request.get("gpu_type") is None and request.get("shards") is None and not job.get("partition"))


def parse_kv(line):
    """The key=value;... reply as a dict; (None, why) when malformed or not ok."""
    if not isinstance(line, str) or line == "":
        return None, "empty reply"
    reply = {}
    for pair in line.split(";"):
        if pair == "":
            continue
        match = re.match(r"^([A-Za-z0-9_]+)=(.*)\Z", pair, re.S)
        if not match:
            return None, "malformed reply"
        reply[match.group(1)] = match.group(2)
    if reply.get("ok") != "1":
        return None, "not ok: " + str(reply.get("error", "nil"))
    return reply, None


def _check_token_fields(reply):
    if not reply.get("id") or not _SAFE_ID.match(reply["id"]):
        return "bad id"
    if "class" in reply and not _SAFE_CLASS.match(reply["class"]):
        return "bad class"
    if "mode" in reply and not re.match(r"^[A-Za-z]+\Z", reply["mode"]):
        return "bad mode"
    if "slowdown" in reply and not re.match(r"^[0-9]+\.?[0-9]*\Z", reply["slowdown"]):
        return "bad slowdown"
    if "gpulist" in reply and not re.match(r"^[A-Za-z0-9\-.:+,]+\Z", reply["gpulist"]):
        return "bad gpulist"
    for field in ("micro_batch", "grad_accum"):
        if field in reply and not re.match(r"^[0-9]+\Z", reply[field]):
            return "bad " + field
    return None


def parse_reply(line, conf):
    """Parse the key=value reply; (reply dict, None) or (None, why)."""
    reply, why = parse_kv(line)
    if reply is None:
        return None, why
    if reply.get("action") == "unchanged":
        return reply, None
    if reply.get("action") == "keep":
        return parse_keep(reply)
    if reply.get("action") != "place":
        return None, "unknown action"
    if not reply.get("nodes") or not _SAFE_NODES.match(reply["nodes"]):
        return None, "bad nodes"
    if not reply.get("tres") or not _SAFE_TRES.match(reply["tres"]):
        return None, "bad tres"
    bad = _check_token_fields(reply)
    if bad:
        return None, bad
    if "partition" in reply and not _SAFE_ID.match(reply["partition"]):
        return None, "bad partition"
    age = float(reply["age"]) if re.match(r"^[0-9]+\.?[0-9]*\Z", reply.get("age", "")) else None
    if age is None or age > conf["max_state_age_s"]:
        return None, "stale state"
    return reply, None


def parse_confirm(line, claimed):
    """horusd's answer to {"op": "confirm"} for a horus-sbatch decision; (reply, None) or (None, why)."""
    reply, why = parse_kv(line)
    if reply is None:
        return None, why
    if reply.get("action") != "confirm":
        return None, "decision %s not confirmed" % claimed
    if reply.get("id") != claimed:
        return None, "confirmed another decision"
    bad = _check_token_fields(reply)
    if bad:
        return None, bad
    return reply, None


def gres_prefix(job):
    """``gres:`` or ``gres/``: how the job's own request spells GRES (the Slurm it came from), else None."""
    for name in ("tres_per_node", "tres_per_job", "tres_per_task"):
        value = job.get(name)
        if isinstance(value, str):
            match = re.match(r"^(gres[:/])", value)
            if match:
                return match.group(1)
    return None


def respell_tres(tres, prefix):
    """``tres`` with every comma-separated item spelled with ``prefix`` (None: unchanged)."""
    if prefix is None or not isinstance(tres, str):
        return tres
    return ",".join(prefix + re.sub(r"^gres[:/]", "", item) for item in tres.split(",") if item)


def parse_keep(reply):
    bad = _check_token_fields(reply)
    if bad:
        return None, bad
    tres = reply.get("tres", "")
    if not (re.match(r"^gres[:/]shard:1\Z", tres) or re.match(r"^gres[:/]gpu:[0-9]+\Z", tres)):
        return None, "bad kept tres"
    lease = int(reply["lease"]) if re.match(r"^[0-9]+\Z", reply.get("lease", "")) else None
    if lease is None or lease < 1 or lease > 3600:
        return None, "bad lease"
    return reply, None


def _set_tres_per_node(job, tres):
    job["tres_per_node"] = respell_tres(tres, gres_prefix(job))
    if job.get("tres_per_job"):
        job["tres_per_job"] = ""
    if job.get("tres_per_task"):
        job["tres_per_task"] = ""


def _add_token(job, token):
    previous = job.get("admin_comment")
    job["admin_comment"] = previous + " " + token if previous else token
    return token


def keep(job, reply, now=None):
    """Keep ``job`` (a dict) for horusd; returns the token."""
    _set_tres_per_node(job, reply["tres"])
    job["begin_time"] = int(time.time() if now is None else now) + int(reply["lease"])
    return _add_token(job, "horus:%s mode=kept class=%s" % (reply["id"], reply.get("class", "unknown")))


def apply(job, reply):
    """Rewrite ``job`` (a dict) in place; returns the admin_comment token."""
    job["req_nodes"] = reply["nodes"]
    _set_tres_per_node(job, reply["tres"])
    if reply.get("partition"):
        job["partition"] = reply["partition"]
    if reply.get("micro_batch") and job.get("environment") is not None:
        job["environment"]["HORUS_MICRO_BATCH"] = reply["micro_batch"]
        job["environment"]["HORUS_GRAD_ACCUM"] = reply.get("grad_accum") or "1"
    return append_token(job, reply)


def append_token(job, reply):
    token = "horus:%s mode=%s slowdown=%s class=%s" % (reply["id"], reply.get("mode", "exclusive"),
                                                       reply.get("slowdown", "1.00"), reply.get("class", "unknown"))
    if reply.get("gpulist"):
        token += " gpus=" + reply["gpulist"]
    if reply.get("micro_batch"):
        token += " micro_batch=%s grad_accum=%s" % (reply["micro_batch"], reply.get("grad_accum") or "1")
    return _add_token(job, token)


def breaker_allows(breaker, now, heartbeat=None, conf=None):
    """(True, None), or (False, why) while the circuit breaker is open (``breaker``: a dict with
    ``timeouts``, ``open_s`` and ``until_s`` while open, ``asked_at``). Past the open period, the
    try waits while ``heartbeat`` (when horusd last wrote its offers header) is stale, but never
    longer than ``breaker_max_open_s`` since the last ask."""
    if breaker.get("until_s") is None:
        return True, None
    if now < breaker["until_s"]:
        return False, "circuit open"
    if (heartbeat is not None and conf is not None and now - heartbeat > conf["max_offer_age_s"]
            and now - breaker.get("asked_at", 0) < conf["breaker_max_open_s"]):
        return False, "circuit open: horusd silent"
    return True, None


def offers_generated(text):
    """When horusd last wrote its offers file (its header's ``generated=``), or None."""
    if not isinstance(text, str):
        return None
    found = re.search(r";generated=([0-9]+\.?[0-9]*)\Z", text.split("\n", 1)[0])
    return float(found.group(1)) if found else None


def is_timeout(err):
    return isinstance(err, str) and "timeout" in err


def breaker_after(breaker, timed_out, now, conf):
    """Update ``breaker`` after an ask that did (``timed_out``) or did not time out."""
    if not timed_out:
        breaker["timeouts"] = 0
        breaker.pop("open_s", None)
        breaker.pop("until_s", None)
        return breaker
    breaker["timeouts"] = breaker.get("timeouts", 0) + 1
    if breaker.get("until_s") is not None:  # the try after an open period failed too
        breaker["open_s"] = min(2 * breaker["open_s"], conf["breaker_max_open_s"])
        breaker["until_s"] = now + breaker["open_s"]
    elif breaker["timeouts"] >= conf["breaker_timeouts"]:
        breaker["open_s"] = conf["breaker_open_s"]
        breaker["until_s"] = now + breaker["open_s"]
    return breaker


def find_offer(text, job_class, now, conf, spent=0, awaiting=None, taken_version=None, taken=None):
    """The offer for ``job_class`` in horusd's offers file: (reply, version, joint) or (None, why).
    Versions up to ``spent`` may not be taken (job_submit.lua: the one it took, or the one horusd's
    last reply named), nor any until the header's ``claimed=`` shows the claim of offer ``awaiting``;
    except the joint offer (one of the header's ``joint=K`` first lines) of a class not in ``taken``
    from the version ``taken_version`` the script took a joint offer from last."""
    if not isinstance(text, str) or text == "":
        return None, "no offers"
    header, sep, rest = text.partition("\n")
    if not sep:
        return None, "no offers"
    version = re.match(r"^version=([0-9]+);", header)
    version = version.group(1) if version else None
    generated = offers_generated(header)
    if version is None or generated is None:
        return None, "malformed offers"
    if now - generated > conf["max_offer_age_s"]:
        return None, "stale offers"
    joint = re.search(r";joint=([0-9]+);", header)
    joint = int(joint.group(1)) if joint else 0
    together = taken_version is not None and version == taken_version
    if together:
        if taken and job_class in taken:
            return None, "offer taken"
    else:
        if int(version) <= (spent or 0):
            return None, "offers spent"
        claimed = re.search(r";claimed=([A-Za-z0-9\-_]*);", header)
        if awaiting is not None and (claimed.group(1) if claimed else None) != awaiting:  # Lua: "" is true
            return None, "claim not seen yet"
    index = 0
    for line in re.findall(r"[^\n]+", rest):
        index += 1
        match = re.match(r"^([^\t]+)\t(.*)\Z", line, re.S)
        if match and match.group(1) == job_class:
            if together and index > joint:
                return None, "offer not joint"
            reply, why = parse_reply(match.group(2), conf)
            if reply is None:
                return None, why
            if reply.get("action") != "place":
                return None, "no offer"
            return reply, version, index <= joint
    return None, "no offer for " + job_class
