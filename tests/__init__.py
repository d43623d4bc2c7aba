"""islwatch tests. Helpers are imported one way: `from tests.<folder>.<module> import ...`."""
