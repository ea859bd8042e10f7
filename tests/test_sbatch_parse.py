"""horus-sbatch's reading of sbatch options and #SBATCH directives (rules verified on sbatch 22.05.8)."""

import pytest

from slurm_horus.sbatch.job import JobView, gres_items, time_limit_minutes
from slurm_horus.sbatch.options import Option, directive_words, resolve_long, split_options, without
from slurm_horus.sbatch.script import read_directives


def names_values(options):
    return [(o.name, o.value) for o in options]


def test_long_options_take_arguments_as_getopt_does():
    options, rest = split_options(["--gres", "gpu:2", "--time=10", "--exclusive", "job.sh", "-N", "2"])
    assert names_values(options) == [("gres", "gpu:2"), ("time", "10"), ("exclusive", None)]
    assert rest == ["job.sh", "-N", "2"]


def test_optional_argument_only_with_equals():
    options, rest = split_options(["--exclusive", "user", "x"])
    assert names_values(options) == [("exclusive", None)]
    assert rest == ["user", "x"]
    options, _ = split_options(["--exclusive=user", "x"])
    assert names_values(options) == [("exclusive", "user")]


def test_unique_prefixes_resolve_and_ambiguous_ones_do_not():
    assert resolve_long("nodel") == "nodelist"
    assert resolve_long("gpus-per-n") == "gpus-per-node"
    assert resolve_long("cluster") == "clusters"
    assert resolve_long("exc") is None          # exclude / exclusive
    assert resolve_long("node") is None         # nodefile / nodelist / nodes
    assert resolve_long("no-such-option") is None


def test_short_option_clusters_and_attached_values():
    options, rest = split_options(["-HG2", "-N", "1", "-wn3", "s.sh"])
    assert names_values(options) == [("hold", None), ("gpus", "2"), ("nodes", "1"), ("nodelist", "n3")]
    assert rest == ["s.sh"]


def test_double_dash_and_unknown_options_are_kept():
    options, rest = split_options(["--my-spank-flag", "--site=x", "--", "-weird-name.sh"])
    assert names_values(options) == [(None, None), (None, "x")]
    assert rest == ["--", "-weird-name.sh"]


def test_without_keeps_untouched_words_verbatim_and_splits_mixed_short_words():
    argv = ["-HG2", "--nodel", "n1", "--mem", "4G"]
    options, _ = split_options(argv)
    assert without(argv, options, lambda o: o.name == "gpus") == ["-H", "--nodel", "n1", "--mem", "4G"]
    assert without(argv, options, lambda o: o.name == "nodelist") == ["-HG2", "--mem", "4G"]


@pytest.mark.parametrize("text, words", [
    (" -J a --comment=x", ["-J", "a", "--comment=x"]),
    (" --gres=gpu:1 # trailing -N 2", ["--gres=gpu:1"]),
    (' -J "two words" --comment=\'a b\'', ["-J", "two words", "--comment=a b"]),
    (' -J q\\"x', ["-J", 'q"x']),
    ("\t-J tab\r", ["-J", "tab"]),
    ("-J nospace", ["-J", "nospace"]),
    (" --comment=a#b", ["--comment=a"]),
    ("", []),
])
def test_directive_words(text, words):
    assert [value for value, _ in directive_words(text)] == words


def test_directive_block_ends_at_the_first_command():
    script = (b"#!/bin/bash\n#SBATCH -J a\n\n   \n# comment\n  #SBATCH -J indented\n# SBATCH -J spaced\n"
              b"#SBATCH --gres=gpu:1\n echo hi\n#SBATCH -J after\n")
    found = read_directives(script)
    assert names_values(found.components[0]) == [("job-name", "a"), ("gres", "gpu:1")]
    assert script[found.block_end:] == b" echo hi\n#SBATCH -J after\n"
    assert found.is_shell and found.error is None


def test_slurm_magic_word_and_missing_space_are_directives():
    found = read_directives(b"#!/bin/sh\n#SLURM -J old\n#SBATCH-N2\ntrue\n")
    assert names_values(found.components[0]) == [("job-name", "old"), ("nodes", "2")]


def test_hetjob_separator_rules():
    found = read_directives(b"#!/bin/sh\n#SBATCH -J a\n#SBATCH  HETJOB -J ignored\n#SBATCH -J b\n"
                            b"#SBATCH packjob\n#SBATCH -G1\ntrue\n")
    assert [names_values(c) for c in found.components] == [
        [("job-name", "a")], [("job-name", "b")], [("gpus", "1")]]
    # not first on its line: not a separator, and the rest of that line is dropped
    found = read_directives(b"#!/bin/sh\n#SBATCH -J x hetjob --comment=z\n#SBATCH --comment=hetjob\ntrue\n")
    assert not found.is_het
    assert names_values(found.components[0]) == [("job-name", "x"), ("comment", "hetjob")]


def test_option_argument_may_come_from_the_next_directive_line():
    found = read_directives(b"#!/bin/sh\n#SBATCH -p\n#SBATCH debug\ntrue\n")
    assert names_values(found.components[0]) == [("partition", "debug")]


@pytest.mark.parametrize("script, error", [
    (b"#!/bin/sh\n#SBATCH -J x foo --comment=c\ntrue\n", "invalid directive 'foo'"),
    (b"#!/bin/sh\n#SBATCHX -J foo\ntrue\n", "invalid directive 'X'"),
    (b"#!/bin/sh\n#SBATCH -J 'open\ntrue\n", "line 2: unmatched '"),
])
def test_directives_sbatch_rejects_are_flagged(script, error):
    assert read_directives(script).error == error


def test_shebang_line_ending_and_interpreter():
    found = read_directives(b"#!/usr/bin/env -S python3 -u\r\n#SBATCH -G1\r\nprint(1)\r\n")
    assert found.interpreter == "python3" and not found.is_shell
    assert found.newline == b"\r\n"
    assert found.shebang == b"#!/usr/bin/env -S python3 -u\r\n"
    assert read_directives(b"echo no shebang\n").shebang == b""


def test_horus_lines_are_collected_with_their_line_numbers():
    found = read_directives(b"#!/bin/sh\n#HORUS --class resnet50-bs64\n#SBATCH -G1\n#HORUS --model=x\ntrue\n")
    assert found.horus == [(["--class", "resnet50-bs64"], 2), (["--model=x"], 4)]


def test_precedence_script_then_environment_then_command_line():
    script = [Option("partition", "script-p", ()), Option("gpus", "1", ()), Option("time", "10", ())]
    command_line = [Option("partition", "cli-p", ())]
    view = JobView(script, {"SBATCH_PARTITION": "env-p", "SBATCH_TIMELIMIT": "20"}, command_line)
    assert view.value("partition") == "cli-p"
    assert view.value("time") == "20"
    assert view.value("gpus") == "1"


@pytest.mark.parametrize("options, environ, tres", [
    ([("gres", "gpu:2")], {}, {"tres_per_node": "gres:gpu:2"}),
    ([("gres", "gpu:a100:2,tmpdisk:10")], {}, {"tres_per_node": "gres:gpu:a100:2"}),
    ([("gres", "gpu")], {}, {"tres_per_node": "gres:gpu:1"}),
    ([("gpus", "v100:1")], {}, {"tres_per_job": "gres:gpu:v100:1"}),
    ([("gpus-per-node", "2")], {}, {"tres_per_node": "gres:gpu:2"}),
    ([("gpus-per-task", "1")], {}, {"tres_per_task": "gres:gpu:1"}),
    ([], {"SBATCH_GPUS": "3"}, {"tres_per_job": "gres:gpu:3"}),
    ([("gpus", "0")], {}, {}),
])
def test_gpu_request_in_every_spelling(options, environ, tres):
    view = JobView([Option(n, v, ()) for n, v in options], environ, [])
    assert view.tres() == tres
    assert (view.leave_alone_reason() == "the job asks for no GPUs") == (not tres)


@pytest.mark.parametrize("options, environ, reason", [
    ([("nodelist", "n1")], {}, "nodes"),
    ([], {"SBATCH_EXCLUSIVE": ""}, "--exclusive"),
    ([("array", "0-3")], {}, "arrays"),
    ([("gres", "shard:1")], {}, "shards"),
    ([("clusters", "other")], {}, "other clusters"),
])
def test_the_users_own_choices_win(options, environ, reason):
    view = JobView([Option(n, v, ()) for n, v in [("gres", "gpu:1")] + options], environ, [])
    assert reason in view.leave_alone_reason()


def test_gres_items_and_time_limits():
    assert gres_items("gres:gpu:g1:1,shard:2,gpu") == [
        ("gpu", "g1", 1, "gres:gpu:g1:1"), ("shard", "", 2, "shard:2"), ("gpu", "", 1, "gpu")]
    assert [time_limit_minutes(t) for t in ("90", "1:30", "2:00:00", "1-0", "1-2:30", "UNLIMITED", "x")] == [
        90, 2, 120, 1440, 1590, None, None]


def test_request_carries_what_horusd_needs():
    view = JobView([Option("gres", "gpu:2", ()), Option("nodes", "1-2", ()), Option("exclude", "n4", ())],
                   {}, [Option("ntasks", "4", ())])
    request = view.request("train", "abc", None, {"HORUS_MODEL": "bert"}, False, True)
    assert request["op"] == "place" and request["job_class"] == "unknown"
    assert request["tres_per_node"] == "gres:gpu:2" and request["num_nodes"] == 1
    assert request["num_tasks"] == 4 and request["exc_nodes"] == "n4" and request["dry_run"] is True
    assert request["hints"] == {"HORUS_MODEL": "bert"}
