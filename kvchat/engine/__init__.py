"""The engine: sessions over one loaded model that turn documents and questions into events."""

from kvchat.engine.core import Engine
from kvchat.engine.settings import METHODS, AskSettings

__all__ = ["METHODS", "AskSettings", "Engine"]
