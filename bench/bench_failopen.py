"""Fail-open storm: sbatch keeps working whatever happens to horusd.

A local cluster with slurmdbd, job_submit.lua and horusd (real Slurm 22.05 daemons). 1,000 held GPU
submissions (``-H``, so nothing runs) in four phases of 250 while horusd is:

1. killed (SIGKILL: its socket file stays, connects are refused);
2. restarted (a new horusd starts while the submissions go on: first no socket, then answers);
3. hung (SIGSTOP: connects succeed, nothing answers; job_submit.lua's deadline must cut it off, and
   after three timeouts its circuit breaker, set here to pause 0.5-1 s, stops asking);
4. answering garbage (horusd is gone and another process on its socket replies with junk lines).

Prints JSON: submissions accepted, jobs counted in sacct (none lost), sbatch wall time per phase
(p50/p99/max), against the limit timeout_ms + 50 ms plus the sbatch time measured with horusd healthy
(the baseline: sbatch itself costs time too). Needs root + the Debian packages; no ../shared data.
"""

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

from slurm_horus.localcluster import LocalCluster
from slurm_horus.localcluster import horus as horus_local


def submit(cluster):
    started = time.perf_counter()
    result = subprocess.run(["sbatch", "--parsable", "-H", "--gres=gpu:1", "--comment=class=lm-bs20",
                             "-o", "/dev/null", "--wrap", "true"], env=cluster.env, capture_output=True, text=True)
    return result.returncode, result.stdout.strip(), (time.perf_counter() - started) * 1000


class GarbageServer:
    """Answers every connection on ``path`` with a junk line."""

    def __init__(self, path):
        if os.path.exists(path):
            os.unlink(path)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(64)
        self.path = path
        self.count = 0
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        junk = [b"ok=1;action=place;nodes=n1;tres=gres:gpu:g0:1\n", b"\x00\xff garbage\n", b"{\"ok\": tru\n",
                b"ok=1;action=place;id=x;nodes=n1 && reboot;tres=gres:gpu:g0:1;age=0\n"]
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            with connection:
                try:
                    connection.recv(65536)
                    connection.sendall(junk[self.count % len(junk)])
                except OSError:
                    pass
            self.count += 1

    def close(self):
        self.server.close()
        os.unlink(self.path)


def horusd_pid(cluster):
    return [d for d in cluster.daemons if d["name"] == "horusd"][-1]["pid"]


def main():
    per_phase = int(sys.argv[1]) if len(sys.argv) > 1 else 250
    # a short circuit-breaker pause (default 5 s, doubling to 60 s): the hung phase trips it, and the
    # garbage phase must still reach the junk server within its few seconds
    cluster = LocalCluster(with_dbd=True, horus=True,
                           horus_settings={"breaker_open_s": "0.5", "breaker_max_open_s": "1"}).up()
    results = {}
    try:
        time.sleep(1.5)
        results["healthy"] = [submit(cluster) for _ in range(50)]

        os.kill(horusd_pid(cluster), signal.SIGKILL)
        time.sleep(0.2)
        results["killed"] = [submit(cluster) for _ in range(per_phase)]

        cluster.daemons = [d for d in cluster.daemons if d["name"] != "horusd"]
        restarter = threading.Thread(target=horus_local.start_horusd, args=(cluster, 60))
        restarter.start()
        results["restarted"] = [submit(cluster) for _ in range(per_phase)]
        restarter.join()

        pid = horusd_pid(cluster)
        os.kill(pid, signal.SIGSTOP)
        results["hung"] = [submit(cluster) for _ in range(per_phase)]
        os.kill(pid, signal.SIGCONT)

        # horusd dies (and job_submit.lua's kept connection with it); another process answers junk
        os.kill(pid, signal.SIGKILL)
        cluster.daemons = [d for d in cluster.daemons if d["name"] != "horusd"]
        time.sleep(0.2)
        garbage = GarbageServer(cluster.horus_socket)
        results["garbage"] = [submit(cluster) for _ in range(per_phase)]
        garbage.close()

        job_ids = {out.split(";")[0] for phase in results.values() for rc, out, _ in phase if rc == 0}
        # slurmctld hands jobs to slurmdbd asynchronously (a backlog of 1,000 takes a while); held
        # jobs are never eligible, so sacct lists them only when asked for by id
        deadline = time.monotonic() + 120
        while True:
            sacct = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID", "-j", ",".join(sorted(job_ids))],
                                   env=cluster.env, capture_output=True, text=True, check=True).stdout.split()
            if len(job_ids & set(sacct)) == len(job_ids) or time.monotonic() > deadline:
                break
            time.sleep(2)
        in_queue = subprocess.run(["squeue", "-h", "-o", "%i"], env=cluster.env, capture_output=True,
                                  text=True, check=True).stdout.split()
        timeout_ms = 100.0
        healthy_p50 = statistics.median(ms for _, _, ms in results["healthy"])
        out = {"benchmark": "fail_open_storm", "timeout_ms": timeout_ms,
               "submissions": sum(len(v) for k, v in results.items() if k != "healthy"),
               "accepted": sum(rc == 0 for k, v in results.items() if k != "healthy" for rc, _, _ in v),
               "jobs_in_sacct": len(job_ids & set(sacct)), "jobs_in_squeue": len(job_ids & set(in_queue)),
               "submitted_ids": len(job_ids),
               "garbage_replies_sent": garbage.count, "healthy_sbatch_p50_ms": round(healthy_p50, 1),
               "phases": {}}
        for name, phase in results.items():
            times = sorted(ms for _, _, ms in phase)
            out["phases"][name] = {"n": len(times), "p50_ms": round(statistics.median(times), 1),
                                   "p99_ms": round(times[int(0.99 * (len(times) - 1))], 1),
                                   "max_ms": round(times[-1], 1),
                                   "over_limit": sum(t > timeout_ms + 50 + healthy_p50 for t in times)}
        out["lost"] = out["submitted_ids"] - out["jobs_in_sacct"]
        print(json.dumps(out, indent=2))
    finally:
        cluster.down()


if __name__ == "__main__":
    main()
