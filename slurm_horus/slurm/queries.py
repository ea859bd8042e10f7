"""Ask Slurm: run a CLI with ``--json`` and parse it. Used by the local cluster and by horusd.

``slurm_conf=None`` uses the caller's ``SLURM_CONF`` (or Slurm's default), as on a real site; ``env``
replaces the caller's environment (a local cluster's puts its Slurm's commands first on PATH).
"""

from .parse import jobs_from_doc, nodes_are_grouped, nodes_from_doc, parse_ping, parse_sacct
from .openapi import document_version, loads
from .runner import run_slurm
from .version import SlurmVersion

SINFO = ("sinfo", "--json")
# 22.05's squeue --json lists every job slurmctld still holds, finished ones too (for MinJobAge);
# 24.11 and later list only pending and running ones unless asked for all states. horusd needs the
# finished ones: a placed job that ended between two refreshes ends its ledger entry by its token.
# 22.05 gives the same output with the option as without (checked on 22.05.8).
SQUEUE = ("squeue", "--json", "--states=all")
SCONTROL_NODES = ("scontrol", "--json", "show", "nodes")


class SlurmSource:
    """Reads nodes and jobs of one cluster, whatever its Slurm version.

    Nodes come from ``sinfo --json`` until an answer groups them (Slurm 23.02 and later), then from
    ``scontrol --json show nodes`` (one record per node, and one call less for slurmctld to answer
    than sinfo's). :attr:`version` is the version the last document named (its ``meta``).
    """

    def __init__(self, slurm_conf=None, timeout=10.0, env=None):
        self.slurm_conf = slurm_conf
        self.timeout = timeout
        self.env = env
        self.version = None
        self.nodes_argv = SINFO

    def _document(self, argv, key=None):
        text = run_slurm(list(argv), slurm_conf=self.slurm_conf, timeout=self.timeout, env=self.env).stdout
        doc = loads(text, argv[0], key)
        self.version = document_version(doc) or self.version
        return doc

    def nodes(self):
        """[NodeInfo] of every node."""
        doc = self._document(self.nodes_argv)
        if nodes_are_grouped(doc):
            self.nodes_argv = SCONTROL_NODES
            doc = self._document(self.nodes_argv)
        return nodes_from_doc(doc, self.nodes_argv[0])

    def jobs(self, job_ids=None):
        """[QueueJob] of every job slurmctld holds (pending, running, and finished within MinJobAge);
        only ``job_ids`` when given."""
        argv = SQUEUE + (("--jobs", ",".join(str(j) for j in job_ids)) if job_ids else ())
        return jobs_from_doc(self._document(argv, "jobs"))


def sinfo(slurm_conf=None, timeout=10.0, env=None):
    """[NodeInfo] of every node."""
    return SlurmSource(slurm_conf, timeout, env).nodes()


def controllers(slurm_conf=None, timeout=10.0, env=None):
    """[ControllerStatus] of every SlurmctldHost, from ``scontrol ping`` (which exits non-zero when
    one is down, and still says which)."""
    return parse_ping(run_slurm(["scontrol", "ping"], slurm_conf=slurm_conf, timeout=timeout, check=False,
                                env=env).stdout)


def squeue(slurm_conf=None, timeout=10.0, env=None, job_ids=None):
    """[QueueJob] of the jobs slurmctld holds; only ``job_ids`` when given."""
    return SlurmSource(slurm_conf, timeout, env).jobs(job_ids)


def slurm_version(slurm_conf=None, timeout=10.0, env=None):
    """The version ``scontrol version`` names (of the commands on PATH); None when it names none."""
    return SlurmVersion.parse(run_slurm(["scontrol", "version"], slurm_conf=slurm_conf, timeout=timeout,
                                        env=env).stdout)


def sacct(job_ids=None, slurm_conf=None, all_users=True, extra_args=(), timeout=30.0, env=None):
    """[AcctJob] from accounting, for ``job_ids`` (default: sacct's default window)."""
    argv = ["sacct", "--json"]
    if all_users:
        argv.append("--allusers")
    if job_ids:
        argv += ["--jobs", ",".join(str(j) for j in job_ids)]
    argv += list(extra_args)
    return parse_sacct(run_slurm(argv, slurm_conf=slurm_conf, timeout=timeout, env=env).stdout)


def submit_batch(args, script, slurm_conf=None, timeout=30.0, env=None):
    """``sbatch --parsable args`` with ``script`` on stdin; return the job id."""
    result = run_slurm(["sbatch", "--parsable", *args], slurm_conf=slurm_conf, timeout=timeout, input=script,
                       env=env)
    return int(result.stdout.strip().split(";")[0])
