"""`islwatch parity`: exit codes, the text and JSON reports, usage errors, and a light `--help`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.core.parity_paths import ROWS
from tests.builders import save_tokenizer
from tests.conftest import shared_dir
from tests.parity.parity_helpers import llama3_folder, run_cli


def test_cli_passes_on_the_normal_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run_cli(capsys, "--tokenizer", str(llama3_folder(tmp_path)))
    assert code == 0, out
    assert "parity PASS" in out and "multi-turn-serving" in out and "extra-special" in out


def test_cli_extra_special_negative_control_exits_1_with_a_token_diff(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run_cli(
        capsys, "--tokenizer", str(llama3_folder(tmp_path)), "--serving-path", "extra-special"
    )
    assert code == 1
    assert "extra-special differs from direct at position 1" in out
    assert "duplicated BOS" in out and "'<|bos|>', '<|bos|>'" in out
    assert "parity FAIL" in out


def test_cli_json_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = llama3_folder(tmp_path)
    code, out, _ = run_cli(capsys, "--tokenizer", str(folder), "--serving-path", "extra-special", "--json")
    data = json.loads(out)
    assert code == 1 and data["exit_code"] == 1 and not data["ok"]
    row = next(r for r in data["conversations"][0]["rows"] if r["name"] == "extra-special")
    assert row["role"] == "gate" and row["first_diff"] == 1 and row["duplicate_bos"]
    assert data["tokenizer"]["files"]["tokenizer_config.json"]


REPORT_KEYS = [
    "ok",
    "exit_code",
    "tokenizer",
    "mode",
    "plain_special_tokens",
    "template_emits_bos",
    "blind_controls",
    "conversations",
    "baseline_changes",
    "baseline_written",
]
ROW_KEYS = [
    "name",
    "reference",
    "tokens",
    "equal",
    "first_diff",
    "special_positions",
    "duplicate_bos",
    "role",
    "note",
    "ids",
]


def test_cli_json_report_keys(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run_cli(capsys, "--tokenizer", str(llama3_folder(tmp_path)), "--json")
    data = json.loads(out)
    assert code == 0 and list(data) == REPORT_KEYS
    assert data["mode"] == {
        "add_generation_prompt": True,
        "continue_final_message": False,
        "serving_path": "split",
    }
    assert (
        data["blind_controls"] == [] and data["baseline_changes"] == [] and data["baseline_written"] is None
    )
    conv = data["conversations"][0]
    assert list(conv) == ["index", "ok", "skipped", "rows"] and conv["ok"] and conv["skipped"] is None
    assert [r["name"] for r in conv["rows"]] == [name for name, _ in ROWS]
    for row in conv["rows"]:
        assert list(row) == ROW_KEYS
        assert row["tokens"] == len(row["ids"])
        assert row["role"] in ("gate", "control", "info")


def test_cli_json_report_lists_baseline_changes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = llama3_folder(tmp_path)
    base = tmp_path / "baseline.json"
    assert run_cli(capsys, "--tokenizer", str(folder), "--write-baseline", str(base), "--json")[0] == 0
    (folder / "tokenizer_config.json").write_bytes((folder / "tokenizer_config.json").read_bytes() + b" ")
    code, out, _ = run_cli(capsys, "--tokenizer", str(folder), "--baseline", str(base), "--json")
    data = json.loads(out)
    assert code == 1 and not data["ok"]
    [change] = data["baseline_changes"]
    assert list(change) == ["kind", "what", "detail"]
    assert change["kind"] == "file" and change["what"] == "tokenizer_config.json"


def test_cli_json_report_names_the_written_baseline(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    base = tmp_path / "baseline.json"
    code, out, _ = run_cli(
        capsys, "--tokenizer", str(llama3_folder(tmp_path)), "--write-baseline", str(base), "--json"
    )
    assert code == 0 and json.loads(out)["baseline_written"] == str(base) and base.exists()


# ---- usage errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--continue-final-message", "--generation-prompt"], "contradict"),
        (["--no-generation-prompt", "--serving-path", "wrong-role"], "needs a generation prompt"),
        (["--baseline", "b.json", "--write-baseline", "b.json"], "same file"),
        (["--messages", "/nonexistent/m.json"], "cannot read"),
    ],
)
def test_cli_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = llama3_folder(tmp_path)
    monkeypatch.chdir(folder)
    code, _, err = run_cli(capsys, "--tokenizer", str(folder), *argv)
    assert code == 2 and message in err


@pytest.mark.parametrize(
    ("content", "message"),
    [("{", "not valid JSON"), ('[{"role": "user"}]', "conversation 0"), ("[]", "non-empty")],
)
def test_cli_bad_messages_file_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    code, _, err = run_cli(capsys, "--tokenizer", str(llama3_folder(tmp_path)), "--messages", str(bad))
    assert code == 2 and message in err, err


def test_cli_tokenizer_that_does_not_load_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "--tokenizer", str(tmp_path / "missing"))
    assert code == 2 and "cannot load tokenizer" in err


def test_cli_bad_baseline_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    code, _, err = run_cli(capsys, "--tokenizer", str(llama3_folder(tmp_path)), "--baseline", str(bad))
    assert code == 2 and "not an islwatch parity baseline" in err


def test_cli_user_conversations_the_template_rejects_fail(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    msgs = tmp_path / "m.json"
    msgs.write_text(
        json.dumps(
            [
                [{"role": "user", "content": "hi"}],
                [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}],
            ]
        )
    )
    inst = save_tokenizer("inst", str(tmp_path / "inst"))
    code, out, _ = run_cli(capsys, "--tokenizer", inst, "--messages", str(msgs))
    assert code == 1
    assert "conversation 1: split could not be compared" in out


# ---- the installed command ----------------------------------------------------------------------------


def test_installed_command_runs(tmp_path: Path) -> None:
    """The real console entry point, in a subprocess, with a shared tokenizer when present."""
    try:
        target = str(shared_dir("llama-3-8b-instruct"))
    except pytest.skip.Exception:
        target = save_tokenizer("llama3", str(tmp_path / "tok"))
    proc = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "parity", "--tokenizer", target, "--serving-path", "extra-special"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "differs from direct at position 1" in proc.stdout


CONFIGURE_ONLY = """
import argparse, sys
from proxy.cli import parity
parser = argparse.ArgumentParser()
parity.configure(parser)
parser.parse_args(["--tokenizer", "x"])
print(sorted(m for m in ("transformers", "tokenizers", "rich", "pydantic") if m in sys.modules))
"""


def test_configure_imports_no_heavy_module() -> None:
    """`islwatch parity --help` must answer without loading transformers, rich or pydantic."""
    proc = subprocess.run(
        [sys.executable, "-c", CONFIGURE_ONLY], capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout.strip() == "[]", proc.stderr
