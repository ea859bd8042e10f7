"""Turn horusd's decision into what is submitted: the sbatch argv and the rewritten script.

The binding goes on the command line, because sbatch lets command-line options outrank ``#SBATCH``
lines: ``--nodelist``, ``--gres`` (typed GPU or shard, plus any non-GPU GRES the user asked for),
and ``--gpus=0``-style options that cancel the user's other GPU spellings still present in the
script or the ``SBATCH_*`` environment (verified on 22.05: ``--gpus=0`` leaves only the typed
``--gres``). The user's own GPU options on the command line are taken out.

The script gets a header (``templates/sbatch_header.sh.j2``) that repeats the binding as
``#SBATCH`` lines, exports ``HORUS_*`` variables and explains the choice. The header is inserted
where the directive block ends (just before the first command): an ``export`` line right after the
shebang would be a command, and sbatch would then ignore every ``#SBATCH`` line of the user's.
Every byte of the original is kept, in order; the header uses the script's line ending.
"""

import re

from .job import GPU_COUNT_OPTIONS, GPU_GRES_NAMES, gres_items
from .text import one_line

_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_GRES = re.compile(r"^[A-Za-z0-9_.:/,()-]*$")
_DECISION_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_BINDINGS = ("indexed", "shard", "node")


class Decision:
    """A checked ``place`` reply: every value that reaches the script is validated here."""

    def __init__(self, reply):
        nodes = reply.get("nodes")
        if not isinstance(nodes, list) or not nodes or not all(
                isinstance(n, str) and _NODE.match(n) for n in nodes):
            raise ValueError(f"bad nodes {nodes!r}")
        self.nodes = nodes
        self.binding = reply.get("binding") or "indexed"
        if self.binding not in _BINDINGS:
            raise ValueError(f"bad binding {self.binding!r}")
        tres = reply.get("tres") or ""
        if not isinstance(tres, str) or not _GRES.match(tres) or \
                any(not item.startswith(("gres:", "gres/")) for item in tres.split(",") if tres):
            raise ValueError(f"bad tres {tres!r}")
        # sbatch's --gres spelling of the reply's tres_per_node (gres:shard:g2:1, or gres/shard:g2:1 as
        # horusd spells it for 23.02+, -> shard:g2:1)
        self.gres = "" if self.binding == "node" else ",".join(item[len("gres:"):] for item in tres.split(",") if tres)
        if self.binding != "node" and not self.gres:
            raise ValueError(f"binding {self.binding} without gres")
        self.decision_id = str(reply.get("id") or "")
        if not _DECISION_ID.match(self.decision_id):
            raise ValueError(f"bad id {self.decision_id!r}")
        # shareable: alone on a GPU shard for now (binding shard), a well-matched job may join it
        self.mode = {"exclusive": "exclusive", "shared": "shared", "shareable": "shared via shard, alone for now"}.get(
            reply.get("mode"), "")
        self.predicted_slowdown = _number(reply, "slowdown", float, 0.0, 1000.0)
        self.mps_percentage = _number(reply, "mps_thread_percentage", int, 1, 100)
        self.micro_batch = _number(reply, "micro_batch", int, 1, 1 << 30)
        self.grad_accum = _number(reply, "grad_accum", int, 1, 1 << 20)
        self.gpus = reply.get("gpus") or {}
        if not isinstance(self.gpus, dict) or not all(
                isinstance(node, str) and _NODE.match(node) and isinstance(indexes, list)
                and all(isinstance(i, int) and not isinstance(i, bool) for i in indexes)
                for node, indexes in self.gpus.items()):
            raise ValueError(f"bad gpus {self.gpus!r}")
        self.corunners = reply.get("corunner_slowdowns") if isinstance(
            reply.get("corunner_slowdowns"), dict) else {}
        self.reason = one_line(reply.get("reason"))
        self.job_class = one_line(reply.get("class"))
        self.candidates = reply.get("candidates") if isinstance(reply.get("candidates"), list) else []

    def summary(self):
        where = ",".join(self.nodes)
        gpu_text = "; ".join(
            f"{node} GPU {','.join(str(i) for i in indexes)}" for node, indexes in sorted(self.gpus.items()))
        text = f"{self.decision_id}: {gpu_text or where}"
        if self.gres:
            text += f" (--gres={self.gres})"
        if self.mode:
            text += f", {self.mode}"
        if self.predicted_slowdown is not None:
            text += f", predicted slowdown {self.predicted_slowdown:.2f}x"
        return text


def _number(reply, key, kind, low, high):
    value = reply.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"bad {key} {value!r}")
    value = kind(value)
    if not low <= value <= high:
        raise ValueError(f"{key} {value} out of range")
    return value


def binding_options(decision, view):
    """The options that pin the job where horusd decided, in command-line spelling.

    The user's own GPU spellings left in the script or the environment are cancelled with ``=0``,
    except ``--gpus-per-node``: sbatch 26.05 refuses it beside ``--gres=gpu`` (even as ``=0``), so
    whole GPUs are then named with it (``--gpus-per-node=g1:1,g3:1``, which the command line lets
    outrank the script's), on every Slurm version alike.
    """
    options = ["--nodelist=" + ",".join(decision.nodes)]
    if decision.binding == "node":
        return options
    forms = view.gpu_forms()
    left_behind = [name for name in GPU_COUNT_OPTIONS if name in forms and any(
        o.name == name for layer in view.layers[:2] for o in layer)]
    gres = [text for name, _, _, text in gres_items(decision.gres)]
    per_node = []
    if "gpus-per-node" in left_behind and "gres" not in forms:
        per_node = [text[len("gpu:"):] for name, _, _, text in gres_items(decision.gres) if name == "gpu"]
        gres = [text for name, _, _, text in gres_items(decision.gres) if name != "gpu"]
    user_gres = view.effective.get("gres")
    if user_gres is not None:
        gres += [text for name, _, _, text in gres_items(user_gres.value) if name not in GPU_GRES_NAMES]
    if gres:
        options.append("--gres=" + ",".join(gres))
    if per_node:
        options.append("--gpus-per-node=" + ",".join(per_node))
    options += [f"--{name}=0" for name in left_behind if not (per_node and name == "gpus-per-node")]
    return options


def replaced_on_command_line(decision):
    """Which of the user's command-line options the binding replaces."""
    if decision.binding == "node":
        return lambda option: option.name == "nodelist"
    return lambda option: option.name in GPU_COUNT_OPTIONS + ("gres", "nodelist")


def exports(decision):
    pairs = [("HORUS_DECISION", decision.decision_id)]
    if decision.predicted_slowdown is not None:
        pairs.append(("HORUS_PREDICTED_SLOWDOWN", f"{decision.predicted_slowdown:.2f}"))
    if decision.mps_percentage is not None:
        pairs.append(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(decision.mps_percentage)))
    if decision.micro_batch is not None:
        pairs.append(("HORUS_MICRO_BATCH", str(decision.micro_batch)))
    if decision.grad_accum is not None:
        pairs.append(("HORUS_GRAD_ACCUM", str(decision.grad_accum)))
    return pairs


def explanation(decision, job_class, hints):
    lines = [f"Placed on {decision.summary()[len(decision.decision_id) + 2:]}."]
    known = decision.job_class or job_class or "unknown"
    hint_text = ", ".join(f"{k[len('HORUS_'):].lower().replace('_', ' ')} {one_line(v)}"
                          for k, v in sorted(hints.items()))
    lines.append(f"Job class: {one_line(known)}" + (f" (hints: {hint_text})." if hint_text else "."))
    if decision.corunners:
        others = ", ".join(f"job {one_line(str(k))} -> {v:.2f}x" for k, v in sorted(decision.corunners.items())
                           if isinstance(v, (int, float)) and not isinstance(v, bool))
        if others:
            lines.append(f"Predicted effect on the jobs already there: {others}.")
    if decision.reason:
        lines.append(f"Why: {decision.reason}")
    if decision.micro_batch is not None or decision.grad_accum is not None:
        lines.append("This job shares a GPU's memory: run HORUS_MICRO_BATCH samples per step and "
                     "accumulate gradients over HORUS_GRAD_ACCUM steps, so the effective "
                     "batch size is unchanged.")
    lines.append("Command-line options outrank these #SBATCH lines; horus-sbatch passed them there too.")
    return lines


def _shell_quote(value):
    if value and re.match(r"^[A-Za-z0-9_.,:/+=@%-]+$", value):
        return value
    return "'" + value.replace("'", "'\"'\"'") + "'"


def render_header(decision, binding, directives, job_class, hints):
    """The header bytes (jinja2 is imported only here: unchanged submissions never pay for it)."""
    import jinja2

    from ..resources import resource_dir

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
        keep_trailing_newline=True, undefined=jinja2.StrictUndefined, autoescape=False)
    environment.filters["sh"] = _shell_quote
    text = environment.get_template("sbatch_header.sh.j2").render(
        decision_id=decision.decision_id, explanation=explanation(decision, job_class, hints),
        binding=binding, exports=exports(decision), shell=directives.is_shell)
    data = text.encode("ascii", "backslashreplace")
    if directives.newline != b"\n":
        data = data.replace(b"\n", directives.newline)
    return data


def insert_header(script, directives, header):
    """``script`` with ``header`` inserted where the directive block ends."""
    at = directives.block_end
    head = script[:at]
    if head and not head.endswith(b"\n"):
        head += directives.newline
    return head + header + script[at:]
