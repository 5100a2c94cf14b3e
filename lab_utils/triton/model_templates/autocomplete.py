"""A python-backend model whose inputs and outputs come from model.py, not from config.pbtxt.

Triton calls `auto_complete_config` before loading, and fills in whatever config.pbtxt left out.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [-1]})
        auto_complete_model_config.add_output({"name": "total", "data_type": "TYPE_FP32", "dims": [1]})
        auto_complete_model_config.set_max_batch_size(0)
        return auto_complete_model_config

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            out.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("total", np.array([x.sum()], dtype=np.float32))])
            )
        return out
