"""Interop tests against a real llama.cpp llama-server (a package so its conftest does not shadow tests/conftest.py)."""
