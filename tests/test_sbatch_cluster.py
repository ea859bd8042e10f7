"""horus-sbatch against the real local Slurm cluster (4 nodes x 4 GPUs typed g0..g3, shards).

horusd is another issue, so a test-only fake horusd (:mod:`sbatch_fakes`) answers with a fixed
decision over the real protocol; everything else is real: horus-sbatch as a subprocess, the real
sbatch, slurmctld and slurmd, and the job's own view of its GPUs (``SLURM_JOB_GPUS`` and
``GPU_DEVICE_ORDINAL`` printed from inside the job).
"""

import re
import subprocess
import sys

import pytest

from sbatch_fakes import FakeHorusd, place_reply

SHOW = """#!/bin/bash
#SBATCH --gpus=2
#SBATCH --time=5
echo "node=$SLURMD_NODENAME job_gpus=$SLURM_JOB_GPUS gdo=$GPU_DEVICE_ORDINAL decision=$HORUS_DECISION"
"""


def horus_sbatch(cluster, args, socket_path, tmp_path, input_text=None, env_extra=None):
    env = cluster.env
    for key in list(env):
        if key.startswith(("SBATCH_", "HORUS_")):
            del env[key]
    env.update(env_extra or {})
    config = tmp_path / "horus.conf"
    config.write_text(f"socket = {socket_path}\ntimeout_ms = 5000\n")
    env["HORUS_CONFIG"] = str(config)
    return subprocess.run([sys.executable, "-c", "from slurm_horus.sbatch.cli import main; main()", *args],
                          env=env, input=input_text, capture_output=True, text=True, timeout=60)


def output_options(cluster):
    return [f"--output={cluster.layout.jobs}/slurm-%j.out", f"--chdir={cluster.layout.jobs}"]


def job_id(stdout):
    match = re.fullmatch(r"Submitted batch job (\d+)\n", stdout)
    assert match, stdout
    return int(match.group(1))


def finished_output(cluster, job):
    assert cluster.wait_jobs([job])[job] == "COMPLETED"
    return cluster.job_output(job).split()


@pytest.mark.parametrize("node, gpu", [("n3", 2), ("n2", 0)])
def test_job_runs_on_the_gpu_the_decision_named(slurm_cluster, tmp_path, node, gpu):
    script = tmp_path / "show.sh"
    script.write_text(SHOW)
    with FakeHorusd(place_reply(node=node, gpus=(gpu,))) as horusd:
        result = horus_sbatch(slurm_cluster, output_options(slurm_cluster) + [str(script)],
                              horusd.socket_path, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    job = job_id(result.stdout)
    # the script asked for --gpus=2; the binding replaced that with exactly the named GPU
    assert finished_output(slurm_cluster, job) == [
        f"node={node}", f"job_gpus={gpu}", f"gdo={gpu}", "decision=h-test01"]


@pytest.mark.parametrize("directive, env_extra", [
    ("#SBATCH --gpus-per-node=2", {}),
    ("#SBATCH --gpus-per-task=1\n#SBATCH --ntasks=2", {}),
    ("", {"SBATCH_GPUS": "2"}),
])
def test_two_named_gpus_replace_every_spelling_of_the_request(slurm_cluster, tmp_path, directive, env_extra):
    script = tmp_path / "show2.sh"
    script.write_text(SHOW.replace("#SBATCH --gpus=2", directive))
    with FakeHorusd(place_reply(node="n1", gpus=(1, 3))) as horusd:
        result = horus_sbatch(slurm_cluster, output_options(slurm_cluster) + [str(script)],
                              horusd.socket_path, tmp_path, env_extra=env_extra)
    assert result.returncode == 0, result.stderr
    assert finished_output(slurm_cluster, job_id(result.stdout)) == [
        "node=n1", "job_gpus=1,3", "gdo=1,3", "decision=h-test01"]


def test_shard_binding_lands_on_the_named_gpu(slurm_cluster, tmp_path):
    script = tmp_path / "show.sh"
    script.write_text(SHOW.replace("--gpus=2", "--gres=gpu:1"))
    with FakeHorusd(place_reply(node="n4", gpus=(3,), binding="shard")) as horusd:
        result = horus_sbatch(slurm_cluster, output_options(slurm_cluster) + [str(script)],
                              horusd.socket_path, tmp_path)
    job = job_id(result.stdout)
    # shards set GPU_DEVICE_ORDINAL but not SLURM_JOB_GPUS (Slurm 22.05)
    assert finished_output(slurm_cluster, job) == ["node=n4", "job_gpus=", "gdo=3", "decision=h-test01"]


def test_wrap_and_stdin_scripts_are_placed_too(slurm_cluster, tmp_path):
    with FakeHorusd(place_reply(node="n1", gpus=(1,))) as horusd:
        wrapped = horus_sbatch(slurm_cluster, output_options(slurm_cluster) + [
            "-G", "1", "--wrap", 'echo "$SLURMD_NODENAME $GPU_DEVICE_ORDINAL $SLURM_JOB_NAME"'],
            horusd.socket_path, tmp_path)
        piped = horus_sbatch(slurm_cluster, output_options(slurm_cluster), horusd.socket_path, tmp_path,
                             input_text=SHOW)
    assert finished_output(slurm_cluster, job_id(wrapped.stdout)) == ["n1", "1", "wrap"]
    assert finished_output(slurm_cluster, job_id(piped.stdout))[:3] == ["node=n1", "job_gpus=1", "gdo=1"]


def _compare_with_sbatch(cluster, tmp_path, args, socket_path):
    plain = cluster.run(["sbatch", *args], check=False)
    with FakeHorusd(place_reply()) as horusd:
        ours = horus_sbatch(cluster, args, socket_path or horusd.socket_path, tmp_path)
    return plain, ours


def test_parsable_output_and_exit_code_match_sbatch(slurm_cluster, tmp_path):
    script = tmp_path / "ok.sh"
    script.write_text(SHOW)
    args = ["--parsable", "--hold"] + output_options(slurm_cluster) + [str(script)]
    plain, ours = _compare_with_sbatch(slurm_cluster, tmp_path, args, None)
    assert plain.returncode == ours.returncode == 0
    assert re.fullmatch(r"\d+\n", plain.stdout) and re.fullmatch(r"\d+\n", ours.stdout)
    assert plain.stderr == ours.stderr == ""
    slurm_cluster.run(["scancel", plain.stdout.strip(), ours.stdout.strip()])


@pytest.mark.parametrize("bad, says", [
    ("--no-such-option", "unrecognized option '--no-such-option'"),
    ("--time=soon", "Invalid --time specification"),
])
def test_bad_option_gives_sbatchs_own_error_and_exit_code(slurm_cluster, tmp_path, bad, says):
    script = tmp_path / "ok.sh"
    script.write_text(SHOW)
    plain, ours = _compare_with_sbatch(slurm_cluster, tmp_path, [bad, str(script)], None)
    assert plain.returncode != 0
    assert (ours.returncode, ours.stdout, ours.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert says in ours.stderr


def test_missing_script_is_one_line_and_sbatchs_exit_code(slurm_cluster, tmp_path):
    missing = str(tmp_path / "no-such-script.sh")
    plain, ours = _compare_with_sbatch(slurm_cluster, tmp_path, [missing], None)
    assert plain.returncode != 0
    assert (ours.returncode, ours.stdout, ours.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert len(ours.stderr.splitlines()) == 1 and missing in ours.stderr


def test_with_no_horusd_listening_the_job_is_still_submitted(slurm_cluster, tmp_path):
    script = tmp_path / "show.sh"
    script.write_text(SHOW.replace("--gpus=2", "--gpus=1"))
    result = horus_sbatch(slurm_cluster, output_options(slurm_cluster) + [str(script)],
                          str(tmp_path / "stopped-horusd.sock"), tmp_path)
    assert result.returncode == 0
    (line,) = result.stderr.splitlines()
    assert line.startswith("horus-sbatch: no answer from horusd")
    words = finished_output(slurm_cluster, job_id(result.stdout))
    assert words[2].startswith("gdo=") and words[3] == "decision="
