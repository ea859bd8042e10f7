"""An ordinary local user for the attack tests: ``horustest``, created with useradd when absent.

horusd's user socket is reachable by every local user; the tests that play the hostile user run
their client as this uid (SO_PEERCRED then says who it is). Creating a user and acting as one needs
root, which the suite has (it starts real Slurm daemons); elsewhere these tests are skipped.
"""

import os
import pwd
import subprocess
import sys

import pytest

USER = "horustest"
# the hostile clients need only the standard library; the venv's interpreter may sit below a
# directory the user cannot enter (/root/.pyenv)
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def ensure_user():
    """The passwd entry of ``horustest`` (created if absent); skips the test without root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create and act as the unprivileged user horustest")
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        pass
    result = subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                             "--shell", "/usr/sbin/nologin", USER], capture_output=True, text=True)
    try:  # another test process may have created it at the same moment
        return pwd.getpwnam(USER)
    except KeyError:
        pytest.fail(f"could not create user {USER}: {result.stderr.strip()}", pytrace=False)


def run_python_as(user, code, *args, timeout=60, env=None):
    """Run ``python -c code args`` as ``user`` (a passwd entry); returns the CompletedProcess."""
    return subprocess.run([PYTHON, "-c", code, *map(str, args)], user=user.pw_uid, group=user.pw_gid,
                          extra_groups=[], capture_output=True, text=True, timeout=timeout, cwd="/",
                          env=env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})


def popen_python_as(user, code, *args, **kwargs):
    """Like :func:`run_python_as`, started in the background (stdin/stdout pipes, text mode)."""
    return subprocess.Popen([PYTHON, "-c", code, *map(str, args)], user=user.pw_uid, group=user.pw_gid,
                            extra_groups=[], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/",
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, **kwargs)


def horus_as(user, args, timeout=120, env=None):
    """Run the ``horus`` command line as ``user``: this checkout and the venv's packages on PYTHONPATH
    (the venv's own interpreter may be unreachable for that user)."""
    import sysconfig
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    path = os.pathsep.join([str(root), sysconfig.get_paths()["purelib"]])
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": path, **(env or {})}
    return subprocess.run([PYTHON, "-m", "slurm_horus", *map(str, args)], user=user.pw_uid, group=user.pw_gid,
                          extra_groups=[], capture_output=True, text=True, timeout=timeout, cwd="/", env=full_env)


# ---- what the hostile user runs ---------------------------------------------------------------------
REQUESTS = r"""
import json, socket, sys
path = sys.argv[1]
out = []
for line in sys.argv[2:]:
    s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(path)
    s.sendall(line.encode() + b"\n")
    out.append(json.loads(s.makefile().readline()))
print(json.dumps(out))
"""

IDLE_CONNECTIONS = r"""
import resource, socket, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX); s.settimeout(2)
    try:
        s.connect(sys.argv[1])
        s.sendall(b'{"op": "pl')  # half a request, never finished
    except OSError:
        s.close(); continue
    held.append(s)
print("ready", flush=True)
sys.stdin.readline()
"""

RAW_LINE = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
s.sendall(b"[" * int(sys.argv[2]) + b"\n")
try:
    print(s.makefile("rb").readline().decode(errors="replace").strip() or "(closed)")
except OSError as exc:
    print(f"({exc})")
"""


def requests_as(user, path, *messages):
    """Send each of ``messages`` (dicts) on its own connection to ``path`` as ``user``; the replies."""
    import json

    result = run_python_as(user, REQUESTS, path, *[json.dumps(m) for m in messages])
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def nested_line_as(user, path, depth=100_000):
    """One line of ``depth`` opening brackets to ``path`` as ``user``; what came back."""
    result = run_python_as(user, RAW_LINE, path, depth)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def sbatch_as(user, cluster, args, script="#!/bin/sh\ntrue\n"):
    """``sbatch --parsable`` as ``user`` on ``cluster``: (job id or None, wall milliseconds, stderr)."""
    import time

    from slurm_horus.localcluster.chroot import slurm_install

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_CONF": str(cluster.slurm_conf)}
    # as the user: on a chroot's Slurm (make test-slurm-newer) root enters it and then becomes the user
    argv, as_user = slurm_install().as_user(["sbatch", "--parsable", "-o", "/dev/null", "--chdir=/tmp", *args], user)
    started = time.perf_counter()
    result = subprocess.run(argv, input=script, capture_output=True, text=True, env=env, cwd="/tmp", timeout=60,
                            **as_user)
    took = (time.perf_counter() - started) * 1000
    job = result.stdout.strip().split(";")[0]
    return (int(job) if result.returncode == 0 and job.isdigit() else None), took, result.stderr
