"""profiles.csv / observations.csv: round trip, and one clear file:line error per kind of bad input."""

import json

import pytest

from slurm_horus.cli import main
from slurm_horus.errors import InputError
from slurm_horus.interference import (
    Observation, SoloProfile, class_name, gavel_class, load_observations_csv, load_profiles_csv,
    write_observations_csv, write_profiles_csv,
)

PROFILES_HEADER = "job_class,gpu_type,gpu_util,mem_util,gmem_mb,solo_tput\n"
OBSERVATIONS_HEADER = "gpu_type,job_class,corunner_class,norm_tput\n"


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_round_trip_keeps_values_unknowns_and_extra_columns(tmp_path):
    profiles = [SoloProfile("resnet50-bs64", "v100", 90.5, 40.0, 9000.0, 120.25, {"sm_active": 0.7}),
                SoloProfile("lm-bs20", "p100", None, None, None, 3.5)]
    observations = [Observation("v100", "resnet50-bs64", "lm-bs20", 0.0),
                    Observation("v100", "lm-bs20", "resnet50-bs64", 0.6875)]
    write_profiles_csv(tmp_path / "p.csv", profiles)
    write_observations_csv(tmp_path / "o.csv", observations)
    loaded = load_profiles_csv(tmp_path / "p.csv")
    assert loaded[0] == profiles[0]
    assert loaded[1] == SoloProfile("lm-bs20", "p100", None, None, None, 3.5, {})
    assert load_observations_csv(tmp_path / "o.csv") == observations


@pytest.mark.parametrize("body, message", [
    ("resnet-bs8,v100,nan,1,1,1\n", "p.csv:2: gpu_util is not a finite number"),
    ("resnet-bs8,v100,1,1,-5,1\n", "p.csv:2: gmem_mb is negative"),
    ("resnet-bs8,v100,101,1,1,1\n", "p.csv:2: gpu_util is a percentage"),
    ("resnet-bs8,v100,x,1,1,1\n", "p.csv:2: gpu_util is not a number"),
    ("resnet-bs8,V100,1,1,1,1\n", "p.csv:2: gpu_type 'V100' is not a valid GPU type"),
    ("ResNet 8,v100,1,1,1,1\n", "p.csv:2: job_class 'ResNet 8' is not a valid job class"),
    ("a,v100,,,,\na,v100,,,,\n", "p.csv:3: duplicate profile for a on v100 (first at line 2)"),
    ("a,v100,1,1,1,1,7\n", "p.csv:2: more fields than columns"),
])
def test_bad_profile_rows_name_file_and_line(tmp_path, body, message):
    path = _write(tmp_path, "p.csv", PROFILES_HEADER + body)
    with pytest.raises(InputError) as error:
        load_profiles_csv(path)
    assert str(error.value).startswith(str(tmp_path / message.split(":")[0]) + ":" + message.split(":", 1)[1])


def test_missing_columns_are_named(tmp_path):
    path = _write(tmp_path, "o.csv", "gpu_type,job_class,norm_tput\nv100,a,0.5\n")
    with pytest.raises(InputError, match=r"o.csv:1: missing column\(s\): corunner_class"):
        load_observations_csv(path)


@pytest.mark.parametrize("row, message", [
    ("v100,a,b,\n", "norm_tput is empty"),
    ("v100,a,b,-0.1\n", "norm_tput is negative"),
    ("v100,a,b,inf\n", "norm_tput is not a finite number"),
    ("v100,,b,0.5\n", "job_class is empty"),
])
def test_bad_observation_rows(tmp_path, row, message):
    path = _write(tmp_path, "o.csv", OBSERVATIONS_HEADER + "v100,a,b,0.5\n" + row)
    with pytest.raises(InputError, match=f"o.csv:3: {message}"):
        load_observations_csv(path)


def test_class_names():
    assert gavel_class("ResNet-18 (batch size 64)") == "resnet18-bs64"
    assert gavel_class("A3C") == "a3c"
    assert gavel_class("Recommendation (batch size 8192)") == "recommendation-bs8192"
    assert class_name("BERT", 32, amp=True, dataset="SQuAD") == "bert-squad-bs32-amp"


# -- the CLI: bad input is one line on stderr and exit status 2 ----------------------------------

def _run(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def _small_files(tmp_path, gpu="v100"):
    profiles = _write(tmp_path, "p.csv", PROFILES_HEADER + f"a-bs1,{gpu},50,20,1000,10\nb-bs1,{gpu},30,10,1000,20\n")
    rows = "".join(f"{gpu},{t},{c},{0.5 + 0.1 * (t < c)}\n" for t in ("a-bs1", "b-bs1") for c in ("a-bs1", "b-bs1"))
    observations = _write(tmp_path, "o.csv", OBSERVATIONS_HEADER + rows)
    return profiles, observations


def test_cli_unknown_gpu_type_in_a_file_is_one_line_exit_2(tmp_path, capsys):
    profiles, observations = _small_files(tmp_path, gpu="mystery")
    code, out, err = _run(["model", "predict", "a-bs1", "b-bs1", "--gpu-type", "mystery",
                           "--profiles", str(profiles), "--observations", str(observations)], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"horus: {profiles}:2: unknown GPU type 'mystery'")


def test_cli_unknown_gpu_type_becomes_known_with_its_memory(tmp_path, capsys):
    profiles, observations = _small_files(tmp_path, gpu="mystery")
    code, out, err = _run(["model", "predict", "a-bs1", "b-bs1", "--gpu-type", "mystery", "--gpu-memory-mb",
                           "mystery=8000", "--profiles", str(profiles), "--observations", str(observations)], capsys)
    assert code == 0, err
    assert out.splitlines()[0].split("\t")[1:] == ["0.600", "1.67x", "measured"]


def test_cli_unknown_gpu_type_flag_is_one_line_exit_2(capsys):
    code, out, err = _run(["model", "predict", "a3c", "lm-bs20", "--gpu-type", "quantum9"], capsys)
    assert code == 2 and err.count("\n") == 1 and "unknown GPU type 'quantum9'" in err


def test_cli_missing_column_is_one_line_exit_2(tmp_path, capsys):
    profiles, _ = _small_files(tmp_path)
    bad = _write(tmp_path, "bad.csv", "gpu_type,job_class,norm_tput\nv100,a-bs1,0.5\n")
    code, out, err = _run(["model", "eval", "--profiles", str(profiles), "--observations", str(bad),
                           "--holdout", str(bad)], capsys)
    assert code == 2
    assert err == f"horus: {bad}:1: missing column(s): corunner_class\n"


def test_cli_eval_writes_scores_per_predictor(tmp_path, capsys):
    profiles, observations = _small_files(tmp_path)
    out_json = tmp_path / "scores.json"
    code, out, err = _run(["model", "eval", "--profiles", str(profiles), "--observations", str(observations),
                           "--holdout", str(observations), "--predictor", "measured", "--predictor", "chain",
                           "--json", str(out_json)], capsys)
    assert code == 0, err
    scores = json.loads(out_json.read_text())["predictors"]
    assert set(scores) == {"measured", "chain"}
    assert scores["measured"]["mae"] == pytest.approx(0.0, abs=1e-9)
    assert scores["measured"]["coverage"] == 1.0
    assert {"mae", "rmse", "spearman", "infeasible_predicted_feasible", "coverage"} <= set(scores["chain"])


def test_cli_fit_stores_a_model_that_loads_back(tmp_path, capsys):
    from slurm_horus.interference import model_from_dict
    from slurm_horus.store.models import load_model

    profiles, observations = _small_files(tmp_path)
    db = tmp_path / "horus.db"
    code, out, err = _run(["model", "fit", "--db", str(db), "--profiles", str(profiles),
                           "--observations", str(observations)], capsys)
    assert code == 0, err
    model_id, name, created, state = load_model(db)
    assert (model_id, name) == (1, "chain")
    assert model_from_dict(state).explain("a-bs1", ["b-bs1"], "v100").norm_tput == pytest.approx(0.6)


def test_cli_classes_lists_what_the_model_knows_per_gpu_type(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HORUS_DB", str(tmp_path / "absent.db"))  # no site model: the built-in priors
    code, out, err = _run(["model", "classes", "--gpu-type", "v100", "--json"], capsys)
    assert code == 0, err
    listed = json.loads(out)
    rows = {r["job_class"]: r for r in listed["classes"]}
    assert "built-in priors" in listed["model"] and {r["gpu_type"] for r in listed["classes"]} == {"v100"}
    assert rows["resnet50-bs64"]["measured_pairs"] > 0 and rows["resnet50-bs64"]["solo_tput"] > 0
    assert not (tmp_path / "absent.db").exists()
    code, _, err = _run(["model", "classes", "--gpu-type", "a100"], capsys)
    assert code == 2 and err == "horus: --gpu-type a100: the model knows p100, v100\n"
    # a model stored by a fit (as a refit stores one) is the one listed
    profiles, observations = _small_files(tmp_path)
    db = tmp_path / "horus.db"
    assert _run(["model", "fit", "--db", str(db), "--profiles", str(profiles), "--observations",
                 str(observations)], capsys)[0] == 0
    code, out, _ = _run(["model", "classes", "--db", str(db)], capsys)
    assert code == 0 and out.startswith("model: #1 (chain, ") and "\na-bs1 " in out and "\nb-bs1 " in out
    code, _, err = _run(["model", "classes", "--db", str(tmp_path / "no" / "h.db")], capsys)
    assert code == 2 and "no history database" in err and not (tmp_path / "no").exists()
