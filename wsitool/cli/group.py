"""The ``wsitool`` command group: usage errors as one line, signals as 128 + signal number (floor 9)."""

from __future__ import annotations

import sys

import typer
from typer.core import TyperGroup

from .. import signals
from ..version import __version__
from .console import interrupted, usage_line


def click_class(name: str) -> type:
    """click's exception class ``name`` (typer vendors click in recent versions)."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


CLICK_EXCEPTION = click_class("ClickException")


class OneLineUsage(TyperGroup):
    """The command group, printing a usage error as one line (``wsitool: error:
    ...``, exit 2) instead of click's boxed usage block, as the README promises."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Run the command line; usage errors become one line and exit status 2."""
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except CLICK_EXCEPTION as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # bare `wsitool`: the help text
                exc.show()
                code = 2
            else:
                usage_line(exc)
                code = exc.exit_code
        except typer.Abort:
            code = 1
        else:
            code = rv if isinstance(rv, int) else 0

        got = signals.received()
        if got is not None and code != 128 + got:  # a signal outside a command's body
            code = interrupted(128 + got).exit_code  # (a command's handle_errors said it)
        if not standalone_mode:
            return code
        sys.exit(code)


app = typer.Typer(
    cls=OneLineUsage,
    add_completion=False,
    no_args_is_help=True,
    help="Read, convert, serve and stress-test whole-slide images (SVS, NDPI, TIFF, OME-TIFF, DICOM WSI).",
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"wsitool {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Read, convert, serve and stress-test whole-slide images (SVS, NDPI, TIFF, OME-TIFF, DICOM WSI)."""
