"""linnet.serve: the engine (continuous batching over fixed cache rows) and the OpenAI-compatible server."""

from linnet.serve.engine import Engine
from linnet.serve.request import Completion, EngineSettingError, Request, RequestError
from linnet.serve.stats import Stats

__all__ = ["Completion", "Engine", "EngineSettingError", "Request", "RequestError", "Stats"]
