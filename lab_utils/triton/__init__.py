"""Triton model repositories from Python: configs validated against Triton's own protobuf,
repository writing, the course's model recipes, LLM-backend config generators, measurements.

The server launcher is `lab_utils.servers.triton.TritonServer`.
"""

from .config import ConfigError, config_from_dict, config_problems, config_to_dict, validate_config
from .repository import template_source, tree, version_folders, write_model

__all__ = [
    "ConfigError",
    "config_from_dict",
    "config_problems",
    "config_to_dict",
    "template_source",
    "tree",
    "validate_config",
    "version_folders",
    "write_model",
]
