"""Golden files: realistic batch scripts -> exactly what ``horus-sbatch --dry-run`` shows.

For ``tests/golden/sbatch/NAME.sh`` the expected output is ``NAME.expected``; ``NAME.args`` (one
word per line) adds command-line words before the script, ``NAME.reply.json`` replaces the default
horusd reply (place on n3, GPU 2). A fake horusd (:mod:`sbatch_fakes`) answers over the real
protocol; the real horus-sbatch runs as a subprocess. If the expected file is missing it is written
(check it in after reading it); a mismatch shows a diff.
"""

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sbatch_fakes import FakeHorusd, place_reply

GOLDEN = Path(__file__).parent / "golden" / "sbatch"
SCRIPTS = sorted(p.name for p in GOLDEN.glob("*.sh"))


def clean_environment(tmp_path, socket_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SBATCH_", "HORUS_", "SLURM_"))}
    config = tmp_path / "horus.conf"
    config.write_text("")
    env.update(HORUS_CONFIG=str(config), HORUS_SOCKET=socket_path, HORUS_TIMEOUT_MS="5000",
               HORUS_SBATCH="/bin/false", PYTHONIOENCODING="utf-8")
    return env


def run_horus_sbatch(args, env, cwd, input_bytes=None):
    return subprocess.run([sys.executable, "-c", "from slurm_horus.sbatch.cli import main; main()", *args],
                          env=env, cwd=cwd, input=input_bytes, capture_output=True, timeout=60)


def _readable(data):
    return [line.replace("\r", "\\r") + "\n" for line in data.decode("utf-8", "replace").split("\n")]


@pytest.mark.parametrize("name", SCRIPTS)
def test_golden_dry_run(name, tmp_path):
    stem = name[:-len(".sh")]
    reply_file = GOLDEN / f"{stem}.reply.json"
    reply = json.loads(reply_file.read_text()) if reply_file.exists() else place_reply()
    args_file = GOLDEN / f"{stem}.args"
    args = args_file.read_text().splitlines() if args_file.exists() else []
    with FakeHorusd(reply) as horusd:
        result = run_horus_sbatch(["--dry-run", *args, f"./{name}"],
                                  clean_environment(tmp_path, horusd.socket_path), GOLDEN)
    assert result.returncode == 0, result.stderr.decode()
    expected_file = GOLDEN / f"{stem}.expected"
    if not expected_file.exists():
        expected_file.write_bytes(result.stdout)
        pytest.skip(f"wrote {expected_file.name}; read it, then check it in")
    expected = expected_file.read_bytes()
    if result.stdout != expected:
        diff = "".join(difflib.unified_diff(_readable(expected), _readable(result.stdout),
                                            f"{stem}.expected", "horus-sbatch --dry-run"))
        pytest.fail(f"{name}: output differs from {expected_file}\n{diff}\n"
                    f"If this change is intended, delete {expected_file} to regenerate it.")


def test_every_golden_script_keeps_its_bytes_in_the_submitted_script():
    for name in SCRIPTS:
        expected = (GOLDEN / f"{name[:-3]}.expected").read_bytes()
        original = (GOLDEN / name).read_bytes()
        submitted = expected.split(b" bytes):\n", 1)[1]
        header_start = submitted.find(b"# ---- horus-sbatch ")
        if header_start < 0:
            assert submitted == original, name
            continue
        end_marker = b"the rest is your script, unchanged ----"
        header_end = submitted.index(end_marker) + len(end_marker)
        header_end = submitted.index(b"\n", header_end) + 1
        assert submitted[:header_start] + submitted[header_end:] == original, name
