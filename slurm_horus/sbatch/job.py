"""The job as sbatch will see it: script directives < ``SBATCH_*`` environment < command line.

From that view come the GPU request in all its spellings, the reasons horus must leave a job alone
(the user chose nodes or ``--exclusive``, a het job, an array, no GPUs, ...) and the request sent to
horusd (see :mod:`slurm_horus.service.protocol`).
"""

import os

from .options import Option

# SBATCH_* input variables of sbatch 22.05 that matter here, as the option each one stands for.
ENVIRONMENT_OPTIONS = {
    "SBATCH_ACCOUNT": "account", "SBATCH_ARRAY_INX": "array", "SBATCH_CLUSTERS": "clusters",
    "SBATCH_CONSTRAINT": "constraint", "SBATCH_EXCLUSIVE": "exclusive", "SBATCH_EXPORT": "export",
    "SBATCH_GPUS": "gpus", "SBATCH_GPUS_PER_NODE": "gpus-per-node",
    "SBATCH_GPUS_PER_SOCKET": "gpus-per-socket", "SBATCH_GPUS_PER_TASK": "gpus-per-task",
    "SBATCH_GRES": "gres", "SBATCH_JOB_NAME": "job-name", "SBATCH_PARTITION": "partition",
    "SBATCH_QOS": "qos", "SBATCH_TIMELIMIT": "time",
}
GPU_COUNT_OPTIONS = ("gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket")
GPU_GRES_NAMES = ("gpu",)
SHARING_GRES_NAMES = ("shard", "mps")


def environment_options(environ):
    options = []
    for variable, name in ENVIRONMENT_OPTIONS.items():
        if variable in environ:
            options.append(Option(name, environ[variable], [f"{variable}={environ[variable]}"],
                                  "environment"))
    return options


def gres_items(value):
    """``gpu:a100:2,shard:1`` -> [(name, type, count, text)]; count 1 when not written."""
    items = []
    for text in (value or "").split(","):
        text = text.strip()
        if not text:
            continue
        bare = text
        for prefix in ("gres:", "gres/"):
            if bare.startswith(prefix):
                bare = bare[len(prefix):]
        parts = bare.split(":")
        name, kind, count = parts[0], "", 1
        rest = parts[1:]
        if rest and rest[-1].split("(")[0].isdigit():
            count = int(rest[-1].split("(")[0])
            rest = rest[:-1]
        if rest:
            kind = rest[0]
        items.append((name, kind, count, text))
    return items


def gpu_count(value):
    """``--gpus``-style value ``[type:]N`` -> (type, N); N is 0 when unreadable."""
    kind, _, count = (value or "").rpartition(":")
    try:
        return kind, int(count)
    except ValueError:
        return kind, 0


def time_limit_minutes(value):
    """sbatch's --time forms -> whole minutes (rounded up), None for unlimited or unreadable."""
    if not value or value.lower() in ("infinite", "unlimited", "-1"):
        return None
    days = 0
    text = value
    if "-" in text:
        day_text, text = text.split("-", 1)
        try:
            days = int(day_text)
        except ValueError:
            return None
        fields = [int(f) for f in text.split(":") if f.isdigit()] or [0]
        hours, minutes, seconds = (fields + [0, 0, 0])[:3]
    else:
        try:
            fields = [int(f) for f in text.split(":")]
        except ValueError:
            return None
        if len(fields) == 1:
            hours, minutes, seconds = 0, fields[0], 0
        elif len(fields) == 2:
            hours, minutes, seconds = 0, fields[0], fields[1]
        else:
            hours, minutes, seconds = fields[:3]
    total_seconds = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return -(-total_seconds // 60)


def _first_int(value):
    try:
        return int((value or "").split("-")[0].split(":")[0])
    except ValueError:
        return None


class JobView:
    """Effective options of het component 0 after the three layers, and what they ask for."""

    def __init__(self, script_options, environ, command_line_options):
        self.layers = (list(script_options), environment_options(environ),
                       [o for o in command_line_options if o.name and not o.name.startswith("horus:")])
        self.effective = {}
        for layer in self.layers:
            for option in layer:
                if option.name:
                    self.effective[option.name] = option

    def value(self, name):
        option = self.effective.get(name)
        return None if option is None else option.value

    def given(self, name):
        return name in self.effective

    def gpu_forms(self):
        """The effective options that ask for GPUs, {name: Option}; gres only if it names a GPU."""
        forms = {}
        for name in GPU_COUNT_OPTIONS:
            option = self.effective.get(name)
            if option is not None and gpu_count(option.value)[1] > 0:
                forms[name] = option
        gres = self.effective.get("gres")
        if gres is not None and any(n in GPU_GRES_NAMES and c > 0 for n, _, c, _ in gres_items(gres.value)):
            forms["gres"] = gres
        return forms

    def asks_for_sharing(self):
        gres = self.effective.get("gres")
        return gres is not None and any(n in SHARING_GRES_NAMES for n, _, _, _ in gres_items(gres.value))

    def leave_alone_reason(self):
        """Why horus must not place this job (None if it may)."""
        if self.given("array"):
            return "job arrays are left to Slurm (one binding would pin every task to the same GPU)"
        if self.given("clusters"):
            return "jobs sent to other clusters (--clusters) are left to Slurm"
        if self.given("nodelist") or self.given("nodefile"):
            return "you chose the nodes yourself (--nodelist)"
        if self.given("exclusive"):
            return "you asked for whole nodes (--exclusive)"
        if self.asks_for_sharing():
            return "you asked for GPU shards or MPS yourself (--gres=shard/mps)"
        if not self.gpu_forms():
            return "the job asks for no GPUs"
        return None

    def tres(self):
        """tres_per_node / tres_per_job / tres_per_task / tres_per_socket strings as Slurm shows them."""
        per_node = []
        gres = self.effective.get("gres")
        if gres is not None:
            for name, kind, count, _ in gres_items(gres.value):
                if name in GPU_GRES_NAMES and count > 0:
                    per_node.append(":".join(["gres", name] + ([kind] if kind else []) + [str(count)]))
        result = {}
        for option_name, field in (("gpus-per-node", None), ("gpus", "tres_per_job"),
                                   ("gpus-per-task", "tres_per_task"),
                                   ("gpus-per-socket", "tres_per_socket")):
            option = self.effective.get(option_name)
            if option is None:
                continue
            kind, count = gpu_count(option.value)
            if count <= 0:
                continue
            text = ":".join(["gres", "gpu"] + ([kind] if kind else []) + [str(count)])
            if field is None:
                per_node.append(text)
            else:
                result[field] = text
        if per_node:
            result["tres_per_node"] = ",".join(per_node)
        return result

    def request(self, job_name, script_hash, job_class, hints, explain, dry_run):
        """The ``place`` request for horusd."""
        uid = os.getuid()
        user = self.value("uid") or os.environ.get("USER") or os.environ.get("LOGNAME") or str(uid)
        request = {
            "op": "place", "source": "horus-sbatch", "user": user, "uid": uid,
            "partition": self.value("partition") or "", "job_name": job_name,
            "comment": self.value("comment") or "", "script_hash": script_hash,
            "job_class": job_class or "unknown", "tres_per_node": "", "tres_per_job": "",
            "tres_per_task": "", "num_nodes": _first_int(self.value("nodes")) or 1,
            "num_tasks": _first_int(self.value("ntasks")) or 1,
            "time_limit_min": time_limit_minutes(self.value("time")), "req_nodes": "",
            "exc_nodes": self.value("exclude") or "", "hints": dict(hints),
            "explain": bool(explain), "dry_run": bool(dry_run),
        }
        request.update(self.tres())
        return request
