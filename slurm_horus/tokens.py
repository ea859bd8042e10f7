"""The ``horus:`` token a decision leaves in a job's AdminComment (and how to read it back).

job_submit.lua appends, separated by a space (never overwriting: jobstats keeps its ``JS1:``
summary there)::

    horus:<decision id> mode=<shared|shareable|exclusive|fraction> slowdown=<predicted> class=<job class> [gpus=<node>:<i>+<j>,...]

``gpus=`` is there for shard jobs, whose GPU index sacct does not record. A job horusd keeps for its
queue carries ``horus:<decision id> mode=kept class=<job class>`` until horusd places it, and then
the token above (same decision id). job_submit.lua writes the tokens at submission (``append_token``
and ``keep`` in job_submit.lua, twins in service/lua_twin.py), horusd writes the placed token of a
kept job with :func:`format_token`; horusd, the ingest, the reports and the demo read them with
:func:`parse_horus_tokens`. Pure functions, no imports from the rooms.
"""

import re

_TOKEN = re.compile(r"(?:^|[\s,])horus:(\S*)")
KEPT_MODE = "kept"
FRACTION_MODE = "fraction"  # a job asking shards, placed on one GPU by capacity (issue 21)


def format_token(decision_id, mode, job_class, slowdown=None, gpulist="", micro_batch=None, grad_accum=None):
    """The token as job_submit.lua writes it (``horus.append_token``; ``slowdown`` as the reply's
    ``%.3f``); a kept job's token has no slowdown and no GPUs. ``micro_batch``/``grad_accum``:
    SJF-BSBF's sub-batching (the job's HORUS_MICRO_BATCH / HORUS_GRAD_ACCUM; :func:`sub_batching`)."""
    token = f"horus:{decision_id} mode={mode}"
    if slowdown is not None:
        token += f" slowdown={slowdown:.3f}" if isinstance(slowdown, float) else f" slowdown={slowdown}"
    token += f" class={job_class}"
    if gpulist:
        token += f" gpus={gpulist}"
    if micro_batch:
        token += f" micro_batch={micro_batch} grad_accum={grad_accum or 1}"
    return token


def sub_batching(fields):
    """(micro_batch, grad_accum) of a token's fields (:func:`parse_horus_tokens`), or None when the
    decision runs the job as submitted (or the fields are not plain positive numbers)."""
    micro, accum = fields.get("micro_batch", ""), fields.get("grad_accum", "1")
    if not (micro.isdigit() and accum.isdigit()) or int(micro) < 1 or int(accum) < 1:
        return None
    return int(micro), int(accum)


def replace_token(admin_comment, decision_id, token):
    """``admin_comment`` with the ``horus:<decision_id>`` token (up to the end) replaced by ``token``;
    appended when it holds none."""
    text = admin_comment or ""
    found = re.search(r"(?:^|\s)horus:" + re.escape(decision_id) + r"(?:\s|\Z)", text)
    if not found:
        return f"{text} {token}" if text else token
    start = found.start() + (1 if text[found.start()].isspace() else 0)
    return text[:start] + token


def parse_horus_tokens(*texts):
    """``horus:`` tokens of comments -> (decision id or None, {key: value}).

    ``horus:h-1a2b class=resnet50-bs64 gpus=n3:2`` gives ``("h-1a2b", {"class": ..., "gpus": ...})``:
    a bare ``horus:ID`` names the decision, ``horus:key=value`` and the ``key=value`` words that
    follow a ``horus:`` token in the same comment are its fields (the first value of a key wins).
    """
    decision_id, fields = None, {}
    for text in texts:
        if not text:
            continue
        match = _TOKEN.search(text)
        if not match:
            continue
        words = text[match.start():].replace(",horus:", " horus:").split()
        for word in words:
            if word.startswith("horus:"):
                word = word[len("horus:"):]
                if word and "=" not in word:
                    decision_id = decision_id or word
                    continue
            if "=" in word:
                key, value = word.split("=", 1)
                if key:
                    fields.setdefault(key, value)
    return decision_id, fields


def gpu_list(gpus):
    """{node: [indices]} -> ``n1:0+1,n2:3`` (the ``gpus=`` field)."""
    return ",".join(f"{node}:{'+'.join(str(i) for i in sorted(indices))}" for node, indices in sorted(gpus.items()))


def parse_gpu_list(text):
    """``n1:0+1,n2:3`` (the ``gpus=`` field) -> [(node, [indices])]; malformed parts are skipped."""
    parsed = []
    for part in (text or "").split(","):
        node, _, indices = part.partition(":")
        numbers = [int(i) for i in indices.split("+") if i.isdigit()]
        if node and numbers:
            parsed.append((node, numbers))
    return parsed
