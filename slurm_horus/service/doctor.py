"""``horus doctor``: read a site's Slurm and horus setup and say what would stop slurm-horus working.

Each check returns (level, message) pairs; ``error`` means slurm-horus cannot place jobs as
configured, ``warning`` means it works but not as well as it could, ``info`` says what was found
(the Slurm version, and what slurm-horus does on it).
"""

import os
import pwd
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path

from ..errors import HorusError
from ..slurm.queries import slurm_version, squeue
from ..slurm.runner import SlurmCommandError
from ..slurm.version import support_lines
from ..tokens import KEPT_MODE, parse_horus_tokens
from . import protocol


def read_slurm_conf(path):
    """slurm.conf as {lower-case key: value} (the last occurrence wins; NodeName lines kept as a list;
    PartitionName lines as ``__partitions__``: one {lower-case key: value} per partition, the
    ``PartitionName=DEFAULT`` values filled in)."""
    values, nodes, partitions, default = {}, [], [], {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        if key.strip().lower() == "nodename":
            nodes.append(line)
        if key.strip().lower() == "partitionname":
            fields = dict((k.lower(), v) for k, _, v in (w.partition("=") for w in line.split()))
            if fields["partitionname"].upper() == "DEFAULT":
                default.update(fields)
            else:
                partitions.append({**{k: v for k, v in default.items() if k != "partitionname"}, **fields})
        values[key.strip().lower()] = value.strip().split()[0] if value.strip() else ""
    values["__nodes__"] = nodes
    values["__partitions__"] = partitions
    return values


def _check_slurm_conf(conf, binding):
    problems = []
    if "lua" not in conf.get("jobsubmitplugins", "").lower():
        problems.append(("error", "slurm.conf: JobSubmitPlugins does not include lua (job_submit.lua is not called)"))
    if conf.get("selecttype", "") != "select/cons_tres":
        problems.append(("error", "slurm.conf: SelectType must be select/cons_tres for GPU placement"))
    gres_types = conf.get("grestypes", "").lower().split(",")
    if "gpu" not in gres_types:
        problems.append(("error", "slurm.conf: GresTypes does not include gpu"))
    if binding == "shard" and "shard" not in gres_types:
        problems.append(("error", "slurm.conf: binding 'shard' needs GresTypes=...,shard"))
    if not any(k in conf for k in ("defmempercpu", "defmempergpu", "defmempernode")):
        problems.append(("warning", "slurm.conf: no DefMemPerCPU/DefMemPerGPU: a job without --mem takes the "
                                    "whole node's memory and no job can share its node"))
    tres = conf.get("accountingstoragetres", "")
    if binding in ("indexed", "shard") and "gres/gpu:g0" not in tres:
        problems.append(("warning", "slurm.conf: AccountingStorageTRES lacks gres/gpu:g0..: sacct will not "
                                    "record which GPU index a job held"))
    if "horus_epilog" not in conf.get("epilogslurmctld", ""):
        problems.append(("info", "slurm.conf: EpilogSlurmctld is not horus_epilog.lua: horusd sees a job's end only "
                                 "at its next squeue read (refresh_s), not at once (docs/admin.md)"))
    return problems


def check_deepboot(conf, inference="infer"):
    """Policy deepboot lends the inference partition's idle GPUs to training and Slurm's preemption
    takes them back (hpc_configs/slurm.conf.deepboot): a preemption plugin, a partition over the
    inference nodes at a lower PriorityTier (partition_prio) whose jobs are requeued, not cancelled,
    and a GraceTime, which signals the job steps at once so they can checkpoint."""
    problems = []
    parts = {p.get("partitionname"): p for p in conf.get("__partitions__", [])}
    preempt_type = conf.get("preempttype", "preempt/none").lower()
    global_mode = conf.get("preemptmode", "OFF").upper()
    if preempt_type not in ("preempt/partition_prio", "preempt/qos"):
        problems.append(("error", f"slurm.conf: PreemptType={preempt_type}: inference cannot take lent GPUs back "
                                  "(use preempt/partition_prio, or preempt/qos with a preemptible QOS)"))
    infer = parts.get(inference)
    if infer is None:
        return problems + [("error", f"slurm.conf: no partition {inference!r}: policy deepboot lends the idle GPUs "
                                     "of the inference partition")]
    if preempt_type == "preempt/qos":
        if "REQUEUE" not in global_mode:
            problems.append(("error", f"slurm.conf: PreemptMode={global_mode}: a reclaimed training job is lost "
                                      "instead of requeued (use PreemptMode=REQUEUE)"))
        return problems  # which QOS preempts which lives in the accounting database (sacctmgr)
    tier = int(infer.get("prioritytier", "1") or 1)
    lenders = [p for name, p in parts.items() if name != inference and p.get("nodes") == infer.get("nodes")
               and int(p.get("prioritytier", "1") or 1) < tier]
    if not lenders:
        problems.append(("error", f"slurm.conf: no partition over {inference!r}'s nodes ({infer.get('nodes')}) at a "
                                  "lower PriorityTier: training cannot borrow inference GPUs preemptibly"))
    for lend in lenders:
        name, mode = lend["partitionname"], lend.get("preemptmode", global_mode).upper()
        if "REQUEUE" not in mode:
            problems.append(("error", f"slurm.conf: partition {name}: PreemptMode={mode}: a reclaimed training job is "
                                      "lost instead of requeued (use PreemptMode=REQUEUE)"))
        if int(lend.get("gracetime", "0") or 0) <= 0:
            problems.append(("warning", f"slurm.conf: partition {name}: no GraceTime: a reclaimed job's steps get no "
                                        "early SIGTERM to checkpoint (only KillWait seconds before SIGKILL)"))
    if conf.get("jobrequeue", "1") == "0":
        problems.append(("warning", "slurm.conf: JobRequeue=0: borrowing jobs must be submitted with --requeue"))
    return problems


def _check_gres_conf(path, binding):
    if not path.exists():
        return [("warning", f"{path} not found")]
    text = path.read_text()
    problems = []
    if binding in ("indexed", "shard"):
        if re.search(r"(?im)^\s*autodetect\s*=\s*nvml", text):
            problems.append(("error", f"{path}: AutoDetect=nvml forces Types to model names; binding "
                                      f"'{binding}' needs one Type per GPU (g0..gN) with AutoDetect=off, "
                                      "or use binding 'node'"))
        if not re.search(r"(?i)type\s*=\s*g0\b", text):
            problems.append(("error", f"{path}: no GPU of Type g0: binding '{binding}' needs per-GPU types g0..gN"))
    if binding == "shard" and not re.search(r"(?im)name\s*=\s*shard", text):
        problems.append(("error", f"{path}: binding 'shard' needs Name=shard lines"))
    return problems


def _check_lua(path):
    if not path.exists():
        return [("error", f"{path} not found: copy job_submit_lua/job_submit.lua beside slurm.conf")]
    problems = []
    if "slurm-horus" not in path.read_text(errors="replace"):
        problems.append(("warning", f"{path} is not slurm-horus's job_submit.lua"))
    luac = shutil.which("luac5.1")
    if luac:
        result = subprocess.run([luac, "-p", str(path)], capture_output=True, text=True)
        if result.returncode != 0:
            problems.append(("error", f"{path} does not compile (slurmctld would refuse to start): "
                                      f"{result.stderr.strip()}"))
    return problems


def _check_socket(config, slurm_user):
    path = config.socket
    if not os.path.exists(path):
        return [("error", f"{path}: horusd socket not found (is horusd running?)")]
    info = os.stat(path)
    problems = []
    if not stat.S_ISSOCK(info.st_mode):
        problems.append(("error", f"{path} is not a socket"))
    if info.st_mode & 0o077:
        problems.append(("error", f"{path}: controller socket is accessible to others (mode "
                                  f"{oct(info.st_mode & 0o777)}); horusd sets 0600"))
    try:
        owner = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        owner = str(info.st_uid)
    if slurm_user and owner != slurm_user:
        problems.append(("warning", f"{path} is owned by {owner}, not SlurmUser {slurm_user}: "
                                    "job_submit.lua inside slurmctld cannot connect"))
    reply = protocol.ask({"op": "ping"}, path, timeout_s=max(config.timeout_ms / 1000, 0.5))
    if reply is None:
        problems.append(("error", f"{path}: horusd did not answer a ping"))
    elif reply.get("state_age_s", 0) > 60:
        problems.append(("warning", f"horusd's cluster state is {reply['state_age_s']:.0f} s old"))
    return problems


def check_offers(config, now=None):
    """With offers on, job_submit.lua reads ``<socket>.offers``: it must exist, be readable by
    slurmctld's user and be fresh, or every GPU job pays the round trip to horusd."""
    if not config.offers:
        return []
    path = config.socket + ".offers"
    try:
        info = os.stat(path)
        with open(path) as offers:
            header = offers.readline()
    except OSError as exc:
        return [("warning", f"{path}: {exc.strerror.lower()}: job_submit.lua asks horusd for every GPU job "
                            "(horusd writes this file while it runs)")]
    problems = []
    if not info.st_mode & 0o004:
        problems.append(("warning", f"{path} is not world-readable (mode {oct(info.st_mode & 0o777)}): "
                                    "slurmctld may not read it"))
    _version, _claimed, generated = protocol.parse_offers_header(header.strip())
    if generated is None:
        problems.append(("warning", f"{path}: no version header: not written by this horusd"))
    else:
        age = (time.time() if now is None else now) - generated
        if age > config.max_offer_age_s:
            problems.append(("warning", f"{path} was written {age:.0f} s ago (horusd rewrites it every second; "
                                        f"job_submit.lua ignores it after {config.max_offer_age_s:g} s)"))
    return problems


def check_slurm_version(slurm_conf):
    """The Slurm version (of the commands on PATH: ``scontrol version``) and what slurm-horus does there."""
    try:
        version = slurm_version(slurm_conf, timeout=10)
    except SlurmCommandError as exc:
        return [("error", f"cannot tell the Slurm version: {exc}")]
    return support_lines(version)


def check_queue(config, jobs, ping=None, now=None):
    """The jobs horusd keeps (squeue's ``mode=kept`` tokens): how many, the oldest, and any kept longer
    than it should be: a begin time past the lease (if horusd stopped, it would wait that long), or a
    job horusd does not count in its queue. ``ping``: horusd's answer (None: it did not answer)."""
    now = time.time() if now is None else now
    kept = [j for j in jobs if j.state == "PENDING" and parse_horus_tokens(j.admin_comment)[1].get("mode") == KEPT_MODE]
    lease = float((ping or {}).get("lease_s") or config.lease_s)
    oldest = max((now - j.submit_time for j in kept if j.submit_time), default=0.0)
    problems = [("info", f"queue: {len(kept)} jobs kept by horusd, the oldest for {oldest:.0f} s (lease {lease:.0f} s)")]
    for job in kept:
        if job.start_time and job.start_time > now + lease + 5:
            until = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(job.start_time))
            problems.append(("warning", f"job {job.job_id} is kept until {until}, past the {lease:.0f} s lease: "
                                        "were horusd to stop, Slurm would not start it before then"))
    if ping is not None and kept:
        known = (ping.get("queue") or {}).get("kept", 0)
        if known < len(kept) and oldest > 3 * float(config.refresh_s) + 5:
            problems.append(("warning", f"squeue shows {len(kept)} kept jobs, horusd's queue {known}"))
    if kept and ping is None:
        problems.append(("warning", f"{len(kept)} kept jobs wait for a horusd that does not answer: Slurm starts "
                                    f"each when its lease runs out"))
    return problems


JOINABLE_WARN = 0.25  # a GPU type where a job may join fewer pair kinds than this gets a warning


def check_sharing(ping):
    """Per GPU type, the share of class pairs a job may join under horusd's ``slowdown_limit`` (its
    ping). Where the model has no pairs measured for a GPU type (A100, H100... are not in the priors)
    its guesses are cautious: the limit keeps most pairs apart, and since pairs are measured only where
    jobs share, the cluster never learns them (docs/horusd.md)."""
    shares = (ping or {}).get("joinable_under_slowdown_limit") or {}
    limit = (ping or {}).get("slowdown_limit")
    problems = []
    for gpu, share in sorted(shares.items()):
        if share < JOINABLE_WARN:
            problems.append(("warning", f"GPU type {gpu}: under slowdown_limit {limit:g} a job may join only "
                                        f"{share:.0%} of the class pairs horusd's model knows (they are predicted, "
                                        f"not measured here): few jobs will share, and pairs are measured only where "
                                        f"jobs share; start with slowdown_limit 2.0 until `horus model-refit` has "
                                        f"learned this cluster's pairs, then lower it (docs/horusd.md)"))
        else:
            problems.append(("info", f"GPU type {gpu}: a job may join {share:.0%} of the class pairs under "
                                     f"slowdown_limit {limit:g}"))
    return problems


def check_horus_config(config):
    """What ``horus serve`` would refuse in the site configuration (the same check it runs)."""
    from ..errors import HorusError
    from .app import check_serve_config

    try:
        check_serve_config(config)
    except HorusError as exc:
        return [("error", f"site configuration: {exc} (horus serve refuses it)")]
    return []


def run_checks(config, slurm_conf=None):
    problems = check_horus_config(config)
    slurm_conf = Path(slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    if not slurm_conf.exists():
        return problems + [("error", f"{slurm_conf} not found (give --slurm-conf or set SLURM_CONF)")]
    conf = read_slurm_conf(slurm_conf)
    problems += check_slurm_version(slurm_conf)
    problems += _check_slurm_conf(conf, config.binding)
    problems += _check_gres_conf(slurm_conf.parent / "gres.conf", config.binding)
    problems += _check_lua(slurm_conf.parent / "job_submit.lua")
    problems += _check_socket(config, conf.get("slurmuser", "root"))
    problems += check_offers(config)
    try:
        jobs = squeue(slurm_conf=str(slurm_conf))
    except HorusError as exc:
        problems.append(("warning", f"squeue: {exc}: the queue horusd keeps is not checked"))
    else:
        ping = protocol.ask({"op": "ping"}, config.socket, timeout_s=max(config.timeout_ms / 1000, 0.5))
        problems += check_queue(config, jobs, ping)
        problems += check_sharing(ping)
    if str(config.policy).split("/", 1)[0] == "deepboot":
        problems += check_deepboot(conf)
    if os.path.exists(config.disable_file):
        problems.append(("warning", f"kill switch {config.disable_file} exists: job_submit.lua asks nobody"))
    return problems
