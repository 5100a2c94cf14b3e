"""python -m lab_utils.moe: build the course MoE once (nothing to do when it is cached)."""

from lab_utils.moe.upcycle import course_moe_dir, course_moe_path, moe_ready

if moe_ready():
    print(f"course MoE ready in {course_moe_dir()}")
else:
    course_moe_path()
