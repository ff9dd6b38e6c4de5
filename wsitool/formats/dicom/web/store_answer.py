"""A STOW-RS answer read per instance (floor 3).

A DICOMweb server answers a STOW-RS request with the Store Instances Response Module in DICOM
JSON (PS3.18 10.5.3): ReferencedSOPSequence (0008,1199) lists the instances stored (each with
its Referenced SOP Instance UID (0008,1155) and, where stored with a warning, Warning Reason
(0008,1196)), FailedSOPSequence (0008,1198) those not stored, each with its Failure Reason
(0008,1197).  :class:`StowInstance` is one file sent and what the answer said of it;
:func:`parse_answer` reads the answer's JSON, :func:`judge_answer` marks each
instance of the request: stored only where the answer lists it as stored (a failure listed
wins), so an answer that leaves an instance out (an HTTP 200 listing fewer than were sent)
leaves it not stored, with the reason said.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["StowInstance", "REFERENCED", "FAILED", "FAILURE_REASONS", "parse_answer", "judge_answer", "reason_text"]

#: ReferencedSOPSequence, FailedSOPSequence (DICOM JSON keys).
REFERENCED, FAILED = "00081199", "00081198"
_SOP, _FAILURE, _WARNING = "00081155", "00081197", "00081196"

#: Failure and warning reasons of PS3.18 Table 10.5.3-2 and PS3.4 (Storage), in words.
FAILURE_REASONS = {
    0x0110: "processing failure", 0x0111: "duplicate SOP instance", 0x0112: "no such object instance",
    0x0117: "invalid object instance", 0x0118: "no such SOP class", 0x0119: "class-instance conflict",
    0x0122: "SOP class not supported", 0x0124: "refused: not authorized", 0x0210: "duplicate invocation",
    0x0211: "unrecognized operation", 0x0212: "mistyped argument", 0x0213: "resource limitation",
    0xA700: "out of resources", 0xA900: "data set does not match SOP class",
    0xB000: "coercion of data elements", 0xB006: "elements discarded", 0xB007: "data set does not match SOP class",
    0xC000: "cannot understand", 0xC122: "referenced transfer syntax not supported",
}


@dataclasses.dataclass
class StowInstance:
    """One file sent (or to send) and what the server said of it.

    Attributes:
        path: the file, as given or found in a folder.
        sop: its SOP Instance UID (the key the server's answer is matched by).
        study: its Study Instance UID.
        size: its size in bytes.
        stored: True once the server's answer lists it as stored; False where it lists
            it as failed, or leaves it out; None before its batch was answered.
        reason: why it was not stored (None when stored or not yet sent).
        warning: the server's warning for a stored instance (Warning Reason, 0008,1196), or None.
    """

    path: str
    sop: str
    study: str
    size: int
    stored: bool | None = None
    reason: str | None = None
    warning: str | None = None


def reason_text(code: Any) -> str:
    """A Failure or Warning Reason in words: ``failure reason 0xA700 (out of resources)``."""
    if isinstance(code, bool) or not isinstance(code, int):
        return f"failure reason {str(code)[:40]!r}" if code is not None else "no failure reason given"
    name = FAILURE_REASONS.get(code) or ("out of resources" if 0xA700 <= code <= 0xA7FF else
                                         "cannot understand" if 0xC000 <= code <= 0xCFFF else None)
    return f"failure reason 0x{code:04X}" + (f" ({name})" if name else "")


def parse_answer(data: bytes) -> dict | None:
    """The DICOM JSON object of a STOW-RS answer's body; None where it is empty or not a
    JSON object (a list holding one object is taken as that object)."""
    if not data.strip():
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if isinstance(doc, list) and len(doc) == 1:
        doc = doc[0]
    return doc if isinstance(doc, dict) else None


def _items(doc: dict, tag: str) -> list[dict]:
    element = doc.get(tag)
    value = element.get("Value") if isinstance(element, dict) else None
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _first(item: dict, tag: str) -> Any:
    element = item.get(tag)
    value = element.get("Value") if isinstance(element, dict) else None
    return value[0] if isinstance(value, list) and value else None


def judge_answer(batch: Sequence[StowInstance], status: int, doc: dict | None) -> None:
    """Mark each instance of ``batch`` (``stored``, ``reason``, ``warning``) from the answer
    ``doc`` (:func:`parse_answer`) of HTTP ``status``."""
    by_sop: dict[str, list[StowInstance]] = {}
    for inst in batch:
        inst.stored, inst.reason, inst.warning = None, None, None
        by_sop.setdefault(inst.sop, []).append(inst)
    if doc is not None:
        for item in _items(doc, REFERENCED):
            for inst in by_sop.get(str(_first(item, _SOP)), []):
                inst.stored = True
                warning = _first(item, _WARNING)
                if warning is not None:
                    inst.warning = reason_text(warning).replace("failure reason", "warning reason")
        for item in _items(doc, FAILED):
            for inst in by_sop.get(str(_first(item, _SOP)), []):
                inst.stored = False
                inst.reason = f"the server did not store it: {reason_text(_first(item, _FAILURE))} (HTTP {status})"
    for inst in batch:
        if inst.stored is None:
            inst.stored = False
            inst.reason = (f"not listed as stored in the server's answer (HTTP {status})" if doc is not None else
                           f"the server's answer (HTTP {status}) is not DICOM JSON: not confirmed as stored")
