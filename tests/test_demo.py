"""`horus demo` end to end on its own local cluster (real Slurm daemons, horusd, collectors)."""

import re

import pytest

from slurm_horus.demo import STEPS, WORKLOAD, replay_short_workload, run_demo
from slurm_horus.localcluster.chroot import slurm_install

# A chroot's Slurm (make test-slurm-newer) runs job scripts inside the chroot, where slurm-horus is not
# installed: the replay's fake jobs (`python -m slurm_horus fake-job`) cannot run there, so the tour
# stops before the replay (tests/test_replay.py runs it on the system's Slurm).
IN_CHROOT = slurm_install().root is not None


@pytest.mark.slurm
def test_demo_tour_runs_and_shows_sharing_accounting_report_and_replay(monkeypatch):
    # the jobs must still run when the tour shows who shares which GPU: on a loaded machine the
    # submissions alone took 17-18 s, longer than the demo's 12 s jobs (sbatch exports this to them)
    monkeypatch.setenv("DEMO_SECONDS", "25")
    steps = [step for step in STEPS if step.run is not replay_short_workload] if IN_CHROOT else STEPS
    lines = []
    ctx = run_demo(steps=steps, echo=lines.append)
    text = "\n".join(lines)
    assert f"[{len(steps)}/{len(steps)}]" in text and "no process left behind" in text
    assert len(ctx.jobs) == len(WORKLOAD)
    # the horus-sbatch jobs arrived with every GPU busy: at least one shares a GPU
    assert re.search(r"GPU n\d:\d is shared by \S+ \+ \S+", text), text
    # the --explain --dry-run preview is where the real horus-sbatch submission of that class went
    preview = re.search(r"# decision h[0-9a-f]+: (n\d) GPU (\d) ", text)
    assert preview, text
    first_horus_sbatch, _ = ctx.jobs["resnet18-a"]
    assert re.search(rf"^\s+{first_horus_sbatch}\s+resnet18-a\s+resnet18-bs32\s+RUNNING\s+"
                     rf"{preview.group(1)}:{preview.group(2)}\s", text, re.M), text
    # sacct rows: every job COMPLETED, the exclusive 2-GPU job with its two typed indices
    two_gpus, _ = ctx.jobs["two-gpus"]
    assert re.search(rf"^\s+{two_gpus}\s+two-gpus\s+n\d\s+COMPLETED\s+gpu=2,gpu:g(\d)=1,gpu:g(\d)=1\s+\d,\d$", text, re.M)
    assert text.count(" COMPLETED ") >= len(WORKLOAD)
    # the report saw every job, and the job report lists the co-runner it shared with
    assert re.search(rf"^\s+root\s+{len(WORKLOAD)}\s", text, re.M), text
    assert "Co-runners:" in text
    if IN_CHROOT:
        return
    # the replay: plain Slurm and horus live, each beside the simulator's figures, then the report
    assert re.search(r"^\s+slurm-default\s+live\s+[\d.]+h", text, re.M) and text.count("live/sim") == 2, text
    assert re.search(r"horus vs plain Slurm, mean JCT: live [+-]\d+% \(sacct\), simulated [+-]\d+%", text), text
    assert re.search(r"^\s+root\s+16\s", text, re.M), text
