"""The gctestbed command line: parse, call, print. Nothing else lives here; each command group has
its module (run_commands, testbed_commands, bench_commands, cluster_commands, shaping_commands,
claims_commands),
the shared flags are in options.py and every table in render.py.

A mistake the user can fix prints one sentence and exits 2; a run that fails exits 1 with its
error; Ctrl-C (or SIGTERM during a run) tears the cluster down and exits 130, in every command:
those that can say more (run, sweep, claims) say it themselves.
"""

from __future__ import annotations

import click
from rich.console import Console

from ..interrupts import Interrupted
from ..spec import UserError

console = Console(stderr=True)


class Cli(click.Group):
    """A group that turns UserError into one line on stderr and exit status 2, and an interruption
    that no command reported into one line and exit status 130."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as e:
            click.echo(f"gctestbed: {e}", err=True)
            ctx.exit(2)
        except (Interrupted, KeyboardInterrupt):   # its finally blocks have run: click's own would say "Aborted!", exit 1
            click.echo("gctestbed: interrupted ('gctestbed clean' removes anything it left behind)", err=True)
            ctx.exit(130)
        except click.UsageError as e:        # click's own (a missing value, a bad choice): one line too
            where = e.ctx.command_path if e.ctx else "gctestbed"
            click.echo(f"gctestbed: {UserError(e.format_message().rstrip('.'))}; see '{where} --help'.", err=True)
            ctx.exit(2)


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gctestbed")
def main() -> None:
    """Measure whether gradient compression speeds up data-parallel training on a shaped network."""



# the command groups register themselves on main
from . import (bench_commands, claims_commands, cluster_commands, run_commands, shaping_commands,  # noqa: E402,F401
               testbed_commands, trace_commands)
