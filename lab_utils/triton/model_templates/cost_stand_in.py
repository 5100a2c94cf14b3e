"""A stand-in for a model's cost: each execution sleeps FIXED_S + PER_ITEM_S x (rows in the batch).

It computes nothing (y = x). Lab 03 uses it to put Triton's real dynamic batcher in front of a model
whose execution time is known exactly, the cost model of the simulator's scenario, so the batcher
is what gets measured. Sleeping rather than computing keeps that time the same on a busy machine.
Config parameters: FIXED_S and PER_ITEM_S, in seconds.
"""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.fixed_s = float(params.get("FIXED_S", 0.004))
        self.per_item_s = float(params.get("PER_ITEM_S", 0.001))

    def execute(self, requests):
        start = time.perf_counter()
        # every request the dynamic batcher merged into this execution; each has its own batch rows
        xs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        deadline = start + self.fixed_s + self.per_item_s * sum(len(x) for x in xs)
        while (left := deadline - time.perf_counter()) > 0:  # sleep() may wake early on a signal
            time.sleep(left)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]) for x in xs]
