"""responses-gateway: the OpenAI Responses API in front of Chat/Completions servers."""

__version__ = "0.1.0"
