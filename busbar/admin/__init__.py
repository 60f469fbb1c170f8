"""The control plane: the admin API on its own listener (site.py: route table, auth, exchange;
api.py: the endpoints; openapi.py), live config swapped in every worker (live.py) over control
channels from the parent (plane.py). SPEC §2.4, §6."""
