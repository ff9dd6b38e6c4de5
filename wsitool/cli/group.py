"""The ``wsitool`` command group: usage errors as one line, signals as 128 + signal number (floor 9)."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator, Sequence
from typing import Any, cast

import typer
from typer.core import TyperGroup

from ..ground import signals
from ..version import __version__
from .console import interrupted, interruption_said, usage_line


def click_class(name: str) -> type[Exception]:
    """click's exception class ``name`` (typer vendors click in recent versions)."""
    return cast("type[Exception]", next(c for c in typer.BadParameter.__mro__ if c.__name__ == name))


#: click's ClickException (its ``show()`` and ``exit_code`` used below; typed Any: the class
#: is found at run time, in typer's vendored click or in click itself)
CLICK_EXCEPTION: Any = click_class("ClickException")


def metavar_for(param) -> str:
    """The metavariable help shows for ``param`` when it names none (issue 26: users
    expect ``SLIDE``, ``PATH...``, ``N``, not type labels such as ``<list[Path]>``
    or ``{slide}``): an argument's name in capitals, an option's kind of value
    (``N``, ``NUMBER``, ``PATH``, ``TEXT``, ``a|b``), nothing for a flag; ``...``
    where it takes several values."""
    if param.param_type_name == "argument":
        return param.name.upper()
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    desc = getattr(param, "type_descriptor", None)
    if desc is None:  # a plain click parameter
        return {"integer": "N", "float": "NUMBER", "path": "PATH"}.get(
            getattr(getattr(param, "type", None), "name", ""), "TEXT")
    if desc.is_choice:
        return "|".join(str(c) for c in desc.choices or ())
    if desc.is_path:
        kind = "PATH"
    elif desc.is_ranged:
        kind = "N" if desc.ranged_type_name == "int" else "NUMBER"
    else:
        kind = {"int": "N", "float": "NUMBER"}.get(param.bare_type().replace("list[", "").rstrip("]"), "TEXT")
    return kind + ("..." if desc.is_list or param.nargs == -1 else "")


#: The narrowest help layout: below it typer cut option names ("--regi…" at 40 columns);
#: a narrower terminal folds the lines instead.
HELP_MIN_WIDTH = 80


@contextlib.contextmanager
def help_width() -> Iterator[None]:
    """Lay help out at the terminal's width ($COLUMNS, else 80 in a pipe), at least
    :data:`HELP_MIN_WIDTH` columns, for the block (typer's ``TERMINAL_WIDTH`` wins)."""
    import typer.rich_utils as rich_utils
    from rich.console import Console

    before = rich_utils.MAX_WIDTH
    if before is None and Console().width < HELP_MIN_WIDTH:
        rich_utils.MAX_WIDTH = HELP_MIN_WIDTH
    try:
        yield
    finally:
        rich_utils.MAX_WIDTH = before


def with_metavars(command):
    """``command`` (a click command) with :func:`metavar_for` set on every parameter
    that names no metavariable of its own; arguments show as ``SLIDE`` in the usage
    line (``[SLIDE]`` optional, ``SLIDE...`` several) and without a type column."""
    for param in getattr(command, "params", ()):
        if param.metavar is None:
            param.metavar = metavar_for(param)
        if param.param_type_name == "argument":
            name = param.metavar + ("..." if param.nargs != 1 and not param.metavar.endswith("...")
                                    else "")
            piece = name if param.required else f"[{name}]"
            param.get_usage_pieces = lambda ctx, piece=piece: [piece]
            param.display_type_rich = lambda ctx: None
    help_option = getattr(command, "get_help_option", None)
    if help_option is not None and not getattr(command, "_wsitool_metavars", False):
        def get_help_option(ctx, _orig=help_option):  # --help: a flag, no value shown
            opt = _orig(ctx)
            if opt is not None and opt.metavar is None:
                opt.metavar = ""
            return opt
        command.get_help_option = get_help_option

        def format_help(ctx, formatter, _orig=command.format_help):  # never narrower than 80 columns
            with help_width():
                return _orig(ctx, formatter)
        command.format_help = format_help
        command._wsitool_metavars = True
    return command


#: The largest magnitude of a number on the command line (that of a signed 64-bit integer): no
#: count, size, position or seed means anything beyond it, and past it Python's conversions
#: fail in places (float(), numpy, indices) with a type error instead of a usage error.
NUMBER_LIMIT = 2**63 - 1


def _out_of_range(value) -> str | None:
    """Why the converted option ``value`` (a number, or a tuple of them) is refused, or None."""
    for v in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(v, bool):
            continue
        if isinstance(v, int) and abs(v) > NUMBER_LIMIT:  # (the digits are not echoed: there may be 4,000)
            return f"a number of {len(str(abs(v)))} digits, out of range (at most {NUMBER_LIMIT})"
        if isinstance(v, float) and not math.isfinite(v):
            return f"{v} is not a finite number"
    return None


def bounded_numbers(command):
    """``command`` (a click command) with each parameter's converted value checked: an integer
    beyond :data:`NUMBER_LIMIT` or a float that is not finite (``1e999``, 400 nines, ``nan``) is a
    usage error (one line, exit 2)."""
    for param in getattr(command, "params", ()):
        if getattr(param, "_wsitool_bounded", False):
            continue

        def process_value(ctx, value, _orig=param.process_value, _param=param):
            value = _orig(ctx, value)
            why = _out_of_range(value)
            if why:
                raise typer.BadParameter(why, ctx=ctx, param=_param)
            return value
        param.process_value = process_value
        param._wsitool_bounded = True
    return command


class OneLineUsage(TyperGroup):
    """The command group, printing a usage error as one line (``wsitool: error:
    ...``, exit 2) instead of click's boxed usage block, as the docs promise;
    help shows metavariables (:func:`with_metavars`)."""

    def get_command(self, ctx, cmd_name):
        """The subcommand ``cmd_name``, its parameters given metavariables and bounded numbers."""
        return with_metavars(bounded_numbers(super().get_command(ctx, cmd_name)))

    def format_help(self, ctx, formatter):
        with_metavars(self)
        with help_width():
            return super().format_help(ctx, formatter)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, windows_expand_args: bool = True,
             **extra: Any) -> Any:
        """Run the command line; usage errors become one line and exit status 2."""
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, windows_expand_args=windows_expand_args, **extra)
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
        # a signal outside a command's body (typer turns a KeyboardInterrupt there, e.g. in its
        # own imports at start-up, into exit 130 without a word); in one, handle_errors said it
        if got is not None and (code != 128 + got or not interruption_said()):
            code = interrupted(128 + got).exit_code
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
