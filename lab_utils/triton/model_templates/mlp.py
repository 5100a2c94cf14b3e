"""A small MLP served by Triton's python backend: the model the dynamic-batching cells measure.

Every execution reads all of its weights once, whatever the batch size, so on a CPU (as on a GPU
at small batch) one execution of 8 rows costs little more than one of 1 row. That is the reason
a server batches. Config parameters: HIDDEN (width), LAYERS (hidden layers), SEED.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        hidden, layers = int(params.get("HIDDEN", 1024)), int(params.get("LAYERS", 4))
        width = config["input"][0]["dims"][-1]
        rng = np.random.default_rng(int(params.get("SEED", 0)))
        shapes = [(width, hidden)] + [(hidden, hidden)] * layers + [(hidden, width)]
        # scaled so activations stay O(1) through the stack
        self.weights = [(rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for s in shapes]

    def execute(self, requests):
        # Triton hands over every request the dynamic batcher merged into this execution; each
        # request has its own batch dimension (usually 1). Stack them, run once, split back.
        xs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        h = np.concatenate(xs, axis=0)  # (sum of request batches, width)
        for i, w in enumerate(self.weights):
            h = h @ w
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0.0)
        responses, start = [], 0
        for x in xs:
            y = h[start : start + len(x)]
            start += len(x)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y.astype(np.float32))]))
        return responses
