"""`islwatch demo`: the scenes, running them, what they print, the verdicts and the parity gate's view."""
