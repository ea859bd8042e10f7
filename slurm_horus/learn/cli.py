"""``horus model-refit``: derive observations from history and refit the interference model."""

import json

import click

from ..config import load_config
from ..store.db import default_db_path, open_db


@click.command("model-refit")
@click.option("--db", "db_path", help="history database (default: the site config's db)")
@click.option("--predictor", default="chain", show_default=True, help="interference predictor to fit")
@click.option("--gpu-type", default="v100", show_default=True,
              help="GPU type of nodes whose GPU name the collector has not recorded")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
def model_refit(db_path, predictor, gpu_type, as_json):
    """Refit the model on priors + this site's co-location history; show error before and after."""
    from .loop import refit

    db = open_db(db_path or default_db_path(load_config()))
    result = refit(db, predictor=predictor, default_gpu_type=gpu_type)
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
        return
    click.echo(f"model {result['model_id']} ({predictor}) fitted with {result['n_observations']} local "
               f"observations")
    if result["rejected"] or result["held"]:
        click.echo(f"left out: {len(result['rejected'])} outlier observations, {len(result['held'])} pairs that "
                   "only one user observed far from Gavel's measurement")
    if result["n_observations"]:
        before, after = result["before"], result["after"]
        click.echo(f"error on local observations: MAE {before['mae']:.3f} -> {after['mae']:.3f}, "
                   f"RMSE {before['rmse']:.3f} -> {after['rmse']:.3f}")
        for pair in result["pairs"][:20]:
            click.echo(f"  {pair['gpu_type']} {pair['job_class']} with {pair['corunner_class']}: observed "
                       f"{pair['observed']:.3f}, predicted {pair['before']:.3f} -> {pair['after']:.3f}")
