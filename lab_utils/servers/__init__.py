"""Starting and stopping the servers the course runs: one base (`ServerProcess`), one launcher per
framework (`vllm.py`, `triton.py`, ...). Every process binds 127.0.0.1 and is stopped on exit."""

from .base import ServerProcess, ServerStartError, free_port, running_servers, stop_all
from .engine import EngineServer

__all__ = ["EngineServer", "ServerProcess", "ServerStartError", "free_port", "running_servers", "stop_all"]
