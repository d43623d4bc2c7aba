"""The parity gate: the normal path passes everywhere; each negative control fails at the right position.

Expected positions are derived from the ids themselves (the BOS id, the role token's text), not from the
code under test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from builders import build_tokenizer, save_tokenizer
from conftest import FAMILIES, load_builtin, load_shared, shared_dir
from transformers import PreTrainedTokenizerFast

from proxy.cli import main
from proxy.core.tokenizer import load_tokenizer
from proxy.parity import baseline as bl
from proxy.parity import gate as p

BUILT = ["chatml", "llama3", "inst", "parts"]
# Tokenizers whose plain encode adds BOS: an extra special-token pass must differ there.
ADDS_BOS = {
    "mistral-7b-instruct-v0.1",
    "llama-3-8b-instruct",
    "tinyllama-1.1b-chat-v1.0",
    "built:llama3",
    "built:inst",
    "builtin",
}
# ... and whose template already wrote BOS: the extra pass duplicates it.
TEMPLATE_BOS = ADDS_BOS - {"tinyllama-1.1b-chat-v1.0"}
NAMES = [*FAMILIES, *(f"built:{s}" for s in BUILT), "builtin"]


@cache
def _built(style: str) -> Any:
    return build_tokenizer(style)


def tokenizer(name: str) -> Any:
    if name == "builtin":
        return load_builtin().tokenizer
    if name.startswith("built:"):
        return _built(name.removeprefix("built:"))
    return load_shared(name).tokenizer


@cache
def report(name: str, serving_path: str = p.SPLIT) -> p.ParityReport:
    return p.check(tokenizer(name), mode=p.RequestMode(serving_path=serving_path))


def gated_failures(rep: p.ParityReport) -> list[p.PathRow]:
    return [
        r for c in rep.conversations for r in c.rows if r.gated and (r.equal is not True or r.duplicate_bos)
    ]


# ---- the normal path ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_normal_path_passes(name: str) -> None:
    rep = report(name)
    assert rep.ok, gated_failures(rep)
    assert rep.checked >= 3
    check = p.startup_self_check(tokenizer(name))
    assert check.ok, check.summary
    assert "\n" not in check.summary


@pytest.mark.parametrize("name", ["llama-3-8b-instruct", "qwen2.5-instruct", "built:chatml", "builtin"])
def test_continue_final_message_mode_passes(name: str) -> None:
    rep = p.check(
        tokenizer(name), mode=p.RequestMode(add_generation_prompt=False, continue_final_message=True)
    )
    assert rep.ok, gated_failures(rep)
    for conv in rep.conversations:
        assert conv.skipped or conv.messages[-1] == p.PREFILL


def test_templates_that_reject_a_system_role_skip_that_conversation() -> None:
    rep = report("built:inst")
    skipped = [c for c in rep.conversations if c.skipped]
    assert [c.messages[0]["role"] for c in skipped] == ["system"]
    assert "template rejects it (TemplateError" in str(skipped[0].skipped)


def test_self_check_summary_has_no_prompt_text() -> None:
    summary = p.startup_self_check(tokenizer("built:llama3")).summary
    texts = [m["content"] for conv in p.BUILTIN_CONVERSATIONS for m in conv]
    assert not any(word in summary for text in texts for word in text.split() if len(word) > 4)
    assert summary.startswith("parity ok") and "duplicates BOS" in summary


# ---- negative controls -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_extra_special_token_pass_is_caught_where_bos_is_added(name: str) -> None:
    tok = tokenizer(name)
    rep = report(name, p.EXTRA_SPECIAL)
    conv = rep.conversations[0]
    direct, extra = conv.row(p.DIRECT), conv.row(p.EXTRA_SPECIAL)
    assert direct is not None and extra is not None and direct.ids is not None and extra.ids is not None
    if name not in ADDS_BOS:
        assert rep.ok and extra.equal  # nothing added: the control rightly sees no difference
        return
    assert not rep.ok
    assert extra.ids[0] == tok.bos_token_id
    if name in TEMPLATE_BOS:
        assert direct.ids[0] == tok.bos_token_id and extra.ids[1] == tok.bos_token_id
        assert extra.first_diff == 1 and extra.duplicate_bos
    else:  # TinyLlama: the template writes no BOS, the pass adds the only one, at the front
        assert direct.ids[0] != tok.bos_token_id
        assert extra.first_diff == 0 and not extra.duplicate_bos
    assert extra.ids[1:] == direct.ids  # the pass adds one BOS at the front and changes nothing else


@pytest.mark.parametrize(
    "name", [n for n in NAMES if n not in ("mistral-7b-instruct-v0.1", "builtin", "built:inst")]
)
def test_wrong_role_prefix_fails_at_the_role_token(name: str) -> None:
    tok = tokenizer(name)
    rep = report(name, p.WRONG_ROLE)
    assert not rep.ok
    for conv in rep.conversations:
        if conv.skipped:
            continue
        direct, wrong = conv.row(p.DIRECT), conv.row(p.WRONG_ROLE)
        assert direct and wrong and direct.ids and wrong.first_diff is not None
        # The first differing token of the correct prompt starts the last "assistant" role name (one token
        # in real vocabularies; a few pieces in the small test-built BPE).
        fd = wrong.first_diff
        assert "ssistant" in tok.decode(direct.ids[fd : fd + 6]), (tok.decode(direct.ids[fd:]), fd)
        assert "ssistant" not in tok.decode(direct.ids[fd:]).split("ssistant", 1)[1]


@pytest.mark.parametrize("name", ["llama-3-8b-instruct", "qwen2.5-instruct", "built:llama3", "built:chatml"])
def test_dropped_generation_prompt_fails_where_it_would_start(name: str) -> None:
    rep = report(name, p.GEN_OFF)
    assert not rep.ok
    for conv in rep.conversations:
        if conv.skipped:
            continue
        direct, off = conv.row(p.DIRECT), conv.row(p.GEN_OFF)
        assert direct and off and direct.ids and off.ids
        assert direct.ids[: len(off.ids)] == off.ids  # a strict prefix: the gen prompt is missing at the end
        assert off.first_diff == len(off.ids)


def test_wrong_role_does_not_apply_to_templates_without_a_generation_prompt() -> None:
    rep = report("builtin", p.WRONG_ROLE)
    row = rep.conversations[0].row(p.WRONG_ROLE)
    assert row is not None and row.ids is None and row.note == "template adds no role header"
    assert not rep.ok  # a serving path that cannot be computed is never a pass


# ---- legitimate repetition vs duplication -------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["mistral-7b-instruct-v0.1", "llama-3-8b-instruct", "qwen2.5-instruct", "built:llama3", "built:inst"],
)
def test_repeated_eos_passes_duplicated_bos_fails(name: str) -> None:
    tok = tokenizer(name)
    eos = tok.eos_token_id
    ok_conv = report(name).conversations[0]
    multi = ok_conv.row(p.MULTI_TURN_SERVING)
    assert multi is not None and multi.ids is not None and multi.equal and multi.gated
    assert list(multi.ids).count(eos) >= 2  # every completed assistant turn closed with EOS
    assert report(name).ok
    bad = report(name, p.EXTRA_SPECIAL)
    bad_multi = bad.conversations[0].row(p.MULTI_TURN_SERVING)
    if name == "qwen2.5-instruct":  # no BOS anywhere: the extra pass is harmless
        assert bad.ok
    else:
        assert not bad.ok and bad_multi is not None and bad_multi.duplicate_bos and bad_multi.first_diff == 1


class ReaddingTokenizer(PreTrainedTokenizerFast):
    """A tokenizer class whose tokenize=True path re-adds special tokens (as some adapters' wrappers do)."""

    def apply_chat_template(self, conversation: Any, tokenize: bool = True, **kw: Any) -> Any:  # type: ignore[override]
        text = super().apply_chat_template(conversation, tokenize=False, **kw)
        return self(text, add_special_tokens=True) if tokenize else text


def test_self_check_fails_when_direct_and_split_disagree() -> None:
    base = build_tokenizer("llama3")
    tok = ReaddingTokenizer(
        tokenizer_object=base.backend_tokenizer, bos_token="<|bos|>", eos_token="<|eot_id|>"
    )
    tok.chat_template = base.chat_template
    check = p.startup_self_check(tok)
    assert not check.ok
    assert "split != direct at position 1" in check.summary


def test_self_check_never_raises() -> None:
    assert p.startup_self_check(object()).ok is False
    tok = build_tokenizer("chatml")
    tok.chat_template = None
    check = p.startup_self_check(tok)
    assert not check.ok and "no chat template" in check.summary
    rejecting = build_tokenizer("chatml")
    rejecting.chat_template = "{{ raise_exception('no') }}"
    check = p.startup_self_check(rejecting)
    assert not check.ok and "rejected all" in check.summary


def test_first_diff() -> None:
    assert p.first_diff([1, 2, 3], [1, 2, 3]) is None
    assert p.first_diff([1, 2, 3], [1, 9, 3]) == 1
    assert p.first_diff([1, 2], [1, 2, 3]) == 2
    assert p.first_diff([], [5]) == 0


# ---- the CLI ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(save_tokenizer("llama3", str(tmp_path_factory.mktemp("llama3"))))


@pytest.fixture
def folder(built_folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built_folder, tmp_path / "tok"))


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["parity", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_passes_on_the_normal_path(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    code, out, _ = run_cli(capsys, "--tokenizer", str(folder))
    assert code == 0, out
    assert "parity PASS" in out and "multi-turn-serving" in out and "extra-special" in out


def test_cli_extra_special_negative_control_exits_1_with_a_token_diff(
    capsys: pytest.CaptureFixture[str], folder: Path
) -> None:
    code, out, _ = run_cli(capsys, "--tokenizer", str(folder), "--serving-path", "extra-special")
    assert code == 1
    assert "extra-special differs from direct at position 1" in out
    assert "duplicated BOS" in out and "'<|bos|>', '<|bos|>'" in out
    assert "parity FAIL" in out


def test_cli_json_report(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    code, out, _ = run_cli(capsys, "--tokenizer", str(folder), "--serving-path", "extra-special", "--json")
    data = json.loads(out)
    assert code == 1 and data["exit_code"] == 1 and not data["ok"]
    row = next(r for r in data["conversations"][0]["rows"] if r["name"] == "extra-special")
    assert row["role"] == "gate" and row["first_diff"] == 1 and row["duplicate_bos"]
    assert data["tokenizer"]["files"]["tokenizer_config.json"]


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
    folder: Path,
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(folder)
    code, _, err = run_cli(capsys, "--tokenizer", str(folder), *argv)
    assert code == 2 and message in err


def test_cli_bad_inputs_exit_2(capsys: pytest.CaptureFixture[str], folder: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    for content, message in [
        ("{", "not valid JSON"),
        ('[{"role": "user"}]', "conversation 0"),
        ("[]", "non-empty"),
    ]:
        bad.write_text(content)
        code, _, err = run_cli(capsys, "--tokenizer", str(folder), "--messages", str(bad))
        assert code == 2 and message in err, err
    code, _, err = run_cli(capsys, "--tokenizer", str(tmp_path / "missing"))
    assert code == 2 and "cannot load tokenizer" in err
    code, _, err = run_cli(capsys, "--tokenizer", str(folder), "--baseline", str(bad))
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


# ---- baselines ----------------------------------------------------------------------------------------


def test_baseline_round_trip_passes(capsys: pytest.CaptureFixture[str], folder: Path, tmp_path: Path) -> None:
    base = tmp_path / "baseline.json"
    assert run_cli(capsys, "--tokenizer", str(folder), "--write-baseline", str(base))[0] == 0
    data = json.loads(base.read_text())
    assert data["tokenizer"]["template_sha256"] and data["tokenizer"]["files"]["tokenizer.json"]
    assert data["mode"] == {
        "add_generation_prompt": True,
        "continue_final_message": False,
        "serving_path": "split",
    }
    assert data["conversations"][0]["paths"]["direct"][0] == build_tokenizer("llama3").bos_token_id
    code, out, _ = run_cli(capsys, "--tokenizer", str(folder), "--baseline", str(base))
    assert code == 0 and "baseline changed" not in out


def test_baseline_catches_a_one_character_template_change(
    capsys: pytest.CaptureFixture[str], folder: Path, tmp_path: Path
) -> None:
    base = tmp_path / "baseline.json"
    template = build_tokenizer("llama3").chat_template
    same, changed = tmp_path / "same.jinja", tmp_path / "changed.jinja"
    same.write_text(template)
    at = template.index("\\n\\n") if "\\n\\n" in template else template.index("\n\n")
    changed.write_text(template[:at] + "\n" + template[at + 1 :].replace("\n", " ", 1))  # "\n\n" -> "\n "
    assert len(changed.read_text()) == len(template) and changed.read_text() != template
    assert (
        run_cli(
            capsys, "--tokenizer", str(folder), "--chat-template", str(same), "--write-baseline", str(base)
        )[0]
        == 0
    )
    code, out, _ = run_cli(
        capsys, "--tokenizer", str(folder), "--chat-template", str(changed), "--baseline", str(base)
    )
    assert code == 1
    assert "template: chat template: sha256" in out and f"first differing byte {at + 1}" in out
    assert "conversation 0 direct: first differing position" in out  # and the ids moved with it


def test_baseline_catches_a_changed_tokenizer_file(
    capsys: pytest.CaptureFixture[str], folder: Path, tmp_path: Path
) -> None:
    base = tmp_path / "baseline.json"
    assert run_cli(capsys, "--tokenizer", str(folder), "--write-baseline", str(base))[0] == 0
    config = folder / "tokenizer_config.json"
    raw = config.read_bytes()
    config.write_bytes(raw.replace(b"{", b"{ ", 1))  # one byte: same JSON, same ids, different file
    code, out, _ = run_cli(capsys, "--tokenizer", str(folder), "--baseline", str(base))
    assert code == 1
    assert "baseline changed: file: tokenizer_config.json: changed: sha256" in out
    assert "baseline changed: ids" not in out and "baseline changed: template" not in out


def test_baseline_is_not_written_when_the_gate_fails(
    capsys: pytest.CaptureFixture[str], folder: Path, tmp_path: Path
) -> None:
    base = tmp_path / "baseline.json"
    code, out, _ = run_cli(
        capsys, "--tokenizer", str(folder), "--serving-path", "extra-special", "--write-baseline", str(base)
    )
    assert code == 1 and not base.exists() and "baseline not written" in out


def test_compare_reports_versions_revision_mode_and_ids() -> None:
    loaded = load_tokenizer("builtin:mistral-v0.1")
    old = bl.baseline_from(loaded, p.check(loaded.tokenizer))
    tok_rec = old.tokenizer.model_copy(update={"transformers_version": "4.57.6", "revision": "abc"})
    conv0 = old.conversations[0]
    ids = list(conv0.paths["direct"] or [])
    ids[3] = 999
    convs = [conv0.model_copy(update={"paths": {**conv0.paths, "direct": ids}}), *old.conversations[1:]]
    mode = old.mode.model_copy(update={"serving_path": "extra-special"})
    changed = old.model_copy(update={"tokenizer": tok_rec, "conversations": convs, "mode": mode})
    changes = {(c.kind, c.what): c.detail for c in bl.compare(changed, old)}
    assert changes[("version", "transformers_version")].startswith("4.57.6 -> 5.")
    assert changes[("revision", "revision")] == "abc -> None"
    assert "serving_path" in changes[("mode", "request mode")]
    assert changes[("ids", "conversation 0 direct")].startswith("first differing position 3: 999 -> ")
    assert bl.compare(old, old) == []
    assert bl.load(bl.dump(old)) == old


def test_compare_refuses_to_compare_ids_of_different_conversations() -> None:
    loaded = load_tokenizer("builtin:mistral-v0.1")
    a = bl.baseline_from(loaded, p.check(loaded.tokenizer))
    b = bl.baseline_from(loaded, p.check(loaded.tokenizer, [[{"role": "user", "content": "other"}]]))
    assert [c.kind for c in bl.compare(a, b)] == ["conversations"]


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
