"""Baselines: written only when the gate passes, and every change since is named (template byte, file,
version, revision, mode, ids)."""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path

import pydantic
import pytest

from proxy.core.parity_gate import check
from proxy.core.tokenizer import load_tokenizer
from proxy.parity import baseline as bl
from tests.builders import build_tokenizer
from tests.parity.parity_helpers import llama3_folder, run_cli

# ---- through the CLI ----------------------------------------------------------------------------------


def test_baseline_round_trip_passes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = llama3_folder(tmp_path)
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
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = llama3_folder(tmp_path)
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
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = llama3_folder(tmp_path)
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
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = llama3_folder(tmp_path)
    base = tmp_path / "baseline.json"
    code, out, _ = run_cli(
        capsys, "--tokenizer", str(folder), "--serving-path", "extra-special", "--write-baseline", str(base)
    )
    assert code == 1 and not base.exists() and "baseline not written" in out


# ---- compare ------------------------------------------------------------------------------------------


@cache
def builtin_baseline() -> bl.Baseline:
    loaded = load_tokenizer("builtin:mistral-v0.1")
    return bl.baseline_from(loaded, check(loaded.tokenizer))


def test_compare_reports_versions_revision_mode_and_ids() -> None:
    old = builtin_baseline()
    tok_rec = dataclasses.replace(old.tokenizer, transformers_version="4.57.6", revision="abc")
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


def test_compare_with_itself_finds_nothing() -> None:
    assert bl.compare(builtin_baseline(), builtin_baseline()) == []


def test_compare_refuses_to_compare_ids_of_different_conversations() -> None:
    loaded = load_tokenizer("builtin:mistral-v0.1")
    b = bl.baseline_from(loaded, check(loaded.tokenizer, [[{"role": "user", "content": "other"}]]))
    assert [c.kind for c in bl.compare(builtin_baseline(), b)] == ["conversations"]


# ---- the file -----------------------------------------------------------------------------------------


def test_dump_load_round_trip() -> None:
    old = builtin_baseline()
    assert bl.load(bl.dump(old)) == old


def test_the_tokenizer_record_is_the_identity_plus_the_template() -> None:
    loaded = load_tokenizer("builtin:mistral-v0.1")
    record = builtin_baseline().tokenizer
    assert isinstance(record, type(loaded.identity))
    assert dataclasses.asdict(record) == {
        **dataclasses.asdict(loaded.identity),
        "template": loaded.tokenizer.chat_template,
    }


def test_a_file_with_the_template_key_after_the_sha256_loads() -> None:
    """Baselines written before the record was derived from the identity had this key order."""
    data = json.loads(bl.dump(builtin_baseline()))
    tok = data["tokenizer"]
    order = ["name", "revision", "tokenizer_class", "template_sha256", "template", "files"]
    order += ["transformers_version", "tokenizers_version"]
    data["tokenizer"] = {key: tok[key] for key in order}
    # renderer and template_source came later: a file without them loads with their defaults
    assert list(data["tokenizer"]) == order and set(order) | {"renderer", "template_source"} == set(tok)
    assert bl.load(json.dumps(data).encode()) == builtin_baseline()


@pytest.mark.parametrize("key", ["template", "files", "transformers_version", "tokenizers_version", "name"])
def test_a_file_missing_a_tokenizer_key_does_not_load(key: str) -> None:
    data = json.loads(bl.dump(builtin_baseline()))
    del data["tokenizer"][key]
    with pytest.raises(pydantic.ValidationError) as info:
        bl.load(json.dumps(data).encode())
    assert [(e["loc"], e["type"]) for e in info.value.errors()] == [(("tokenizer", key), "missing")]


@pytest.mark.parametrize("where", ["tokenizer", "mode", None])
def test_a_file_with_an_unknown_key_does_not_load(where: str | None) -> None:
    data = json.loads(bl.dump(builtin_baseline()))
    (data if where is None else data[where])["tokenizer_sha256"] = "0" * 64
    with pytest.raises(pydantic.ValidationError):
        bl.load(json.dumps(data).encode())
