"""A Responses request that continues a stored response (`previous_response_id`) has its conversation in the
server's response store: vLLM prepends it (responses/serving.py `_make_request`). islwatch cannot see it, so
the request is named `history_on_server`, on the Jinja path and the Harmony path alike, never counted as if
the body were the whole prompt (that would be drift on every such request)."""

from __future__ import annotations

import pytest

from proxy.core.count import HISTORY_ON_SERVER
from proxy.core.model import load_served_model
from tests.conftest import shared_dir


@pytest.mark.parametrize("family", ["qwen3", "gpt-oss"])
def test_previous_response_id_is_history_on_server(family: str, tmp_path) -> None:
    folder = shared_dir(family)
    if family == "gpt-oss":  # served with Harmony: vLLM keys it on config.json's model_type
        for f in folder.iterdir():
            (tmp_path / f.name).symlink_to(f)
        (tmp_path / "config.json").write_text('{"model_type": "gpt_oss"}')
        folder = tmp_path
    model = load_served_model(str(folder), "vllm")
    body = {"model": "m", "input": "And then?"}
    alone = model.count("responses", body)
    assert alone.fallback_reason is None and alone.expected_server
    continued = model.count("responses", {**body, "previous_response_id": "resp_abc"})
    assert continued.fallback_reason == HISTORY_ON_SERVER
    assert continued.expected_server is None
