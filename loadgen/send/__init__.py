"""Sending: the aiohttp runner, what each reply came to, a run end to end, the proxy's own /metrics."""
