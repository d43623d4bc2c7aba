"""The drift causes islwatch names (diagnose.py assigns them): the label values of
`islwatch_drift_total{cause}`, and the one rule the event-loop process applies to them. Nothing here
needs a tokenizer or a template engine.
"""

from __future__ import annotations

EXACT = "exact"
DUPLICATE_BOS = "duplicate_bos"
TEMPLATE_NOT_APPLIED = "template_not_applied"
HIDDEN_SYSTEM_PROMPT = "hidden_system_prompt"
GENERATION_PROMPT_MISMATCH = "generation_prompt_mismatch"
TOOLS_UNMODELED = "tools_unmodeled"
MEDIA = "media"
UNKNOWN = "unknown"
# Not from arithmetic: the server parity probe (core/probe.py) found the server tokenizing differently.
SERVER_TOKENIZER_DIFFERS = "server_tokenizer_differs"
CAUSES = (
    EXACT,
    DUPLICATE_BOS,
    TEMPLATE_NOT_APPLIED,
    HIDDEN_SYSTEM_PROMPT,
    GENERATION_PROMPT_MISMATCH,
    TOOLS_UNMODELED,
    MEDIA,
    SERVER_TOKENIZER_DIFFERS,
    UNKNOWN,
)


def with_server_parity(cause: str, server_parity_ok: bool | None) -> str:
    """Drift on a model whose server tokenizes the probe texts differently is explained by that (the probe
    runs in the proxy, outside the per-request analysis): every token of the prompt may count differently,
    so an arithmetic signature (+1, a system-prompt-sized offset) would be a coincidence. Exact stays exact."""
    return SERVER_TOKENIZER_DIFFERS if cause != EXACT and server_parity_ok is False else cause
