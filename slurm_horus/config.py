"""Site configuration: one file, environment variables, command-line flags.

Precedence is flag > ``HORUS_<NAME>`` environment variable > site file > built-in default.
The site file is ``/etc/horus/horus.conf`` unless ``HORUS_CONFIG`` points elsewhere; its format is
``name = value`` lines with ``#`` comments (names are case-insensitive, ``-`` and ``_`` alike).
An unknown key or a value of the wrong type is a :class:`ConfigError` that names the key (and the
file:line it came from).
"""

import os

from .errors import ConfigError

DEFAULT_CONFIG_FILE = "/etc/horus/horus.conf"


def parse_bool(text):
    """The project's one reader of a yes/no value (site settings, policy options)."""
    lowered = text.strip().lower()
    if lowered in ("1", "yes", "true", "on"):
        return True
    if lowered in ("0", "no", "false", "off"):
        return False
    raise ValueError(f"expected yes/no, got {text!r}")


def _parse_positive_float(text):
    value = float(text)
    if not value > 0:
        raise ValueError(f"expected a positive number, got {text!r}")
    return value


def _parse_fraction(text):
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"expected a number between 0 and 1, got {text!r}")
    return value


def _parse_choice(*choices):
    def parse(text):
        value = text.strip()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return value

    return parse


class Setting:
    """One site setting. A plain class: horus-sbatch loads this module on every submission, and
    dataclasses (with inspect) and pathlib cost more start-up time than the whole module."""

    __slots__ = ("name", "parse", "default", "help")

    def __init__(self, name, parse, default, help):
        self.name = name
        self.parse = parse
        self.default = default
        self.help = help

    def __repr__(self):
        return f"Setting({self.name!r}, default={self.default!r})"


SETTINGS = {
    s.name: s
    for s in [
        Setting("db", str, "/var/lib/horus/horus.db", "SQLite history database"),
        Setting("socket", str, "/run/horus/horusd.sock", "horusd's Unix socket"),
        Setting("tcp", str, "", "optional host:port horusd also listens on (empty: none)"),
        Setting("policy", str, "horus", "placement policy used by horusd and horus-sbatch"),
        Setting("gpu_type", lambda t: t.strip().lower(), "v100",
                "GPU model of nodes whose features name none (indexed GRES types g0..gN say no model)"),
        Setting("binding", _parse_choice("indexed", "shard", "node"), "indexed",
                "how a decision is bound to the job: per-GPU GRES types, typed shards, or node only"),
        Setting("timeout_ms", _parse_positive_float, 100.0,
                "how long job_submit.lua and horus-sbatch wait for horusd"),
        Setting("refresh_s", _parse_positive_float, 2.0, "how often horusd re-reads sinfo/squeue"),
        Setting("refit_s", float, 3600.0,
                "horusd refits the model from the history database this often (seconds; 0: never)"),
        Setting("learn_pairs", parse_bool, True,
                "every 5 minutes horusd derives the pairs measured by recent jobs and counts them as "
                "measured (no: only what a refit or a reload finds)"),
        Setting("offers", parse_bool, True,
                "horusd publishes its next placement per job class and job_submit.lua takes one "
                "without a round trip (no: every GPU job asks horusd)"),
        Setting("max_offer_age_s", _parse_positive_float, 3.0,
                "job_submit.lua ignores offers older than this (horusd rewrites them every second)"),
        Setting("breaker_timeouts", int, 3,
                "job_submit.lua stops asking horusd after this many asks in a row timed out ..."),
        Setting("breaker_open_s", _parse_positive_float, 5.0,
                "... for this long, then tries one ask; each try that times out doubles the pause ..."),
        Setting("breaker_max_open_s", _parse_positive_float, 60.0, "... up to this long"),
        Setting("max_state_age_s", _parse_positive_float, 60.0,
                "job_submit.lua ignores a decision made on a cluster state older than this"),
        Setting("handle_exclusive", parse_bool, False, "job_submit.lua also places --exclusive jobs"),
        Setting("handle_nodelist", parse_bool, False, "job_submit.lua also places jobs with --nodelist"),
        Setting("queue", parse_bool, True,
                "horusd keeps the GPU jobs it cannot place at submission and places them itself when "
                "GPUs free (no: such jobs are left to Slurm)"),
        Setting("lease_s", _parse_positive_float, 30.0,
                "a job horusd keeps waits at most this long for horusd (a begin time horusd renews); "
                "then Slurm starts it on its own (seconds, 5 to 3600)"),
        Setting("cycle_s", _parse_positive_float, 2.0,
                "horusd runs its scheduling cycle over the jobs it keeps at least this often"),
        Setting("max_jobs_per_gpu", int, 2, "most jobs that may share one GPU"),
        Setting("slowdown_limit", _parse_positive_float, 1.5,
                "largest predicted slowdown a job may be given by sharing"),
        Setting("share_unknown", parse_bool, False, "may jobs of an unknown class share a GPU"),
        Setting("min_share_confidence", _parse_fraction, 0.0,
                "only share when the model's answer comes from a source at least this trusted"),
        Setting("duration_levels", _parse_choice("fixed", "measured"), "measured",
                "the order horusd's duration estimator tries its histories in: measured (best correlated "
                "with the run times first, once two levels have each estimated 20 finished jobs of the "
                "history store; user+class, class, user, site until then) or fixed (always that order)"),
        Setting("duration_recent", _parse_choice("end", "start"), "end",
                "which runs of a history are its most recent ones, the ones the duration estimator takes "
                "the median of: end (those that ended last) or start (those that started last: a long job "
                "ending now started long ago)"),
        Setting("log_level", _parse_choice("debug", "info", "warning", "error"), "info", "log level"),
        Setting("sbatch", str, "sbatch",
                "the real sbatch that horus-sbatch runs (a path, or a name looked up on PATH)"),
        Setting("controller_host", str, "",
                "the SlurmctldHost whose slurmctld this horusd serves; with a backup controller only the "
                "horusd beside the one in control answers (empty: this host's short name)"),
        Setting("ship_to", str, "",
                "URL of the sample receiver (horus receive) collectors ship to, e.g. http://head:8910 "
                "(empty: collectors write the db directly)"),
        Setting("receive_listen", str, "0.0.0.0:8910", "host:port that horus receive listens on"),
        Setting("munge_socket", str, "",
                "munged's socket for shipping credentials (empty: munge's default, /run/munge/munge.socket.2)"),
        Setting("ship_users", str, "root",
                "users (names or uids, comma-separated) whose collectors horus receive accepts samples from"),
        Setting("ship_nodes", str, "",
                "file of 'node address...' lines: the hosts each node's samples may come from "
                "(empty: the node's NodeAddr and NodeHostname in Slurm)"),
        Setting("raw_days", float, 14.0,
                "horus receive deletes raw GPU samples older than this many days (0: keep all); the rollups "
                "that reports and the model read stay"),
        Setting("disable_file", str, "/etc/horus/disabled",
                "kill switch: while this file exists job_submit.lua leaves every job alone"),
    ]
}


def _canonical(name):
    return name.strip().lower().replace("-", "_")


def parse_config_file(path):
    """Read a site file into {name: (raw_value, 'file:line')}; unknown keys are errors."""
    values = {}
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.split("#", 1)[0].strip()
        if not stripped:
            continue
        if "=" not in stripped:
            raise ConfigError(f"{path}:{lineno}: expected 'name = value', got {line.strip()!r}")
        key, raw = stripped.split("=", 1)
        name = _canonical(key)
        if name not in SETTINGS:
            raise ConfigError(f"{path}:{lineno}: unknown setting {key.strip()!r}")
        values[name] = (raw.strip(), f"{path}:{lineno}")
    return values


class Config:
    """Resolved settings; attribute access (``config.db``) and ``config.source(name)``."""

    def __init__(self, values, sources):
        self._values = values
        self._sources = sources

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def source(self, name):
        return self._sources[name]

    def as_dict(self):
        return dict(self._values)


def load_config(flags=None, environ=None, path=None):
    """Resolve every setting. ``flags`` holds command-line values (None = not given)."""
    environ = os.environ if environ is None else environ
    flags = {(_canonical(k)): v for k, v in (flags or {}).items() if v is not None}
    for name in flags:
        if name not in SETTINGS:
            raise ConfigError(f"unknown setting {name!r}")
    explicit_path = path or environ.get("HORUS_CONFIG")
    config_path = explicit_path or DEFAULT_CONFIG_FILE
    from_file = {}
    if explicit_path or os.path.exists(config_path):
        from_file = parse_config_file(config_path)
    values, sources = {}, {}
    for name, setting in SETTINGS.items():
        env_key = "HORUS_" + name.upper()
        if name in flags:
            raw, where = flags[name], f"--{name.replace('_', '-')}"
        elif env_key in environ:
            raw, where = environ[env_key], env_key
        elif name in from_file:
            raw, where = from_file[name]
        else:
            values[name], sources[name] = setting.default, "default"
            continue
        try:
            values[name] = setting.parse(raw) if isinstance(raw, str) else raw
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: bad value for {name!r}: {exc}") from None
        sources[name] = where
    return Config(values, sources)

