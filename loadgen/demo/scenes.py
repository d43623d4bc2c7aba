"""The scenes of `islwatch demo`: what each one breaks on the server, and what islwatch must say about it.

Standard library only: `islwatch demo --help` lists the scene names from here without loading anything.
Every scene runs the same load through the same proxy (Mistral v0.1, counted as vLLM would count it); only
the emulator behind it changes, the way a real serving stack goes wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

# The server's template in the template-swap scene: Mistral v0.1's own, with a default system prompt
# folded into the first user turn (v0.1 has no system role; later Mistral templates fold it in this way).
# Somebody edited the server's template, the client never sent this text, and the model sees it anyway.
HIDDEN_SYSTEM_PROMPT = "You are a helpful assistant.\n\n"
SWAPPED_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + ('" + HIDDEN_SYSTEM_PROMPT.replace("\n", "\\n") + "' if loop.first else '') "
    "+ message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{% endfor %}"
)


@dataclass(frozen=True)
class Scene:
    name: str  # `--scene NAME`
    title: str  # what the operator is looking at
    faults: tuple[str, ...] = ()  # the emulator's `--fault` specs
    server_template: str | None = None  # a template the server renders instead of the proxy's
    serving_path: str = "split"  # what the parity gate is told the serving adapter does
    loadgen_report: bool = False  # print the loadgen's full report (target vs achieved), not just the verdict
    # What the proxy's /metrics must show; the demo exits 1 when they show something else.
    expect_cause: str = "exact"
    expect_alerts: tuple[str, ...] = ()


SCENES = (
    Scene(
        "correct",
        "A correct deployment: the server renders the template islwatch renders",
        loadgen_report=True,
    ),
    Scene(
        "double-bos",
        "A serving adapter that adds a second BOS (it re-encodes the rendered prompt with special tokens)",
        faults=("double-bos",),
        serving_path="extra-special",
        expect_cause="duplicate_bos",
        expect_alerts=("IslwatchDuplicateBOS", "IslwatchTokenDrift"),
    ),
    Scene(
        "template-swap",
        "A template changed on the server: it now adds a hidden system prompt to the first user turn",
        server_template=SWAPPED_TEMPLATE,
        expect_cause="hidden_system_prompt",
        expect_alerts=("IslwatchTokenDrift",),
    ),
)
SCENE_NAMES = tuple(s.name for s in SCENES)


def selected(name: str | None) -> tuple[Scene, ...]:
    """The scene called `name`, or all of them in story order."""
    return SCENES if name is None else tuple(s for s in SCENES if s.name == name)
