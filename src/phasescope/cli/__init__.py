"""Command line: `phasescope COMMAND`. Each command lives in its own module in this package."""

from __future__ import annotations

import sys
from importlib import import_module

import click

from phasescope.errors import PhasescopeError
from phasescope.version import __version__

# command name -> module in phasescope.cli that defines `command` (a click.Command).
_COMMANDS: dict[str, str] = {
    "top": "top",
    "record": "record",
    "classify": "classify",
    "eval": "evaluate",
    "train-model": "train_model",
    "demo": "demo",
    "run": "run",
    "scrape": "scrape",
    "cost": "cost",
    "verify": "verify", "audit": "audit", "ledger": "ledger",
    "serve": "serve",
    "fleet": "fleet",
    "report": "report",
}
DEFAULT_COMMAND = "top"  # what `phasescope` alone runs, with that command's options


class _LazyGroup(click.Group):
    """Imports a command's module only when that command runs, so `phasescope --help` stays fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = _COMMANDS.get(cmd_name)
        if module is None:
            return None
        try:
            mod = import_module(f"phasescope.cli.{module}")
        except ModuleNotFoundError as exc:
            if exc.name == f"phasescope.cli.{module}":
                return None
            raise
        cmd: click.Command = mod.command
        return cmd

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """`phasescope --once` is `phasescope top --once`: without a command, an option the group itself does
        not have (--help, --version) is `top`'s, as the bare command runs `top` (and hints such as "run with
        --source host" name its options)."""
        if args[:1] == ["-h"]:  # not top's unknown option (as forwarding it would say): the help asked for
            args = ["--help", *args[1:]]
        if args and args[0] != "--" and args[0].startswith("-"):
            own = {opt for param in self.get_params(ctx) for opt in (*param.opts, *param.secondary_opts)}
            if args[0].split("=", 1)[0] not in own:
                args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)


@click.group(cls=_LazyGroup, invoke_without_command=True)
@click.version_option(__version__, prog_name="phasescope")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Phase-aware observability for AI accelerators: training, inference, other compute or idle.

    Without a command, runs `top`, and takes its options: `phasescope --once`, `phasescope --source host`.
    """
    if ctx.invoked_subcommand is None:
        top = cli.get_command(ctx, DEFAULT_COMMAND)
        if top is None:
            click.echo(ctx.get_help())
            return
        ctx.invoke(top)


def usage_line(exc: click.UsageError) -> str:
    """A usage error as one line and the hint (click prints a four-line block): `phasescope classify: Missing
    argument 'PATHS...' (see 'phasescope classify --help')`."""
    path = exc.ctx.command_path if exc.ctx is not None else "phasescope"
    message = exc.format_message()
    return f"{path}: {message.rstrip('.')} (see '{path} --help')"


def main(argv: list[str] | None = None) -> int:
    """Entry point: a PhasescopeError becomes one line on stderr and a non-zero exit, never a traceback."""
    try:
        cli.main(args=argv, prog_name="phasescope", standalone_mode=False)
    except PhasescopeError as exc:
        click.echo(f"phasescope: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("phasescope: aborted", err=True)
        return 130
    except click.UsageError as exc:
        click.echo(usage_line(exc), err=True)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
