"""Lab 13: the course MoE (upcycled from the course model) and reading its routing from vLLM."""

from .upcycle import MOE_EXPERTS, MOE_TOP_K, build_moe, course_moe_path, moe_ready

__all__ = ["MOE_EXPERTS", "MOE_TOP_K", "build_moe", "course_moe_path", "moe_ready"]
