"""Routing: a name -> a Target (pool or model) -> a Lane by smooth weighted round robin."""
from .swrr import Lane, Router, Target

__all__ = ["Lane", "Router", "Target"]
