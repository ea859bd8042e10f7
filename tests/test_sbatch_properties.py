"""Property tests: any directive block parses without crashing, the script body survives the
rewrite byte-for-byte, and options that are not about placement reach sbatch exactly as written."""

import os
import tempfile
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_horus.sbatch.cli import _Invocation, plan
from slurm_horus.sbatch.options import CANONICAL, LONG_OPTIONS, NONE, REQUIRED, SHORT_OPTIONS
from slurm_horus.sbatch.script import read_directives

from sbatch_fakes import place_reply

PLACEMENT = {"nodelist", "nodefile", "gres", "gpus", "gpus-per-node", "gpus-per-task",
             "gpus-per-socket", "exclusive", "array", "clusters", "wrap", "help", "usage",
             "version", "parsable"}
PLAIN_REQUIRED = sorted(n for n, k in LONG_OPTIONS.items()
                        if k == REQUIRED and CANONICAL.get(n, n) not in PLACEMENT)
PLAIN_FLAGS = sorted(n for n, k in LONG_OPTIONS.items() if k == NONE and CANONICAL.get(n, n) not in PLACEMENT)
SHORT_FOR = {long: short for short, long in SHORT_OPTIONS.items()}
CONFIG = SimpleNamespace(socket="/nonexistent/horusd.sock", timeout_ms=100.0)

values = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12)


@st.composite
def plain_option(draw):
    """One non-placement option as argv words, in one of the spellings sbatch accepts."""
    if draw(st.booleans()):
        return [f"--{draw(st.sampled_from(PLAIN_FLAGS))}"]
    name = draw(st.sampled_from(PLAIN_REQUIRED))
    value = draw(values)
    spellings = [[f"--{name}={value}"], [f"--{name}", value]]
    if name in SHORT_FOR:
        spellings += [[f"-{SHORT_FOR[name]}", value], [f"-{SHORT_FOR[name]}{value}"]]
    return draw(st.sampled_from(spellings))


gpu_option = st.sampled_from([["--gres=gpu:2"], ["-G", "1"], ["-G2"], ["--gpus-per-node=1"],
                              ["--gpus-per-task", "1"], ["--gres", "gpu:g1:1"]])

directive_word = st.one_of(
    st.sampled_from(["-J", "x", "--gres=gpu:1", "-G", "2", "--time=10", "-N", "hetjob", "packjob",
                     "--exclusive", "-w", "n1", "'quoted word'", '"a\\"b"', "#", "\\", "'", '"',
                     "--comment=a#b", "--array=0-3", ":", "--", "-"]),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=10))

directive_line = st.one_of(
    st.lists(directive_word, max_size=6).map(lambda ws: "#SBATCH " + " ".join(ws)),
    st.lists(directive_word, max_size=4).map(lambda ws: "#HORUS " + " ".join(ws)),
    st.sampled_from(["", "   ", "# comment", "# SBATCH -N 3", "  #SBATCH -N 4", "#SLURM -J old",
                     "#SBATCHX", "\t", "\r"]),
)

body = st.binary(max_size=200)


def script_from(lines, tail, newline=b"\n"):
    block = newline.join(line.encode("utf-8", "surrogateescape") for line in lines)
    return b"#!/bin/bash" + newline + block + newline + b"echo body" + newline + tail


@given(st.lists(directive_line, max_size=12), body, st.sampled_from([b"\n", b"\r\n"]))
def test_random_directive_blocks_never_crash_the_parser(lines, tail, newline):
    script = script_from(lines, tail, newline)
    found = read_directives(script)
    assert 0 <= found.block_end <= len(script)
    assert found.components and all(isinstance(c, list) for c in found.components)
    rest = script[found.block_end:].decode("latin-1")
    assert rest == "" or not rest.lstrip(" \t\n\v\f\r").startswith("#")


def _plan(argv, script_bytes, reply):
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "job.sh")
        with open(path, "wb") as handle:
            handle.write(script_bytes)
        invocation = _Invocation(argv + [path, "arg1"], {})
        submission, original = plan(invocation, {}, lambda text: None, CONFIG,
                                    asker=lambda request, address, timeout: reply)
        return submission, original, path


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(directive_line, max_size=10), body, st.sampled_from([b"\n", b"\r\n"]))
def test_body_after_the_directives_is_kept_byte_for_byte(lines, tail, newline):
    script = script_from(["#SBATCH --gres=gpu:1"] + lines, tail, newline)
    submission, original, _ = _plan([], script, place_reply())
    assert original == script
    found = read_directives(script)
    if submission.script is None:
        assert submission.decision is None and submission.why_unchanged
        return
    rewritten = submission.script
    assert rewritten.startswith(script[:found.block_end])
    assert rewritten.endswith(script[found.block_end:])
    inserted = rewritten[found.block_end:len(rewritten) - (len(script) - found.block_end)]
    assert inserted.count(b"# ---- horus-sbatch ") == 1
    assert (b"\r\n" in inserted) == (newline == b"\r\n")


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.one_of(plain_option(), gpu_option)), max_size=8))
def test_options_not_about_placement_reach_sbatch_unchanged(groups):
    argv = [word for _, words in groups for word in words]
    plain = [words for _, words in groups if words not in GPU_SPELLINGS]
    submission, _, path = _plan(argv, b"#!/bin/sh\n#SBATCH --gres=gpu:1\ntrue\n", place_reply())
    assert submission.decision is not None
    words = submission.argv
    assert words[0] == "--parsable" and words[-2:] == [path, "arg1"]
    binding = ["--nodelist=n3", "--gres=gpu:g2:1"]
    middle = words[1:-2]
    # a narrowed --export gets one more --export that adds the decision id job_submit.lua reads
    carried = [w for w in middle if w.startswith("--export=") and w.endswith(",HORUS_DECISION=h-test01")]
    assert len(carried) <= 1
    kept = [w for w in middle if w not in binding + carried and not (w.startswith("--gpus") and w.endswith("=0"))]
    assert kept == [word for words in plain for word in words]


GPU_SPELLINGS = [["--gres=gpu:2"], ["-G", "1"], ["-G2"], ["--gpus-per-node=1"], ["--gpus-per-task", "1"],
                 ["--gres", "gpu:g1:1"]]


argv_word = st.one_of(
    st.sampled_from(["-G", "2", "-HG2", "--gres", "--gres=gpu:1", "--nodel", "n1", "--exclusive",
                     "--exclusive=user", "--", ":", "-", "-w", "--no-such", "--wrap", "job.sh",
                     "--horus-class", "--dry-run", "-", "--exc", "--time"]),
    st.text(max_size=8))


@given(st.lists(argv_word, max_size=12))
def test_any_argv_splits_and_reassembles(argv):
    from slurm_horus.sbatch.cli import HORUS_OPTIONS
    from slurm_horus.sbatch.options import split_options, without

    options, rest = split_options(argv, extra_long=HORUS_OPTIONS)
    head = argv[:len(argv) - len(rest)]
    assert argv[len(head):] == rest
    assert without(head, options, lambda option: False) == head
    spans = sorted({option.span for option in options})
    assert [start for start, _ in spans] == ([0] + [end for _, end in spans[:-1]] if spans else [])
    assert (spans[-1][1] if spans else 0) == len(head)
