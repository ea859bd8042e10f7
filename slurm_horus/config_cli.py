"""``horus config``: show the resolved site configuration and where each value came from."""

import json

import click

from .config import SETTINGS, load_config


@click.command("config")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
def config_command(as_json):
    """Show every setting, its value and its source (flag, env, file:line, default)."""
    config = load_config()
    if as_json:
        click.echo(json.dumps({n: {"value": getattr(config, n), "source": config.source(n)} for n in SETTINGS},
                              indent=2))
        return
    for name in SETTINGS:
        click.echo(f"{name:22} {str(getattr(config, name)):32} {config.source(name)}")
