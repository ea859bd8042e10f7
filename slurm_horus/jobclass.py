"""A job's class: the one reader, for horusd, the history ingest, the demo and (twinned) job_submit.lua.

A class names what a job runs (``resnet50-bs64``): the interference model predicts pairs of classes,
so a job must be keyed the same way when horusd places it and when the history learns from it. The
class comes from, first to last:

1. the ``class=`` field of the job's ``horus:`` token in AdminComment (what the decision used;
   users cannot set AdminComment);
2. the ``HORUS_CLASS`` hint (the job's environment);
3. the class horus-sbatch was given (``--horus-class``, ``#HORUS --class``);
4. ``HORUS_MODEL`` (+ ``HORUS_BATCH_SIZE``) hints: ``resnet50`` + ``64`` -> ``resnet50-bs64``;
5. a ``class=NAME`` (or ``horus_class=NAME``) word in the job's comment.

Anything else, or a name with other characters than letters, digits, ``_ . -``, is
:data:`UNKNOWN_CLASS` (a job of unknown class runs exclusive). job_submit.lua's ``horus.job_class``
is the twin of steps 2, 4 and 5 (it sees no token and no horus-sbatch class), held against this
function by ``tests/test_lua_twin.py``. Pure: no imports from the rooms but the token reader.
"""

import re

from .tokens import parse_horus_tokens

UNKNOWN_CLASS = "unknown"
SAFE_CLASS = re.compile(r"^[A-Za-z0-9_.\-]+\Z")
_WORD = re.compile(r"[^\s,;]+")


def _class_in_comment(comment):
    """The first ``class=NAME`` / ``horus_class=NAME`` word (words are split on spaces, ``,`` and ``;``),
    as the Lua reads it: the name is the leading run of class characters."""
    for word in _WORD.findall(comment or ""):
        for prefix in ("horus_class=", "class="):
            if word.startswith(prefix):
                found = re.match(r"[A-Za-z0-9_.\-]+", word[len(prefix):])
                if found:
                    return found.group(0)
    return None


def job_class_of(hints=None, requested=None, comment=None, admin_comment=None):
    """The class of a job from what is known of it (see the module docstring for the order)."""
    if admin_comment:
        _decision, fields = parse_horus_tokens(admin_comment)
        token_class = fields.get("class")
        if token_class and SAFE_CLASS.match(token_class):
            return token_class
    hints = hints or {}
    name = hints.get("HORUS_CLASS") or (requested if requested != UNKNOWN_CLASS else None)
    if not name and hints.get("HORUS_MODEL"):
        name = str(hints["HORUS_MODEL"]).lower()
        if hints.get("HORUS_BATCH_SIZE"):
            name += f"-bs{hints['HORUS_BATCH_SIZE']}"
    if not name:
        name = _class_in_comment(comment)
    if not name or not SAFE_CLASS.match(str(name)):
        return UNKNOWN_CLASS
    return str(name)


def opted_out(hints=None, comment=None):
    """The user opted out of horus (horus-sbatch ``--horus-off``): ``HORUS_OFF`` true in the job's
    environment, or ``horus=off`` (or ``no``) among the words of the comment. job_submit.lua leaves
    such a job untouched (its twin: ``horus.opted_out``), horusd answers it unchanged: never shared."""
    off = (hints or {}).get("HORUS_OFF")
    if off is not None and str(off).strip().lower() in ("1", "yes", "true", "on"):
        return True
    for word in _WORD.findall(comment or ""):
        match = re.match(r"^horus=([A-Za-z]+)\Z", word)
        if match and match.group(1).lower() in ("off", "no"):
            return True
    return False
