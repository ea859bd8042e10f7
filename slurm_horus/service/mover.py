"""What horusd does to the jobs it keeps, in Slurm: start them where the cycle placed them, renew their
lease, let them all go (kill switch). Every change is an ``scontrol update`` (slurm/control.py).

How a kept job is moved was measured on 22.05.8 (docs/horusd.md, "The queue"). A typed request
cannot be moved cleanly: moving ``gpu:g0`` to ``gpu:g2`` gave the job GPUs 0 *and* 2, and moving
``shard:g0`` to ``shard:g1`` made Slurm count a shard of both GPUs while the job ran and leak the
``g0`` one when it ended (that shard then stays "used" until slurmctld restarts). So jobs are kept
untyped and typed only once, when they start:

* a kept shard (``gres:shard:1``): ``TresPerNode=`` then ``TresPerNode=gres:shard:g3:1 NodeList=n2
  StartTime=now`` (typing an untyped request in place is refused: "with and without type
  identification"). Between the two updates the job asks for no GPU; both travel in one scontrol
  process, one RPC apart, and a shard job found without a GPU request is given its shard back
  (:meth:`Mover.restore`, run by horusd after a failed move and for any it finds at a refresh that
  is not one of its own moves under way). The first update also renews the lease (``StartTime=now+L``),
  so that a job whose lease ran out cannot start in between;
* kept whole GPUs (``gres:gpu:N`` per node): ``TresPerNode= TresPerJob=gres:gpu:N`` (the job still
  asks for its GPUs if horusd stops right there), then ``TresPerJob= TresPerNode=gres:gpu:g1:1,
  gres:gpu:g3:1 NodeList=n1 StartTime=now``: the job ran on exactly GPUs 1 and 3, nothing leaked;
* with the ``node`` binding only the node list is set, and Slurm picks the GPUs on that node.

The same moves hold on 24.11 and 26.05 (measured: docs/slurm-versions.md), spelled ``gres/`` there:
each request is written in the spelling of the reply it applies (``slurm.gres.spelling_of``).

All the moves of one cycle go through one scontrol (its stdin form); the job starts 0.1-0.4 s later
(an update makes slurmctld schedule at once). The placed token goes into AdminComment afterwards,
one scontrol each (a token holds spaces, which only scontrol's argv form keeps).
"""

import logging

from ..slurm.control import update_job, update_many
from ..slurm.gres import parse_gres, spelling_of
from ..slurm.runner import SlurmCommandError
from ..tokens import format_token, replace_token

log = logging.getLogger("horusd")

RENEW_CHUNK = 500  # job ids per scontrol line


def _start_lines(move, hold_s=None):
    """The scontrol updates that start one kept job where the cycle placed it. With ``hold_s``, the
    first of two updates also pushes the job's begin time that far ahead: were its lease over (a
    renewal late on a starved machine), Slurm could otherwise start it between the two, as it is then
    (a shard job asking for no GPU at all)."""
    kept, reply = move.kept, move.reply
    job = [kept.job_id]
    final = {}
    if reply.binding != "node":
        final["TresPerNode"] = reply.tres
    final["NodeList"] = ",".join(reply.nodes)
    if reply.partition:
        final["Partition"] = reply.partition
    final["StartTime"] = "now"
    if reply.binding == "node":
        return [(job, final)]
    hold = {"StartTime": f"now+{int(hold_s)}"} if hold_s else {}
    if any(item.name == "shard" for item in parse_gres(reply.tres)):
        return [(job, {"TresPerNode": "", **hold}), (job, final)]
    prefix = spelling_of(reply.tres)
    return [(job, {"TresPerNode": "", "TresPerJob": f"{prefix}gpu:{kept.request.n_gpus}", **hold}),
            (job, {"TresPerJob": "", **final})]


def kept_tres(request, prefix="gres:"):
    """The kept shape of a kept job's request (replies.kept_shape, read back)."""
    return f"{prefix}shard:1" if not request.exclusive else f"{prefix}gpu:{request.gpus_per_node}"


class Mover:
    def __init__(self, slurm_conf=None, timeout_s=10.0):
        self.slurm_conf = slurm_conf
        self.timeout_s = timeout_s

    def start(self, moves, hold_s=None):
        """Apply the cycle's moves; returns the decision ids Slurm refused (horusd forgets them).
        ``hold_s``: the lease, renewed by the first of a move's two updates (:func:`_start_lines`)."""
        if not moves:
            return []
        lines = [line for move in moves for line in _start_lines(move, hold_s)]
        refused = update_many(lines, slurm_conf=self.slurm_conf, timeout=max(self.timeout_s, 0.05 * len(lines)))
        failed = [m for m in moves if int(m.kept.job_id) in refused]
        if failed:
            log.warning("horus: Slurm refused to start kept jobs %s", ",".join(m.kept.job_id for m in failed))
            self.restore([(m.kept.job_id, kept_tres(m.kept.request, spelling_of(m.reply.tres))) for m in failed])
        for move in moves:
            if move in failed:
                continue
            kept, reply = move.kept, move.reply
            token = format_token(reply.id, reply.mode, reply.job_class, reply.slowdown, reply.gpulist,
                                 reply.micro_batch, reply.grad_accum)
            try:
                update_job(kept.job_id, {"AdminComment": replace_token(kept.admin_comment, kept.decision_id, token)},
                           slurm_conf=self.slurm_conf, timeout=self.timeout_s)
            except SlurmCommandError as exc:  # started, but its token still says kept
                log.warning("horus: kept job %s started, its token not updated: %s", kept.job_id, exc)
            log.info("horus: decision job=%s class=%s action=start nodes=%s tres=%s slowdown=%s expected_s=%.0f: "
                     "%s (kept as %s)", kept.job_id, reply.job_class, ",".join(reply.nodes), reply.tres, reply.slowdown,
                     kept.request.expected_duration(), reply.reason, kept.decision_id)
        return [m.reply.id for m in failed]

    def restore(self, shapes):
        """Give kept jobs ``[(job id, kept tres)]`` their kept shape back (a move half done)."""
        update_many([([job_id], {"TresPerJob": "", "TresPerNode": tres}) for job_id, tres in shapes],
                    slurm_conf=self.slurm_conf, timeout=self.timeout_s)

    def renew(self, job_ids, lease_s):
        """Push the begin time of every kept job ``lease_s`` ahead (one scontrol, one RPC per job)."""
        return self._all(job_ids, f"now+{int(lease_s)}")

    def release(self, job_ids):
        """Let Slurm start every kept job on its own now (kill switch)."""
        return self._all(job_ids, "now")

    def _all(self, job_ids, start_time):
        ids = list(job_ids)
        chunks = [(ids[i:i + RENEW_CHUNK], {"StartTime": start_time}) for i in range(0, len(ids), RENEW_CHUNK)]
        return update_many(chunks, slurm_conf=self.slurm_conf, timeout=max(self.timeout_s, 0.01 * len(ids)))
