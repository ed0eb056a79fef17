"""The embedded ``torch`` engine (see ``engine.py``)."""

from .engine import TorchEngine

__all__ = ["TorchEngine"]
