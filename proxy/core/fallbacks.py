"""Why a fast-path shortcut (fast.py) is off although it applies: the label values of
`islwatch_fast_path_fallbacks_total{reason}`. Here, not in fast.py, so that the event-loop process can name
them without importing a tokenizer, a template engine or an image library (tests/layout/test_footprint.py).
"""

from __future__ import annotations

# Its proof raised or its output differed from the reference, or transformers' template compiler is missing.
# Each one costs speed, never a count: the reference takes over. The core records the reasons
# (`FastEncoder.fallbacks`); the server counts them and logs each reason once.
FALLBACK_REASONS = (
    "direct_raised",
    "direct_differs",
    "reuse_raised",
    "reuse_differs",
    "render_raised",
    "render_differs",
    "template_compiler_missing",
)
