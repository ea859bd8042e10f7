"""``horus model``: fit, score and query the interference model from the command line."""

import json

import click

from ..errors import InputError
from . import PREDICTORS, build_model, builtin_priors, load_observations_csv, load_profiles_csv, explain_set
from .evaluate import evaluate
from .gpus import gpu_memory_mb, memory_from_profiles

METRICS = ("mae", "rmse", "spearman", "infeasible_predicted_feasible", "coverage")


def _memory_sizes(pairs):
    sizes = {}
    for text in pairs:
        gpu, sep, mb = text.partition("=")
        try:
            value = float(mb)
        except ValueError:
            value = -1.0
        if not sep or not gpu or value <= 0:
            raise InputError(f"--gpu-memory-mb: expected TYPE=MB (e.g. a100=40960), got {text!r}")
        sizes[gpu.strip()] = value
    return sizes


def _check_gpu_types(path, rows, sizes):
    """Every GPU type in a file must have a known memory size (line = row index + 2: header first)."""
    for number, row in enumerate(rows, start=2):
        try:
            gpu_memory_mb(row.gpu_type, sizes)
        except InputError as exc:
            raise InputError(f"{path}:{number}: {exc}") from None


def _inputs(profiles_path, observations_path, memory_pairs):
    """(profiles, observations, memory sizes): the given files, else the built-in Gavel priors."""
    if profiles_path is None and observations_path is None:
        profiles, observations = builtin_priors()
    else:
        profiles = load_profiles_csv(profiles_path) if profiles_path else []
        observations = load_observations_csv(observations_path) if observations_path else []
    sizes = memory_from_profiles(profiles)
    sizes.update(_memory_sizes(memory_pairs))
    if profiles_path:
        _check_gpu_types(profiles_path, profiles, sizes)
    if observations_path:
        _check_gpu_types(observations_path, observations, sizes)
    return profiles, observations, sizes


_profiles_option = click.option("--profiles", type=click.Path(dir_okay=False), help="profiles.csv")
_observations_option = click.option("--observations", type=click.Path(dir_okay=False), help="observations.csv")
_memory_option = click.option("--gpu-memory-mb", "memory_pairs", multiple=True, metavar="TYPE=MB",
                              help="memory of one GPU of TYPE (repeatable); overrides the built-in sizes")
_predictor_choice = click.Choice(sorted(PREDICTORS))


@click.group("model")
def model():
    """Fit, score and query the interference model (default inputs: built-in Gavel priors)."""


@model.command("eval")
@click.option("--profiles", type=click.Path(dir_okay=False), required=True, help="profiles.csv")
@click.option("--observations", type=click.Path(dir_okay=False), required=True, help="training observations.csv")
@click.option("--holdout", type=click.Path(dir_okay=False), required=True, help="observations.csv to score on")
@click.option("--predictor", "predictors", multiple=True, type=_predictor_choice,
              help="predictor to score (repeatable; default: all)")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="also write the scores as JSON here")
@_memory_option
def eval_command(profiles, observations, holdout, predictors, json_out, memory_pairs):
    """Fit each predictor on OBSERVATIONS and score it on HOLDOUT."""
    profile_rows, train, sizes = _inputs(profiles, observations, memory_pairs)
    test = load_observations_csv(holdout)
    _check_gpu_types(holdout, test, sizes)
    scores = {}
    for name in predictors or sorted(PREDICTORS):
        scores[name] = evaluate(build_model(name, profile_rows, train, gpu_memory_mb=sizes), test)
    click.echo(f"{'predictor':<12} " + " ".join(f"{m:>12.12}" for m in METRICS))
    for name, result in scores.items():
        click.echo(f"{name:<12} " + " ".join(f"{result[m]:>12.4f}" for m in METRICS))
    if json_out:
        with open(json_out, "w") as handle:
            json.dump({"predictors": scores, "n": len(test)}, handle, indent=2)


@model.command("predict")
@click.argument("target")
@click.argument("corunners", nargs=-1)
@click.option("--gpu-type", required=True, help="GPU type, e.g. v100")
@_profiles_option
@_observations_option
@click.option("--predictor", default="chain", type=_predictor_choice, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of text")
@_memory_option
def predict_command(target, corunners, gpu_type, profiles, observations, predictor, as_json, memory_pairs):
    """Normalized throughput of TARGET (and of each co-runner) sharing one GPU."""
    profile_rows, observation_rows, sizes = _inputs(profiles, observations, memory_pairs)
    gpu_memory_mb(gpu_type, sizes)  # an unknown GPU type is an error, not a guess
    fitted = build_model(predictor, profile_rows, observation_rows, gpu_memory_mb=sizes)
    jobs = [target] + list(corunners)
    answers = explain_set(fitted, jobs, gpu_type)
    if as_json:
        click.echo(json.dumps({"gpu_type": gpu_type, "jobs": [
            {"job_class": job, "norm_tput": a.norm_tput, "source": a.source} for job, a in zip(jobs, answers)]}))
        return
    for job, answer in zip(jobs, answers):
        slowdown = f"{1 / answer.norm_tput:.2f}x" if answer.norm_tput > 0 else "cannot run"
        click.echo(f"{job}\t{answer.norm_tput:.3f}\t{slowdown}\t{answer.source}")


@model.command("fit")
@click.option("--db", required=True, type=click.Path(dir_okay=False), help="SQLite history database")
@_profiles_option
@_observations_option
@click.option("--predictor", default="chain", type=_predictor_choice, show_default=True)
@_memory_option
def fit_command(db, profiles, observations, predictor, memory_pairs):
    """Fit a predictor and store it in the history database (table ``models``)."""
    from ..store.models import save_model

    profile_rows, observation_rows, sizes = _inputs(profiles, observations, memory_pairs)
    fitted = build_model(predictor, profile_rows, observation_rows, gpu_memory_mb=sizes)
    model_id = save_model(db, predictor, fitted.to_dict())
    click.echo(f"stored model {model_id} ({predictor}: {len(profile_rows)} profiles, "
               f"{len(observation_rows)} observations) in {db}")


@model.command("classes")
@click.option("--gpu-type", "gpu_types", multiple=True, help="only this GPU type (repeatable)")
@click.option("--db", "db_path", help="history database holding a refitted model (default: the site config's db; "
                                      "without one: the built-in priors)")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables")
def classes_command(gpu_types, db_path, as_json):
    """The job classes the model knows, per GPU type, and what it knows of each: the class's own
    solo profile, pairs measured with it, partners it has an answer for, partners it cannot fit beside."""
    from .model import class_summary

    fitted, origin = _site_model(db_path)
    unknown = sorted(set(gpu_types) - set(fitted.gpu_types))
    if unknown:
        raise InputError(f"--gpu-type {', '.join(unknown)}: the model knows {', '.join(fitted.gpu_types)}")
    rows = class_summary(fitted, list(gpu_types) or None)
    if as_json:
        click.echo(json.dumps({"model": origin, "classes": rows}))
        return
    click.echo(f"model: {origin}")
    for gpu in list(gpu_types) or fitted.gpu_types:
        mine = [r for r in rows if r["gpu_type"] == gpu]
        click.echo(f"\n{gpu}: {len(mine)} classes (profile: GPU util %, memory util %, peak MB, solo throughput)")
        click.echo(f"{'class':<24} {'util%':>6} {'mem%':>6} {'peak MB':>8} {'solo tput':>10} {'measured':>9} "
                   f"{'partners known':>15} {'cannot share':>13}")
        for r in mine:
            cells = [_cell(r["gpu_util"], "{:.0f}"), _cell(r["mem_util"], "{:.0f}"), _cell(r["gmem_mb"], "{:.0f}"),
                     _cell(r["solo_tput"], "{:.4g}")]
            click.echo(f"{r['job_class']:<24} {cells[0]:>6} {cells[1]:>6} {cells[2]:>8} {cells[3]:>10} "
                       f"{r['measured_pairs']:>9} {str(r['partners_known']) + ' of ' + str(r['partners']):>15} "
                       f"{r['cannot_share_with']:>13}")


def _cell(value, fmt):
    return "-" if value is None else fmt.format(value)


def _site_model(db_path):
    """(fitted model, where it came from): the newest model stored in the history database, as horusd
    uses it, else the built-in priors. A database that does not exist is not created."""
    import os

    from ..config import load_config
    from ..store.db import default_db_path

    path = db_path or default_db_path(load_config())
    if db_path or os.path.isfile(path):
        from ..store.db import open_db
        from ..store.models import load_model
        from .model import model_from_dict

        stored = load_model(open_db(path, create=False))
        if stored is not None:
            model_id, name, created, state = stored
            return model_from_dict(state), f"#{model_id} ({name}, {created}) from {path}"
    return build_model("chain"), "the built-in priors (Gavel's measured V100 and P100 pairs; no site model stored)"
