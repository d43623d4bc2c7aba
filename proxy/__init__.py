"""islwatch's proxy package: the counting core, the sidecar proxy, the emulator and the parity gate."""

import os

# transformers prints a notice about PyTorch on import; islwatch only needs tokenizers.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
