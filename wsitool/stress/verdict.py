"""The verdict of a stress run: which problems it shows, the most serious one and its exit code (floor 6, consumers).

``leak`` when the memory verdict (:func:`wsitool.stress.memory.memory_verdict`)
is a leak, ``mismatch`` when any verified read differs, ``error`` when any read
raised, ``crash`` when the child died (signal or non-zero exit), ``hang`` when
no iteration completed for ``stall_timeout`` seconds (the child is then
killed), ``inconclusive`` when memory could not be judged (and nothing
crashed).  The report lists all that apply (``problems``); ``verdict`` is the
most serious one in the order crash, hang, mismatch, error, leak,
inconclusive, or ``ok``.

Exit codes of ``wsitool stress`` (:data:`EXIT_CODES`; chosen above the
general codes 1-9 of :mod:`wsitool.cli`): 0 ok, 10 leak, 11 mismatch,
12 read errors, 13 crash, 14 hang, 15 inconclusive.
"""

from __future__ import annotations

from ..ground.signals import signal_name
from .memory import MIB

#: Exit code of each verdict (``wsitool stress``).
EXIT_CODES: dict[str, int] = {"ok": 0, "leak": 10, "mismatch": 11, "error": 12, "crash": 13, "hang": 14,
                              "inconclusive": 15}
SEVERITY = ("crash", "hang", "mismatch", "error", "leak", "inconclusive")


def excerpt(text: str, keep: int = 3000) -> str:
    """Head and tail of ``text`` (the crash header and the last frames)."""
    if len(text) <= 2 * keep:
        return text
    return text[:keep] + "\n[... cut ...]\n" + text[-keep:]


def crash_record(*, status: int, hang: bool, done: dict | None, fatal: str | None, last: dict,
                 stall_timeout: float, stderr_tail: str) -> dict | None:
    """The report's ``crash`` section, or None when the child ended normally.

    ``status`` is the child's exit status (negative: killed by that signal),
    ``hang`` whether the parent killed it for a stall, ``done`` its ``done``
    message (None when it never sent one), ``fatal`` its ``fatal`` error,
    ``last`` its last ``sample`` message (or ``{}``).
    """
    completed = last.get("iterations", 0)
    read_errors = last.get("errors", 0)
    crashed = (status != 0 and not hang) or (done is None and not hang)
    if not (crashed or hang):
        return None
    return {
        "kind": "hang" if hang else ("signal" if status < 0 else "exit"),
        "signal": signal_name(-status) if status < 0 else None,
        "exit_status": status,
        "message": (
            f"no iteration completed for {stall_timeout:g} s; child killed" if hang
            else f"child killed by {signal_name(-status)}" if status < 0
            else f"child exited with status {status}" + (f": {fatal}" if fatal else "")
        ),
        "last_progress": {
            "t": round(last.get("t", 0.0), 4),
            "iterations": completed,
            "rss_mb": round(last.get("rss", 0) / MIB, 3),
            "errors": read_errors,
        },
        "stderr_tail": excerpt(stderr_tail),
    }


def judge(*, crash: dict | None, hang: bool, mismatches: int, read_errors: int,
          memory_verdict: str) -> tuple[list[str], str]:
    """``(problems, verdict)``: every problem that applies, most serious first, and that one (or ``"ok"``)."""
    problems = []
    if crash is not None:
        problems.append("hang" if hang else "crash")
    if mismatches:
        problems.append("mismatch")
    if read_errors:
        problems.append("error")
    if memory_verdict == "leak":
        problems.append("leak")
    elif memory_verdict == "inconclusive" and crash is None:
        problems.append("inconclusive")
    problems.sort(key=SEVERITY.index)
    return problems, (problems[0] if problems else "ok")
