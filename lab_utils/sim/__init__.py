"""Batching simulator for lab 03: workloads, a step cost model, static / continuous / dynamic batching, metrics.

Nothing heavy is imported here: numpy only inside the functions that draw random numbers or take
percentiles, torch and transformers only inside `calibrate` and `traces`.
"""

from .cost import StepCostModel
from .metrics import SLO, Metrics, goodput, percentile, slot_utilisation, summarize, sweep_load
from .policies import ContinuousBatching, DynamicBatching, StaticBatching
from .results import RequestRecord, Residency, SimResult, StepRecord
from .scheduler import BlockCounter, SchedulerOutput, SchedulerState, SimRequest, reference_schedule
from .simulator import simulate
from .workload import LengthDist, WorkloadRequest, fixed_workload, poisson_workload, seed_scenario

__all__ = [
    "SLO",
    "BlockCounter",
    "ContinuousBatching",
    "DynamicBatching",
    "LengthDist",
    "Metrics",
    "RequestRecord",
    "Residency",
    "SchedulerOutput",
    "SchedulerState",
    "SimRequest",
    "SimResult",
    "StaticBatching",
    "StepCostModel",
    "StepRecord",
    "WorkloadRequest",
    "fixed_workload",
    "goodput",
    "percentile",
    "poisson_workload",
    "reference_schedule",
    "seed_scenario",
    "simulate",
    "slot_utilisation",
    "summarize",
    "sweep_load",
]
