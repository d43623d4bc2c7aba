"""The mismatch dumper: private files, bounded count, oldest first out, never raises."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest

from proxy.server.dump import MismatchDumper


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def dumps(folder: Path) -> list[Path]:
    return sorted(folder.glob("mismatch-*.json"))


def test_files_are_private_and_readable_json(tmp_path: Path) -> None:
    folder = tmp_path / "dumps" / "nested"
    old_umask = os.umask(0o022)  # a typical umask would make files 0644 without care
    try:
        MismatchDumper(folder, 5).write(
            {"cause": "duplicate_bos", "server": 41, "templated": 40, "ids": [1, 1]}
        )
    finally:
        os.umask(old_umask)
    assert mode(folder) == 0o700
    (only,) = dumps(folder)
    assert mode(only) == 0o600
    assert json.loads(only.read_text()) == {
        "cause": "duplicate_bos",
        "server": 41,
        "templated": 40,
        "ids": [1, 1],
    }


def test_keeps_at_most_max_files_deleting_the_oldest(tmp_path: Path) -> None:
    dumper = MismatchDumper(tmp_path, 3)
    for i in range(7):
        dumper.write({"seq": i})
    kept = [json.loads(p.read_text())["seq"] for p in dumps(tmp_path)]
    assert kept == [4, 5, 6]


def test_other_files_in_the_directory_are_left_alone(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    dumper = MismatchDumper(tmp_path, 1)
    dumper.write({"seq": 0})
    dumper.write({"seq": 1})
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert len(dumps(tmp_path)) == 1


def test_an_existing_directory_is_not_chmodded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="islwatch.dump"):
        MismatchDumper(shared, 2).write({"seq": 0})
    assert mode(shared) == 0o755
    assert "accessible to other users" in caplog.text
    assert mode(dumps(shared)[0]) == 0o600


def test_values_json_cannot_encode_are_stringified(tmp_path: Path) -> None:
    MismatchDumper(tmp_path, 2).write({"path": Path("/x"), "ids": (1, 2), 3: "int key"})
    data = json.loads(dumps(tmp_path)[0].read_text())
    assert data == {"path": "/x", "ids": [1, 2], "3": "int key"}


def test_failures_never_raise_and_log_one_line_without_content(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="islwatch.dump"):
        MismatchDumper(blocker / "sub", 3).write({"prompt": "SECRET PROMPT TEXT"})
    assert len(caplog.records) == 1
    assert "SECRET" not in caplog.text and "failed" in caplog.text


def test_unwritable_directory_never_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with caplog.at_level(logging.WARNING, logger="islwatch.dump"):
        MismatchDumper(locked, 3).write({"seq": 0})
    assert "PermissionError" in caplog.text
    locked.chmod(0o700)


def test_zero_max_files_writes_nothing(tmp_path: Path) -> None:
    MismatchDumper(tmp_path / "d", 0).write({"seq": 0})
    assert not (tmp_path / "d").exists()
