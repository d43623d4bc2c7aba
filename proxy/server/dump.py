"""Opt-in dumps of mismatching requests (`--dump-mismatches DIR`), for investigating a drift cause.

Token ids and prompt text can reconstruct a user's prompt, so dumps are off by default, bounded
(`max_files`, oldest deleted first), private (directory 0700 when we create it, files 0600, created with
O_EXCL so an existing file or symlink is never followed or overwritten), and never break the caller: a
failed dump is one log line without content.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from proxy.server.problems import ProblemLog

log = logging.getLogger("islwatch.dump")

PREFIX = "mismatch-"
SUFFIX = ".json"


class MismatchDumper:
    """Writes one JSON file per record into `directory`, keeping at most `max_files` of them."""

    def __init__(self, directory: str | os.PathLike[str], max_files: int) -> None:
        self.directory = Path(directory)
        self.max_files = max_files
        self._lock = threading.Lock()  # analysis workers may run in threads
        self._seq = 0
        self._dir_ready = False
        self._problems = ProblemLog(log)  # a full disk fails every dump: one line per 10 s

    def _ensure_dir(self) -> None:
        if self._dir_ready:
            return
        try:
            self.directory.mkdir(mode=0o700, parents=True)
            os.chmod(self.directory, 0o700)  # mkdir's mode is filtered by the umask
        except FileExistsError:
            # A directory the operator made: do not chmod it (it could be /tmp), but say it is readable.
            mode = stat.S_IMODE(self.directory.stat().st_mode)
            if mode & 0o077:
                log.warning("dump directory %s is accessible to other users (mode %o)", self.directory, mode)
        self._dir_ready = True

    def _name(self) -> str:
        # Zero-padded nanoseconds sort by name in write order; pid and a counter keep names unique across
        # analysis processes and within one clock tick.
        self._seq += 1
        return f"{PREFIX}{time.time_ns():020d}-{os.getpid()}-{self._seq:06d}{SUFFIX}"

    def _prune(self) -> None:
        files = sorted(
            p for p in self.directory.iterdir() if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX)
        )
        for old in files[: max(len(files) - self.max_files, 0)]:
            old.unlink(missing_ok=True)  # another analysis process may have pruned it first

    def _write(self, record: dict[str, Any]) -> None:
        data = orjson.dumps(record, default=str, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
        self._ensure_dir()
        path = self.directory / self._name()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(fd, 0o600)  # the umask can only remove bits, but be explicit
            f.write(data)
        self._prune()

    def write(self, record: dict[str, Any]) -> None:
        """Dump one record. A failure of the file system (full, not writable) is logged in one line without
        the record's content; anything else is an islwatch bug and raises (the analysis boundary counts it)."""
        if self.max_files < 1:
            return
        try:
            with self._lock:
                self._write(record)
        except OSError as exc:  # strerror carries no data (the path is the operator's directory)
            self._problems(
                "dump_failed", "mismatch dump to %s failed: %s: %s", self.directory, type(exc).__name__,
                exc.strerror or "",
            )  # fmt: skip
