"""``horus-sbatch``: sbatch with interference-aware placement the user can see and override.

``horus-sbatch [sbatch options] [horus options] script [args]`` reads the job the way sbatch will,
asks horusd where it should run, and submits it with the real sbatch: unchanged when horus has
nothing to add (no GPUs, the user chose nodes, horusd silent, ...), otherwise with the binding on the
command line and an explained header in the script. Output and exit code are sbatch's own.

horus-sbatch's own options (taken out before sbatch runs; only before the script name):
``--horus-class NAME``, ``--horus-model NAME``, ``--horus-batch-size N``, ``--horus-off``,
``--dry-run`` (print what would be submitted, submit nothing) and ``--explain`` (print the
candidates horusd weighed, on stderr).

Only the standard library is imported on the way to an unchanged submission, and no more of it
than needed; jinja2 is loaded only when a script is rewritten.
"""

import os
import sys

from .options import NONE, REQUIRED, split_options, without
from .text import one_line

HORUS_OPTIONS = {
    "horus-class": REQUIRED, "horus-model": REQUIRED, "horus-batch-size": REQUIRED,
    "horus-off": NONE, "dry-run": NONE, "explain": NONE,
}
HORUS_HELP = """
horus-sbatch options (before the script name; everything else goes to sbatch unchanged):
      --horus-class=NAME      job class for the interference model (also: #HORUS --class NAME)
      --horus-model=NAME      model hint, e.g. resnet50 (also: #HORUS --model NAME)
      --horus-batch-size=N    batch-size hint (also: #HORUS --batch-size N)
      --horus-off             submit the job untouched (also: #HORUS --off)
      --dry-run               print the decision, the sbatch command and the script; submit nothing
      --explain               print the candidates horusd considered and why the winner won
"""
WRAP_HEADER = b"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n"


class Submission:
    """Exactly what will be run: ``sbatch`` + ``argv``, with ``script`` written to a private file
    named like the user's (``script_index`` is its place in argv) or fed on stdin."""

    def __init__(self, argv):
        self.argv = list(argv)
        self.script = None          # bytes to submit instead of the user's file; None: the file as is
        self.script_index = None    # argv position of the script path, when script is written to a file
        self.script_name = None     # basename of that file (keeps sbatch's default job name)
        self.stdin_script = None    # bytes fed to sbatch on stdin (script read from stdin / --wrap)
        self.environment = {}       # variables added to sbatch's environment
        self.decision = None
        self.decision_reply = None
        self.why_unchanged = ""
        self.translate_parsable = False

    def shown_argv(self):
        argv = ["sbatch"] + self.argv
        if self.script_index is not None:
            argv[self.script_index + 1] = "$TMPDIR/horus-sbatch-XXXXXX/" + self.script_name
        return argv

    def submitted_script(self, original):
        if self.stdin_script is not None:
            return self.stdin_script
        return self.script if self.script is not None else original


def _quote(word):
    if word and all(c.isalnum() or c in "_-.,:/=+@%$" for c in word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def _which(name, environ):
    if "/" in name:
        return name
    for directory in environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _script_path(name, environ):
    """The file sbatch will read for ``name``: the name itself when it holds a ``/`` or names a file
    in the current directory, otherwise the first readable match on PATH (as sbatch does)."""
    if "/" in name or os.path.isfile(name):
        return name
    for directory in environ.get("PATH", "").split(os.pathsep):
        if directory:
            candidate = os.path.join(directory, name)
            if os.path.isfile(candidate) and os.access(candidate, os.R_OK):
                return candidate
    return name


class _Invocation:
    """The user's command split into sbatch's part and horus-sbatch's part."""

    def __init__(self, argv, environ):
        self.argv = list(argv)
        self.environ = environ
        self.options, self.rest = split_options(self.argv, extra_long=HORUS_OPTIONS)
        self.option_words = self.argv[:len(self.argv) - len(self.rest)]
        self.horus = {}
        for option in self.options:
            if option.name and option.name.startswith("horus:"):
                self.horus[option.name[len("horus:"):]] = option.value
        self.sbatch_options = [o for o in self.options if not (o.name or "").startswith("horus:")]

    def words_without(self, drop=lambda option: False):
        return without(self.option_words, self.options,
                       lambda o: (o.name or "").startswith("horus:") or drop(o))

    def given(self, name):
        return any(o.name == name for o in self.sbatch_options)

    def last(self, name):
        value = None
        for option in self.sbatch_options:
            if option.name == name:
                value = option.value
        return value


class BadHorusOption(Exception):
    """A horus-sbatch option (or #HORUS line, or HORUS_* variable) with a value that cannot be used:
    one line on stderr, exit 1 (as sbatch does for a bad option), nothing submitted."""


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _check_setting(key, value, where):
    """The value of a class, model or batch-size setting, or BadHorusOption naming ``where``."""
    if key in ("class", "model"):
        if not value or not set(value) <= _NAME_CHARS:
            raise BadHorusOption(f"{where}: {value!r} is not a job {key} name (letters, digits, '.', '_' and '-'; "
                                 "`horus model classes` lists the classes the model knows)")
    elif key == "batch-size":
        if not value.isdigit() or int(value) < 1:
            raise BadHorusOption(f"{where}: {value!r} is not a batch size (a whole number from 1)")
    return value


def _horus_settings(directives, invocation, environ, warn, location="script"):
    """Job class, hints and the off switch: #HORUS lines < HORUS_* environment < command line.
    A value that cannot be used raises BadHorusOption."""
    settings = {}
    names = {"--class": "class", "--model": "model", "--batch-size": "batch-size", "--off": "off"}
    for words, lineno in directives.horus:
        index = 0
        while index < len(words):
            word = words[index]
            name, has_value, value = word.partition("=")
            key = names.get(name)
            if key is None:
                warn(f"line {lineno}: unknown #HORUS option {word!r} ignored")
            elif key == "off":
                settings["off"] = True
            elif has_value:
                settings[key] = _check_setting(key, value, f"{location}: line {lineno}: #HORUS {name}")
            elif index + 1 < len(words):
                settings[key] = _check_setting(key, words[index + 1], f"{location}: line {lineno}: #HORUS {name}")
                index += 1
            else:
                warn(f"line {lineno}: #HORUS {name} needs a value")
            index += 1
    for variable, key in (("HORUS_CLASS", "class"), ("HORUS_MODEL", "model"),
                          ("HORUS_BATCH_SIZE", "batch-size")):
        if environ.get(variable):
            settings[key] = _check_setting(key, environ[variable], variable)
    for option_key, key in (("horus-class", "class"), ("horus-model", "model"),
                            ("horus-batch-size", "batch-size")):
        if option_key in invocation.horus and invocation.horus[option_key] is not None:
            settings[key] = _check_setting(key, invocation.horus[option_key], f"--{option_key}")
    if "horus-off" in invocation.horus:
        settings["off"] = True
    return settings


def _read_script(invocation, environ, stdin):
    """(script bytes, file name or None, why not) for the job: the file, stdin, or --wrap's
    command in the wrapper script sbatch itself would write."""
    wrap = invocation.last("wrap")
    rest = invocation.rest
    if wrap is not None:
        if rest:
            return None, None, "script arguments with --wrap (sbatch says why)"
        return WRAP_HEADER + wrap.encode("utf-8", "surrogateescape") + b"\n", None, None
    if rest[:1] == [":"]:
        return None, None, "heterogeneous jobs are left to Slurm"
    words = rest[1:] if rest[:1] == ["--"] else rest
    if not words:
        return (stdin or sys.stdin.buffer).read(), None, None
    try:
        with open(_script_path(words[0], environ), "rb") as handle:
            return handle.read(), os.path.basename(words[0]) or "script", None
    except (OSError, ValueError):  # ValueError: a NUL in the name
        return None, None, "the script cannot be read (sbatch says why)"


def _why_not_place(directives, settings, view):
    if settings.get("off"):
        return "horus is switched off for this job (--horus-off)"
    if not directives.shebang:
        return "the script has no #! line (sbatch says why)"
    if directives.error:
        return f"sbatch will reject the directives ({directives.error})"
    if directives.is_het:
        return "heterogeneous jobs are left to Slurm"
    return view.leave_alone_reason()


def plan(invocation, environ, say, config, stdin=None, asker=None):
    """Decide what to submit; ``say`` prints one stderr line; ``config`` is the site configuration
    (None when it could not be loaded). Returns (Submission, the user's script bytes or None)."""
    unchanged = Submission(invocation.words_without() + invocation.rest)
    script, script_name, why_not = _read_script(invocation, environ, stdin)
    if why_not:
        unchanged.why_unchanged = why_not
        return unchanged, None
    wrap = invocation.last("wrap")
    if wrap is None and script_name is None:
        unchanged.stdin_script = script

    from .job import JobView
    from .script import read_directives

    directives = read_directives(script)
    location = "--wrap" if wrap is not None else (script_name or "stdin")
    settings = _horus_settings(directives, invocation, environ, lambda text: say(f"{location}: {text}"), location)
    view = JobView(directives.components[0], environ, invocation.sbatch_options)
    if settings.get("off"):
        # job_submit.lua reads it from the job's environment: the job is left to Slurm, never shared
        unchanged.environment["HORUS_OFF"] = "1"
        unchanged.argv = invocation.words_without() + _export_option(view, unchanged.environment) + invocation.rest
    why_not = _why_not_place(directives, settings, view)
    if why_not or config is None:
        unchanged.why_unchanged = why_not or "the site configuration is unusable"
        return unchanged, script

    try:
        from _sha1 import sha1
    except ImportError:
        from hashlib import sha1

    job_name = view.value("job-name") or ("wrap" if wrap is not None else (script_name or "sbatch"))
    hints = {}
    if settings.get("model"):
        hints["HORUS_MODEL"] = settings["model"]
    if settings.get("batch-size"):
        hints["HORUS_BATCH_SIZE"] = settings["batch-size"]
    dry_run = "dry-run" in invocation.horus or invocation.given("test-only")
    request = view.request(job_name, sha1(script).hexdigest(), settings.get("class"), hints,
                           "explain" in invocation.horus, dry_run)
    if asker is None:
        from ..service.protocol import ask as asker
    # users reach horusd through its peer-checked user socket (the controller socket is 0600)
    user_socket = config.socket + ".user"
    reply = asker(request, user_socket, config.timeout_ms / 1000.0)
    if reply is None:
        # e.g. a login node, far from horusd's Unix socket: job_submit.lua in slurmctld still asks
        # horusd, and reads the job class from the job's environment
        say(f"no answer from horusd at {user_socket} within {config.timeout_ms:g} ms; job submitted "
            "without a preview (job_submit.lua may still place it)")
        carried = {name: value for name, value in (("HORUS_CLASS", settings.get("class")),
                                                   ("HORUS_MODEL", settings.get("model")),
                                                   ("HORUS_BATCH_SIZE", settings.get("batch-size"))) if value}
        if carried:
            unchanged.environment.update(carried)
            unchanged.argv = (invocation.words_without() + _export_option(view, unchanged.environment)
                              + invocation.rest)
        unchanged.why_unchanged = "horusd did not answer"
        return unchanged, script
    unchanged.decision_reply = reply
    _say_unknown_class(reply, settings.get("class"), hints, say)
    if reply.get("action") != "place":
        reason = one_line(reply.get("reason"))
        unchanged.why_unchanged = "horusd leaves this job to Slurm" + (f": {reason}" if reason else "")
        return unchanged, script

    from .rewrite import Decision

    try:
        decision = Decision(reply)
    except ValueError as exc:
        say(f"horusd's answer could not be used ({exc}); job submitted without placement")
        unchanged.why_unchanged = "horusd's answer was unusable"
        return unchanged, script
    submission = _placed(invocation, environ, view, script, directives, decision, settings, hints)
    submission.decision_reply = reply
    submission.script_name = script_name
    rewritten = submission.script
    if wrap is not None or script_name is None:
        submission.script, submission.stdin_script = None, rewritten
    else:
        words = invocation.rest
        if words[:1] == ["--"]:
            submission.argv.append("--")
            words = words[1:]
        submission.script_index = len(submission.argv)
        submission.argv += words
    return submission, script


def _say_unknown_class(reply, job_class, hints, say):
    """One line when the class the user named is not one the interference model knows (with the
    closest known names horusd sent), saying what that means for the job."""
    if reply.get("class_known") is not False or not (job_class or hints.get("HORUS_MODEL")):
        return
    named = one_line(str(reply.get("class") or job_class))
    suggestions = reply.get("class_suggestions") if isinstance(reply.get("class_suggestions"), list) else []
    close = ", ".join(one_line(str(s)) for s in suggestions[:3] if isinstance(s, str))
    effect = "it is not shared with other jobs" if reply.get("mode") in (None, "exclusive") else \
        "the model can only guess how it shares"
    say(f"unknown job class '{named}'" + (f" (did you mean {close}?)" if close else "")
        + f": {effect}; `horus model classes` lists the known classes")


def _placed(invocation, environ, view, script, directives, decision, settings, hints):
    """The submission that binds the job where ``decision`` says (script not yet placed in argv)."""
    from .rewrite import binding_options, exports, insert_header, render_header, replaced_on_command_line

    binding = binding_options(decision, view)
    replaced = replaced_on_command_line(decision)
    words = invocation.words_without(lambda o: replaced(o) or o.name == "wrap")
    user_parsable = view.given("parsable")
    submission = Submission(([] if user_parsable else ["--parsable"]) + words + binding)
    submission.translate_parsable = not user_parsable
    submission.decision = decision
    if (invocation.last("wrap") is not None and not invocation.given("job-name")
            and "SBATCH_JOB_NAME" not in environ):
        submission.argv.append("--job-name=wrap")
    header = render_header(decision, binding, directives, settings.get("class"), hints)
    submission.script = insert_header(script, directives, header)
    if not directives.is_shell:
        submission.environment = dict(exports(decision))
    # job_submit.lua reads the decision id from the job's environment and has horusd confirm it,
    # so the job carries the same horus:<id> token in admin_comment as a job placed by the Lua
    submission.environment["HORUS_DECISION"] = decision.decision_id
    submission.argv += _export_option(view, submission.environment)
    return submission


def _export_option(view, variables):
    """job_submit.lua reads HORUS_* from the job's environment, which holds only what ``--export``
    lets through: when the user narrowed it (``--export=NONE`` or a list), add ours to that list."""
    value = view.value("export")
    if value is None or not variables or value.split(",")[0].strip().upper() == "ALL":
        return []
    return [f"--export={value}," + ",".join(f"{name}={variables[name]}" for name in sorted(variables))]


def explain_lines(submission):
    reply = submission.decision_reply or {}
    lines = []
    if submission.decision is not None:
        lines.append(f"decision {submission.decision.summary()}")
        if submission.decision.micro_batch is not None:
            lines.append(f"sub-batching: {submission.decision.micro_batch} samples per step, gradients accumulated "
                         f"over {submission.decision.grad_accum or 1} steps (HORUS_MICRO_BATCH, HORUS_GRAD_ACCUM)")
    else:
        lines.append(f"job left to Slurm: {submission.why_unchanged}")
    candidates = reply.get("candidates") if isinstance(reply.get("candidates"), list) else []
    if candidates:
        total, gpus = reply.get("candidates_total"), reply.get("gpus_total")
        counted = ""
        if isinstance(total, int) and isinstance(gpus, int) and not isinstance(total, bool):
            counted = f": {total} of {gpus} GPUs" + (f", the best {len(candidates)} listed" if total > len(candidates)
                                                       else "")
        lines.append(f"candidates considered{counted} (predicted slowdown of this job; of the job already there):")
        for candidate in candidates:
            if not isinstance(candidate, dict):
                continue
            where = one_line(str(candidate.get("node", "?")))
            gpus = candidate.get("gpus", candidate.get("gpu"))
            if isinstance(gpus, list):
                where += " GPU " + one_line(",".join(str(g) for g in gpus))
            elif gpus is not None:
                where += " GPU " + one_line(str(gpus))
            slowdown = candidate.get("predicted_slowdown")
            worst = candidate.get("corunner_slowdown", candidate.get("worst_corunner_slowdown"))
            note = one_line(candidate.get("why") or candidate.get("reason") or candidate.get("note") or "")
            chosen = "  <- chosen" if candidate.get("chosen") else ""
            lines.append(f"  {where:<16} {_fmt(slowdown):>6} {_fmt(worst):>6}  {note}{chosen}".rstrip())
    if one_line(reply.get("reason")):
        lines.append(f"why: {one_line(reply.get('reason'))}")
    return lines


def _fmt(value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.2f}"
    return "-"


def print_dry_run(submission, original, out):
    write = out.write
    write(b"horus-sbatch --dry-run: nothing was submitted.\n")
    for line in explain_lines(submission):
        write(f"# {line}\n".encode("utf-8", "backslashreplace"))
    for name, value in sorted(submission.environment.items()):
        write(f"environment: {name}={value}\n".encode())
    write(("command: " + " ".join(_quote(w) for w in submission.shown_argv()) + "\n").encode(
        "utf-8", "surrogateescape"))
    script = submission.submitted_script(original)
    if script is not None:
        source = "stdin" if submission.stdin_script is not None else "file"
        write(f"script ({source}, {len(script)} bytes):\n".encode())
        write(script)
        if script and not script.endswith(b"\n"):
            write(b"\n")


def submit(submission, sbatch, environ):
    """Run sbatch; print what it prints (``N[;cluster]`` turned back into sbatch's sentence when the
    user did not ask for --parsable); return its exit status.

    An unchanged submission simply becomes sbatch (exec). Otherwise sbatch is started with
    posix_spawn and plain pipes, which costs less start-up time than importing subprocess.
    """
    env = dict(environ)
    env.update(submission.environment)
    if (submission.script is None and submission.stdin_script is None
            and not submission.translate_parsable):
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sbatch, ["sbatch"] + submission.argv, env)
    argv = list(submission.argv)
    directory = None
    try:
        if submission.script is not None:
            directory = _private_directory(environ)
            path = os.path.join(directory, submission.script_name)
            with open(path, "wb") as handle:
                handle.write(submission.script)
            argv[submission.script_index] = path
        return _spawn(sbatch, ["sbatch"] + argv, env, submission.stdin_script,
                      submission.translate_parsable)
    finally:
        if directory is not None:
            for name in os.listdir(directory):
                os.unlink(os.path.join(directory, name))
            os.rmdir(directory)


def _private_directory(environ):
    base = environ.get("TMPDIR") or "/tmp"
    while True:
        path = os.path.join(base, f"horus-sbatch-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue


def _spawn(program, argv, env, stdin_bytes, translate):
    actions = []
    stdin_read = stdin_write = out_read = out_write = None
    if stdin_bytes is not None:
        stdin_read, stdin_write = os.pipe()
        actions += [(os.POSIX_SPAWN_DUP2, stdin_read, 0), (os.POSIX_SPAWN_CLOSE, stdin_write)]
    if translate:
        out_read, out_write = os.pipe()
        actions += [(os.POSIX_SPAWN_DUP2, out_write, 1), (os.POSIX_SPAWN_CLOSE, out_read)]
    sys.stdout.flush()
    pid = os.posix_spawn(program, argv, env, file_actions=actions)
    for descriptor in (stdin_read, out_write):
        if descriptor is not None:
            os.close(descriptor)
    if stdin_bytes is not None:
        try:
            with open(stdin_write, "wb") as pipe:
                pipe.write(stdin_bytes)
        except BrokenPipeError:
            pass
    if translate:
        out = sys.stdout.buffer
        with open(out_read, "rb") as pipe:
            for line in pipe:
                out.write(_sentence(line) or line)
                out.flush()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _sentence(line):
    """``1234`` / ``1234;cluster`` -> sbatch's own ``Submitted batch job ...`` line, else None."""
    text = line.rstrip(b"\n")
    job, _, cluster = text.partition(b";")
    if not job.isdigit():
        return None
    sentence = b"Submitted batch job " + job
    if cluster:
        sentence += b" on cluster " + cluster
    return sentence + b"\n"


def main(argv=None, environ=None):
    try:
        return _main(argv, environ)
    except BrokenPipeError:
        _closed_output()


def _main(argv, environ):
    argv = sys.argv[1:] if argv is None else list(argv)
    environ = os.environ if environ is None else environ

    def say(text):
        sys.stderr.write(f"horus-sbatch: {text}\n")
        sys.stderr.flush()

    from ..config import load_config
    from ..errors import HorusError

    invocation = _Invocation(argv, environ)
    try:
        config = load_config(environ=environ)
        sbatch_name = config.sbatch
    except HorusError as exc:
        say(f"site configuration unusable ({exc}); jobs are submitted without placement")
        config, sbatch_name = None, environ.get("HORUS_SBATCH") or "sbatch"
    sbatch = _which(sbatch_name, environ)
    if sbatch is None:
        say(f"{sbatch_name} not found on PATH")
        return _exit(127)
    if any(o.name == "version" for o in invocation.sbatch_options):
        from importlib.metadata import PackageNotFoundError, version

        try:
            own = version("slurm-horus")
        except PackageNotFoundError:
            own = "unknown"
        sys.stdout.write(f"horus-sbatch (slurm-horus) {own}\n")
        return _exit(_spawn(sbatch, ["sbatch", "--version"], dict(environ), None, False))
    if any(o.name in ("help", "usage") for o in invocation.sbatch_options):
        if not any(o.name == "help" for o in invocation.sbatch_options):
            os.execv(sbatch, ["sbatch"] + invocation.words_without() + invocation.rest)
        status = _spawn(sbatch, ["sbatch", "--help"], dict(environ), None, False)
        sys.stdout.write(HORUS_HELP)
        return _exit(status)
    try:
        submission, original = plan(invocation, environ, say, config)
    except BadHorusOption as exc:
        say(str(exc))
        return _exit(1)
    if "dry-run" in invocation.horus:
        print_dry_run(submission, original, sys.stdout.buffer)
        return _exit(0)
    if "explain" in invocation.horus:
        for line in explain_lines(submission):
            say(line)
    try:
        return _exit(submit(submission, sbatch, environ))
    except KeyboardInterrupt:
        return _exit(130)


def _exit(status):
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _closed_output()
    sys.exit(status)


def _closed_output():
    """The reader of our output went away (``horus-sbatch --dry-run ... | head``): stop quietly, as
    shell tools do (exit 141 = 128 + SIGPIPE), with no traceback at interpreter exit either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(141)
