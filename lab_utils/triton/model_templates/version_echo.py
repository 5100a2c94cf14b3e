"""Answers with its own version number: shows which versions of a model Triton is serving."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            out.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("version", np.full_like(x, self.version, dtype=np.int32))]
                )
            )
        return out
