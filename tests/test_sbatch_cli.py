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
    assert len(lines) == 1 and "no answer from horusd" in lines[0] and "job_submit.lua may still place it" in lines[0]
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


def test_a_decision_spelled_for_a_newer_slurm_gives_the_same_sbatch_options(tmp_path, job_script):
    """horusd spells tres_per_node gres/ on 24.11+; sbatch's --gres has no prefix on any version."""
    newer = place_reply(binding="shard", gpus=(1,), tres="gres/shard:g1:1")
    result, _ = dry_run(tmp_path, [str(job_script)], reply=newer)
    assert "command: sbatch --parsable --nodelist=n3 --gres=shard:g1:1 " in result.stdout.decode()
    mixed = place_reply(tres="gres/gpu:g1:1,gpu/g2:1")
    assert "could not be used" in dry_run(tmp_path, [str(job_script)], reply=mixed)[0].stderr.decode()


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


def test_output_closed_early_ends_quietly_without_a_traceback(tmp_path, job_script):
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # like `| head` that has already exited: every write fails with EPIPE
    with FakeHorusd(place_reply()) as horusd:
        env = clean_environment(tmp_path, horusd.socket_path)
        result = subprocess.run([sys.executable, "-c", "from slurm_horus.sbatch.cli import main; main()",
                                 "--dry-run", "--explain", str(job_script)],
                                env=env, cwd=tmp_path, stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    os.close(write_end)
    assert result.returncode == 141 and b"Traceback" not in result.stderr, result.stderr


def test_version_names_slurm_horus_and_sbatch(tmp_path):
    from importlib.metadata import version

    env = clean_environment(tmp_path, "/nonexistent")
    (tmp_path / "slurm.conf").write_text("ClusterName=x\nSlurmctldHost=localhost\n")  # sbatch reads one
    env.update(HORUS_SBATCH="sbatch", SLURM_CONF=str(tmp_path / "slurm.conf"))
    result = run_horus_sbatch(["--version"], env, tmp_path)
    lines = result.stdout.decode().splitlines()
    assert result.returncode == 0
    assert lines[0] == f"horus-sbatch (slurm-horus) {version('slurm-horus')}"
    assert lines[1].startswith("slurm")  # sbatch's own line, e.g. "slurm-wlm 22.05.8"


@pytest.mark.parametrize("args, env_extra, says", [
    (["--horus-class", "bad class;x"], {}, "--horus-class: 'bad class;x' is not a job class name"),
    (["--horus-batch-size", "abc"], {}, "--horus-batch-size: 'abc' is not a batch size"),
    (["--horus-model", "a/b"], {}, "--horus-model: 'a/b' is not a job model name"),
    ([], {"HORUS_BATCH_SIZE": "-3"}, "HORUS_BATCH_SIZE: '-3' is not a batch size"),
])
def test_bad_class_settings_are_one_line_and_ask_nothing(tmp_path, job_script, args, env_extra, says):
    result, requests = dry_run(tmp_path, [*args, str(job_script)], env_extra=env_extra)
    assert result.returncode == 1 and result.stdout == b"" and requests == []
    assert result.stderr.decode().splitlines() == [f"horus-sbatch: {says} (letters, digits, '.', '_' and '-'; "
                                                   "`horus model classes` lists the classes the model knows)"
                                                   if "name" in says else
                                                   f"horus-sbatch: {says} (a whole number from 1)"]


def test_bad_horus_line_in_the_script_names_its_line(tmp_path):
    script = tmp_path / "t.sh"
    script.write_bytes(b"#!/bin/sh\n#SBATCH --gres=gpu:1\n#HORUS --batch-size=big\ntrue\n")
    result, _ = dry_run(tmp_path, [str(script)])
    assert result.returncode == 1
    assert result.stderr.decode().startswith("horus-sbatch: t.sh: line 3: #HORUS --batch-size: 'big' is not")


def test_unknown_class_is_named_with_close_matches(tmp_path, job_script):
    reply = place_reply(class_known=False, class_suggestions=["resnet50-bs64", "resnet50-bs32"], job_class="resnt50-bs64")
    result, _ = dry_run(tmp_path, ["--horus-class", "resnt50-bs64", str(job_script)], reply=reply)
    assert result.stderr.decode() == (
        "horus-sbatch: unknown job class 'resnt50-bs64' (did you mean resnet50-bs64, resnet50-bs32?): it is not "
        "shared with other jobs; `horus model classes` lists the known classes\n")


def test_explain_says_how_many_gpus_it_lists(tmp_path, job_script):
    candidates = [{"node": "n3", "gpus": [2], "predicted_slowdown": 1.0, "why": "free", "chosen": True}]
    result, _ = dry_run(tmp_path, ["--explain", str(job_script)],
                        reply=place_reply(candidates=candidates, candidates_total=12, gpus_total=16))
    assert ("# candidates considered: 12 of 16 GPUs, the best 1 listed (predicted slowdown of this job; "
            "of the job already there):\n") in result.stdout.decode()


@pytest.mark.parametrize("export, expected", [
    ("NONE", "--export=NONE,HORUS_OFF=1"), ("PATH,FOO=1", "--export=PATH,FOO=1,HORUS_OFF=1"), ("ALL", None),
])
def test_horus_off_reaches_the_jobs_environment_whatever_export_says(tmp_path, job_script, export, expected):
    result, requests = dry_run(tmp_path, ["--horus-off", f"--export={export}", str(job_script)])
    out = result.stdout.decode()
    assert requests == [] and "environment: HORUS_OFF=1\n" in out
    command = next(line for line in out.splitlines() if line.startswith("command: "))
    assert (expected in command) if expected else command.count("--export") == 1, command


def test_placed_job_exports_its_decision_id_when_export_is_narrowed(tmp_path, job_script):
    result, _ = dry_run(tmp_path, ["--export=NONE", str(job_script)])
    assert "--export=NONE,HORUS_DECISION=h-test01 " in result.stdout.decode()


def test_no_answer_carries_the_class_to_job_submit_lua(tmp_path, job_script):
    # a login node without horusd's socket: the class still reaches job_submit.lua on the controller
    env = clean_environment(tmp_path, str(tmp_path / "nobody-listens.sock"))
    result = run_horus_sbatch(["--dry-run", "--horus-class", "lm-bs20", "--export=NONE", str(job_script)], env,
                              tmp_path)
    out = result.stdout.decode()
    assert "environment: HORUS_CLASS=lm-bs20\n" in out
    assert f"command: sbatch --export=NONE --export=NONE,HORUS_CLASS=lm-bs20 {job_script}\n" in out
