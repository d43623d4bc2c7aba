"""How a server turns a prepared chat request into token ids. A flavor (core/flavors/) picks one per model:
- `jinja`: the model's chat template, rendered, then tokenized (core/count.py, core/tokens.py, core/fast.py);
- `harmony`: OpenAI's Harmony library builds gpt-oss's prompt as ids (renderers/harmony.py);
- `mistral`: mistral-common encodes the request itself (renderers/mistral.py).
"""

from __future__ import annotations

JINJA = "jinja"
HARMONY = "harmony"
MISTRAL = "mistral"
RENDERERS = (JINJA, HARMONY, MISTRAL)
