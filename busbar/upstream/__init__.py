"""Upstream I/O: the keep-alive client pool and egress signing."""
