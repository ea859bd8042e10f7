"""horus-sbatch's own behaviour that needs no cluster: what --dry-run and --explain show, --wrap
and stdin scripts, the one stderr line when horusd is silent, and answers that must not be used."""

import os

import pytest

from sbatch_fakes import FakeHorusd, place_reply
from test_sbatch_golden import clean_environment, run_horus_sbatch

SCRIPT = b"#!/bin/bash\n#SBATCH --gres=gpu:1\n#SBATCH --time=10\npython train.py\n"


@pytest.fixture
def job_script(tmp_path):
    path = tmp_path / "train.sh"
    path.write_bytes(SCRIPT)
    return path


def dry_run(tmp_path, args, reply=None, input_bytes=None, env_extra=None):
    with FakeHorusd(reply if reply is not None else place_reply()) as horusd:
        env = clean_environment(tmp_path, horusd.socket_path)
        env.update(env_extra or {})
        result = run_horus_sbatch(["--dry-run", *args], env, tmp_path, input_bytes)
    return result, horusd.requests


def test_wrap_becomes_sbatchs_own_wrapper_script_with_the_header(tmp_path):
    result, requests = dry_run(tmp_path, ["-G", "1", "--wrap", "python -c 'print(1)'"])
    out = result.stdout.decode()
    assert "command: sbatch --parsable --nodelist=n3 --gres=gpu:g2:1 --job-name=wrap\n" in out
    assert "script (stdin, " in out
    script = out.split(" bytes):\n", 1)[1]
    assert script.startswith("#!/bin/sh\n# This script was created by sbatch --wrap.\n\n# ---- horus-sbatch")
    assert script.endswith("python -c 'print(1)'\n")
    assert requests[0]["job_name"] == "wrap" and requests[0]["tres_per_job"] == "gres:gpu:1"


def test_wrap_keeps_the_users_job_name(tmp_path):
    result, _ = dry_run(tmp_path, ["-G", "1", "-J", "mine", "--wrap", "true"])
    assert "--job-name=wrap" not in result.stdout.decode()


def test_script_on_stdin_is_rewritten_and_fed_on_stdin(tmp_path):
    result, requests = dry_run(tmp_path, [], input_bytes=SCRIPT)
    out = result.stdout.decode()
    assert "command: sbatch --parsable --nodelist=n3 --gres=gpu:g2:1\n" in out
    assert "script (stdin, " in out and out.endswith("python train.py\n")
    assert requests[0]["job_name"] == "sbatch"


def test_request_carries_class_hints_and_dry_run(tmp_path, job_script):
    _, requests = dry_run(tmp_path, ["--horus-class=bert", "--horus-batch-size", "32", str(job_script)],
                          env_extra={"HORUS_MODEL": "bert-base"})
    (request,) = requests
    assert request["job_class"] == "bert" and request["dry_run"] is True
    assert request["hints"] == {"HORUS_MODEL": "bert-base", "HORUS_BATCH_SIZE": "32"}
    assert request["tres_per_node"] == "gres:gpu:1" and request["time_limit_min"] == 10
    assert request["job_name"] == "train.sh" and len(request["script_hash"]) == 40


def test_unknown_class_is_sent_as_unknown(tmp_path, job_script):
    _, (request,) = dry_run(tmp_path, [str(job_script)])
    assert request["job_class"] == "unknown"


def test_no_answer_submits_unchanged_and_says_so_once(tmp_path, job_script):
    env = clean_environment(tmp_path, str(tmp_path / "nobody-listens.sock"))
    result = run_horus_sbatch(["--dry-run", str(job_script)], env, tmp_path)
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and "no answer from horusd" in lines[0] and "without placement" in lines[0]
    assert f"command: sbatch {job_script}\n" in result.stdout.decode()
    assert result.stdout.endswith(SCRIPT)


def test_user_nodelist_wins_without_asking(tmp_path, job_script):
    result, requests = dry_run(tmp_path, ["-w", "n1", str(job_script)])
    assert requests == []
    assert f"command: sbatch -w n1 {job_script}\n" in result.stdout.decode()
    assert result.stderr == b""


def test_horus_options_never_reach_sbatch(tmp_path, job_script):
    result, _ = dry_run(tmp_path, ["--horus-off", "--horus-model", "x", str(job_script), "--horus-off"])
    assert f"command: sbatch {job_script} --horus-off\n" in result.stdout.decode()


@pytest.mark.parametrize("bad", [
    {"nodes": ["n1;reboot"]}, {"nodes": []}, {"tres": "gres:gpu:g1:1\nexport X=1"},
    {"id": "$(rm -rf ~)"}, {"binding": "magic"}, {"mps_thread_percentage": 500},
    {"gpus": {"n3": ["2\nreboot"]}}, {"slowdown": "fast"}, {"tres": "gpu:g1:1"},
])
def test_unsafe_or_malformed_decisions_are_not_used(tmp_path, job_script, bad):
    result, _ = dry_run(tmp_path, [str(job_script)], reply=place_reply(**bad))
    assert "could not be used" in result.stderr.decode()
    assert result.stdout.endswith(SCRIPT) and "--nodelist" not in result.stdout.decode()


def test_reason_text_cannot_break_out_of_its_comment(tmp_path, job_script):
    result, _ = dry_run(tmp_path, [str(job_script)], reply=place_reply(reason="ok\nrm -rf /tmp/x\r"))
    out = result.stdout.decode()
    assert "\nrm -rf" not in out and "# Why: ok rm -rf /tmp/x\n" in out


def test_unchanged_answer_leaves_the_job_alone(tmp_path, job_script):
    result, _ = dry_run(tmp_path, [str(job_script)],
                        reply={"ok": True, "action": "unchanged", "reason": "cluster busy"})
    assert "# job left to Slurm: horusd leaves this job to Slurm: cluster busy\n" in result.stdout.decode()


def test_explain_lists_the_candidates(tmp_path, job_script):
    candidates = [{"node": "n3", "gpus": [2], "predicted_slowdown": 1.05, "corunner_slowdown": 1.02,
                   "why": "pairs well with job 7", "chosen": True},
                  {"node": "n1", "gpus": [0], "predicted_slowdown": 1.6, "why": "over the 1.5x limit"}]
    result, _ = dry_run(tmp_path, ["--explain", str(job_script)], reply=place_reply(candidates=candidates))
    out = result.stdout.decode()
    assert "#   n3 GPU 2           1.05   1.02  pairs well with job 7  <- chosen\n" in out
    assert "#   n1 GPU 0           1.60      -  over the 1.5x limit\n" in out


def test_unreadable_site_config_is_one_line_and_the_job_goes_through(tmp_path, job_script):
    env = clean_environment(tmp_path, "/nonexistent")
    (tmp_path / "horus.conf").write_text("no_such_setting = 1\n")
    result = run_horus_sbatch(["--dry-run", str(job_script)], env, tmp_path)
    assert result.returncode == 0
    (line,) = result.stderr.decode().splitlines()
    assert "horus.conf:1" in line and "unknown setting" in line
    assert result.stdout.endswith(SCRIPT)


def test_parsable_in_the_script_counts_as_the_users(tmp_path):
    (tmp_path / "p.sh").write_bytes(b"#!/bin/sh\n#SBATCH --parsable\n#SBATCH -G1\ntrue\n")
    result, _ = dry_run(tmp_path, ["./p.sh"])
    assert "command: sbatch --nodelist=n3 --gres=gpu:g2:1 --gpus=0 $TMPDIR/" in result.stdout.decode()


def test_bare_script_name_is_found_in_the_current_directory_then_on_path(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "onpath.sh").write_bytes(SCRIPT.replace(b"train.py", b"from_path.py"))
    (tmp_path / "horus.conf").write_text("")
    result, _ = dry_run(tmp_path, ["onpath.sh"], env_extra={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert result.stdout.endswith(b"python from_path.py\n")
    (tmp_path / "onpath.sh").write_bytes(SCRIPT.replace(b"train.py", b"from_cwd.py"))
    result, _ = dry_run(tmp_path, ["onpath.sh"], env_extra={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert result.stdout.endswith(b"python from_cwd.py\n")


def test_wrap_with_script_arguments_is_left_for_sbatch_to_refuse(tmp_path):
    result, requests = dry_run(tmp_path, ["-G", "1", "--wrap", "true", "extra"])
    assert requests == []
    assert "command: sbatch -G 1 --wrap true extra\n" in result.stdout.decode()


@pytest.mark.parametrize("line, sentence", [
    (b"4242\n", b"Submitted batch job 4242\n"),
    (b"4242;lab\n", b"Submitted batch job 4242 on cluster lab\n"),
    (b"sbatch: something else\n", None),
])
def test_parsable_line_becomes_sbatchs_sentence(line, sentence):
    from slurm_horus.sbatch.cli import _sentence

    assert _sentence(line) == sentence
