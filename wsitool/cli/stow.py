"""``wsitool stow``: send DICOM files to a DICOMweb service with STOW-RS (floor 9).

A thin layer over :func:`wsitool.formats.dicom.web.store.stow`: the files are streamed from
disk in batches (a progress bar on a terminal's stderr); the report is one line (or JSON),
each instance the server did not store one more line on stderr, and then the error line of
:class:`~wsitool.errors.RemoteStoreError` (exit 19).
"""

from __future__ import annotations

import json
import sys

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from ..formats.dicom.web.store import BATCH_FILES, BATCH_MB, StowReport, stow
from .console import console, err_console, handle_errors, shown, storage_options
from .group import app

#: help of ``--storage-option`` for an upload: the reader's DICOMweb keys.
STOW_OPTION_HELP = ("DICOMweb option KEY=VALUE, repeatable, as for reading a series: token=..., username=..., "
                    "password=..., headers.NAME=VALUE, verify=false, timeout=30, retries=2.")


@app.command("stow")
@handle_errors
def stow_cmd(
    paths: list[str] = typer.Argument(..., help="DICOM Part-10 files, and folders whose DICOM files (directly "
                                                "inside them) are sent."),
    url: str = typer.Argument(..., help="The DICOMweb service: its root (https://host/dicom-web), its /studies, "
                                        "or /studies/{StudyInstanceUID} (every file of that study); dicomweb+ "
                                        "before the scheme is allowed."),
    batch_mb: float = typer.Option(BATCH_MB, "--batch-mb", min=0.001,
                                   help="Most MiB of files in one request (a larger file goes alone)."),
    batch_files: int = typer.Option(BATCH_FILES, "--batch-files", min=1,
                                    help="Most files in one request."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (every instance, stored or not)."),
    storage_option: list[str] | None = typer.Option(None, "--storage-option", metavar="KEY=VALUE",
                                                    help=STOW_OPTION_HELP),
) -> None:
    """Send DICOM files to a DICOMweb server (STOW-RS), streamed from disk.

    One request per batch; each instance is stored only where the server's answer
    lists it as stored. Exit 19 when some were not (each named on stderr), 16 when
    the server refuses the upload, 17 when it fails, hangs or answers past the
    bound, 9 when there is no STOW-RS service at the URL.
    """
    send(paths, url, storage_option, batch_mb=batch_mb, batch_files=batch_files, as_json=as_json)


def send(paths: list[str], url: str, storage_option: list[str] | None, *, batch_mb: float = BATCH_MB,
         batch_files: int = BATCH_FILES, as_json: bool = False) -> None:
    """Send ``paths`` to ``url`` with a progress bar, print the report: ``wsitool stow``, and
    ``export-pyramid --format dicom --stow URL`` after its export.

    Raises:
        RemoteStoreError: some instances were not stored (each named on stderr first).
        InvalidOptionError, RemoteAccessError, RemoteUnavailableError, RemoteNotFoundError: as
            :func:`~wsitool.formats.dicom.web.store.stow`.
    """
    with _progress() as bar:
        task = bar.add_task("stow", total=None)
        report = stow(paths, url, storage_options(storage_option), batch_mb=batch_mb, batch_files=batch_files,
                      progress=lambda sent, total: bar.update(task, completed=sent, total=total))
    _print_report(report, as_json)
    report.raise_for_failures()


def _progress() -> Progress:
    """The bytes sent, on stderr where it is a terminal (nothing otherwise: a pipe or a log keeps one line)."""
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                    TransferSpeedColumn(), TimeRemainingColumn(), console=err_console,
                    disable=not err_console.is_terminal, transient=True)


def _print_report(report: StowReport, as_json: bool) -> None:
    """The summary (or JSON) on stdout; skipped files, warnings and failures on stderr."""
    if report.skipped:
        err_console.print(f"[yellow]wsitool: warning:[/] {len(report.skipped)} file(s) in the folders given are "
                          f"not DICOM Part-10 files, not sent (first: {shown(report.skipped[0])})",
                          highlight=False, soft_wrap=True)
    for inst in report.instances:
        if inst.warning:
            err_console.print(f"[yellow]wsitool: warning:[/] {shown(inst.path)}: stored with {shown(inst.warning)}",
                              highlight=False, soft_wrap=True)
        elif inst.stored is False:
            err_console.print(f"[red]wsitool: not stored:[/] {shown(inst.path)} (SOP Instance UID "
                              f"{shown(inst.sop)}): {shown(inst.reason)}", highlight=False, soft_wrap=True)
    if as_json:
        sys.stdout.write(json.dumps(report.as_dict(), indent=2) + "\n")
    else:
        console.print(shown(report.summary()), highlight=False, soft_wrap=True)
