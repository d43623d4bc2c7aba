"""Cache-bust markers and where they land. Pure.

A marker makes each conversation's prompt unique so a server's prefix cache cannot serve it from an earlier
conversation; its hex is derived from the run id and the conversation id, so a run is reproducible and two
runs never share a prefix.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Any

SEPARATOR = "\n\n"


class CacheBust(StrEnum):
    NONE = "none"
    FIRST_TURN_PREFIX = "first_turn_prefix"
    FIRST_TURN_SUFFIX = "first_turn_suffix"
    SYSTEM_PREFIX = "system_prefix"
    SYSTEM_SUFFIX = "system_suffix"

    @property
    def prefix(self) -> bool:
        return self.value.endswith("_prefix")


class Landing(StrEnum):
    NOWHERE = "nowhere"
    SYSTEM = "system"
    FIRST_USER = "first_user"


def marker_for(run_id: str, conversation_id: str) -> str:
    digest = hashlib.sha256(f"{run_id}/{conversation_id}".encode()).hexdigest()
    return f"[rid:{digest[:12]}]"


def landing(target: CacheBust, has_system_prompt: bool) -> Landing:
    """The landing-rule table of issue 5: system targets fall back to the first user turn."""
    if target is CacheBust.NONE:
        return Landing.NOWHERE
    if target in (CacheBust.SYSTEM_PREFIX, CacheBust.SYSTEM_SUFFIX) and has_system_prompt:
        return Landing.SYSTEM
    return Landing.FIRST_USER


def apply_marker(content: Any, marker: str, prefix: bool) -> tuple[Any, bool]:
    """Content with the marker added, and whether it was. Never mutates `content`.

    A string gets `marker + "\\n\\n"` in front or `"\\n\\n" + marker` behind; a list of parts gets a new text
    part at the start or the end; any other shape is returned unchanged (the caller warns once).
    """
    if isinstance(content, str):
        return (f"{marker}{SEPARATOR}{content}" if prefix else f"{content}{SEPARATOR}{marker}"), True
    if isinstance(content, list):
        part = {"type": "text", "text": marker}
        return ([part, *content] if prefix else [*content, part]), True
    return content, False
