"""Runtime helpers the proxy, the loadgen, the tests and the benches share: the event loop (loop.py), heap
tuning (heap.py), the pooled-connection retry (pooled.py) and `islwatch` child processes (children.py).

Nothing here imports proxy.server or loadgen: the arrows point into this package, never out of it.
"""
