"""Lab 10: going past one server — parallelism planning, prefill/decode disaggregation, deployment
files validated offline (compose, Kubernetes, Modal) and the framework decision table.

One idea per module: parallel (TP / PP / DP memory and constraints), disagg (pools simulated),
manifests (Kubernetes and compose checks, broken copies), modal_app (the Modal app definition),
frameworks (decision table from the learner's own results).
"""
