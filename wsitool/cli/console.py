"""Terminal output of the CLI: the consoles, one-line errors and warnings, and exit codes by
exception class (floor 9)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable

import typer
from rich.console import Console
from rich.markup import escape

from .. import errors
from ..ground import signals
from ..ground.limits import limits
from ..storage.urls import redact_text


def usage_line(exc) -> None:
    """Print a click usage error as ``wsitool: error: <command>: <message>``."""
    message = redact_text(" ".join(exc.format_message().split()).replace("Value error, ", "").rstrip("."))
    ctx = getattr(exc, "ctx", None)
    param = getattr(exc, "param", None)
    if param is not None and (getattr(param, "nargs", 1) or 1) > 1 and getattr(param, "opts", None):
        metavar = getattr(param, "metavar", None) or " ".join(["N"] * param.nargs)
        message += f" (give {param.nargs} integers separated by spaces: {param.opts[0]} {metavar})"
    where = ctx.command_path.replace("wsitool ", "", 1) if ctx is not None and ctx.parent else ""
    hint = f" (see 'wsitool {where} --help')" if where else " (see 'wsitool --help')"
    err_console.print(f"[bold red]wsitool: error:[/] {escape(f'{where}: ' if where else '')}"
                      f"{escape(message)}{escape(hint)}", highlight=False, soft_wrap=True)


def terminal_width(stream) -> int | None:
    return None if stream.isatty() or os.environ.get("COLUMNS") else 200


# soft_wrap: a message is one line whatever the terminal's width (a long path in it is never
# split: grep and the tests find the whole line); the terminal folds it for the eye, not rich.
# Reports laid out for a person (info, the stress table) use fitted_console() instead.
console = Console(width=terminal_width(sys.stdout), soft_wrap=True)


err_console = Console(stderr=True, width=terminal_width(sys.stderr), soft_wrap=True)


def fitted_console() -> Console:
    """The console for reports a person reads (``info``, the stress summary): the
    terminal's width; in a pipe or file $COLUMNS, else 80 columns (not the 200 of
    :data:`console`, whose one-line messages are meant for grep)."""
    if console.is_terminal:
        return console
    try:
        width = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        width = 0
    return Console(file=sys.stdout, width=width if width > 0 else 80)


EXIT_CODES: list[tuple[type[BaseException], int]] = [
    (errors.OutputIsSourceError, 2),  # usage: an output that is the source slide
    (errors.InvalidOptionError, 2),  # usage: an option out of range or clashing with another
    (errors.OutputExistsError, 9),  # an existing output without --overwrite
    (errors.UnsupportedFormatError, 3),
    (errors.CorruptFileError, 4),
    (errors.InvalidRegionError, 5),
    (errors.ResourceLimitError, 6),
    (errors.TileDecodeError, 7),
    (errors.DeviceUnavailableError, 8),
    (errors.RemoteNotFoundError, 9),  # a URL naming no object, as a missing file
    (errors.RemoteAccessError, 16),  # denied, expired credentials or presigned URL
    (errors.RemoteUnavailableError, 17),  # the remote source failed after its retries
    (errors.RemoteChangedError, 18),  # the object changed on the server while open
    (errors.RemoteStoreError, 19),  # a DICOMweb server did not store every instance sent (STOW-RS)
    (errors.WsiError, 1),
    (FileNotFoundError, 9),
    (OSError, 9),
]


def exit_code_for(exc: BaseException) -> int:
    """The documented exit code of an exception (1 if not a known class)."""
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return 1


def shown(text) -> str:
    """``text`` (a name, path or message) ready for a rich print to a terminal: every
    ``scheme://`` in it without its user information and query
    (:func:`wsitool.storage.urls.redact_text`: ``ftp://user:PW@host`` too, which no reader
    takes), control characters escaped (:func:`wsitool.errors.printable`) and rich markup escaped."""
    return escape(errors.printable(redact_text(str(text))))


def fail(message: str, code: int) -> typer.Exit:
    """Print one error line to stderr and return the Exit to raise."""
    with contextlib.suppress(OSError):  # no terminal any more (SIGHUP), a closed pipe: the exit code still tells
        err_console.print(f"[bold red]wsitool: error:[/] {shown(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


#: Whether :func:`interrupted` printed its line (in this process).
_interrupted_said = False


def interrupted(code: int) -> typer.Exit:
    """After SIGINT / SIGTERM / SIGHUP (exit status ``code`` = 128 + signal): remove this
    process's partial outputs, print the one "interrupted" line, return the Exit to raise."""
    global _interrupted_said
    _interrupted_said = True
    signals.cleanup_partials()
    return fail("interrupted" if code == 130 else f"interrupted by {signals.signal_name(code - 128)}", code)


def interruption_said() -> bool:
    """Whether the "interrupted" line was printed (:func:`interrupted`)."""
    return _interrupted_said


def handle_errors(func: Callable) -> Callable:
    """Decorator mapping expected exceptions to one line and an exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            try:
                return func(*args, **kwargs)
            except typer.Exit:
                raise
            except BaseException as exc:
                # Ctrl-C, or SIGTERM / SIGHUP (wsitool.ground.signals); also whatever a library turned
                # the interruption into (an extension module's import: "initialization failed")
                if isinstance(exc, KeyboardInterrupt) or signals.received() is not None:
                    raise interrupted(signals.exit_code(exc)) from None
                raise
        except MemoryError:
            raise fail("out of memory (ENOMEM)", 9) from None
        except (errors.WsiError, OSError) as exc:
            if isinstance(exc, errors.OutputExistsError) and \
                    exc.strerror == errors.OutputExistsError.API_REASON:  # CLI words, not the API's
                message = f"{exc.filename}: {errors.OutputExistsError.CLI_REASON}"
            elif isinstance(exc, OSError) and not isinstance(exc, errors.WsiError):
                name = getattr(exc, "filename", None)
                # an empty path ("", an unset shell variable) is named too: ''
                where = f"{name}: " if name else "'': " if name == "" else ""
                message = f"{where}{exc.strerror or exc}"
            else:
                message = str(exc)
            raise fail(message, exit_code_for(exc)) from None

    return wrapper


#: help of the repeatable ``--storage-option`` of the commands that read a slide
SCENE_HELP = ("Zeiss CZI: read scene N alone (0, 1, ...; info lists them). Default: every scene on one canvas, "
              "as OpenSlide shows the slide.")

STORAGE_OPTION_HELP = ("For a slide URL (http(s)://, s3://, gs://, az://): KEY=VALUE passed to the remote reader, "
                       "repeatable (e.g. anon=true, endpoint_url=http://host:9000, timeout=30, "
                       "headers.Authorization='Bearer ...'); VALUE is read as JSON when it parses, else as text.")


def storage_options(items: list | None) -> dict | None:
    """The ``--storage-option KEY=VALUE`` items as a dict (None when there are none).

    VALUE is JSON when it parses as JSON (``true``, ``30``, ``{"a": 1}``), else the text;
    a number stays text where JSON would write it otherwise (``1.50``, ``1e3``), so an option
    that takes text (a secret, :func:`wsitool.storage.remote.options.option_text`) gets what was typed.
    A dotted KEY (``headers.Authorization``) makes nested dicts.  A malformed item
    raises the usage Exit (code 2).
    """
    if not items:
        return None
    import json

    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise fail(f"--storage-option {item.split('=')[0]!r}: expected KEY=VALUE", 2)
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if isinstance(value, (int, float)) and not isinstance(value, bool) and json.dumps(value) != raw.strip():
            value = raw  # a number that reads back otherwise ("1.50", "1e3", "-0"): its text, unchanged
        *parents, leaf = key.split(".")
        node = out
        for name in parents:
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise fail(f"--storage-option {key}: {name} is both a value and a group", 2)
        node[leaf] = value
    return out


def max_pixels_scope(max_pixels: int | None):
    """Context manager applying ``--max-pixels`` (pixels per region) for one command."""


    if max_pixels is None:
        return contextlib.nullcontext()
    if max_pixels <= 0:
        raise fail("--max-pixels must be positive", 2)
    return limits(max_region_pixels=max_pixels, max_region_bytes=max(max_pixels * 8, 2**31))


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Print a Python warning as one ``wsitool: warning:`` line on stderr."""
    err_console.print(f"[yellow]wsitool: warning:[/] {shown(message)}", highlight=False, soft_wrap=True)


