"""The course model (SmolLM2-135M-Instruct) in Triton's python backend, with transformers on CPU.

One file, four jobs, chosen by the config parameter MODE, so the ensemble's parts and the
all-in-one model share one tokenizer call and one greedy loop (and so give the same text):

    MODE "text"        text_input (STRING) [, max_tokens] -> text_output (STRING)
                       decoupled config: one response per new piece of text (streaming)
    MODE "tokenize"    text_input                         -> input_ids (INT64, prompt tokens)
    MODE "generate"    input_ids [, max_tokens]           -> output_ids (INT64, new tokens only)
    MODE "detokenize"  output_ids                         -> text_output

Other parameters: MODEL_DIR (the Hugging Face folder), CHAT ("true": wrap text in the chat
template), MAX_TOKENS (default when a request sends none), THREADS (torch threads; 1 by default,
because every loaded model is its own stub process and they all share the machine's cores:
busy-waiting thread pools in several processes on 2 cores ran 3-4x slower than one thread each). Requests are served one at a time, the
way a python-backend model runs unless it batches by hand: Triton's LLM backends (vLLM,
TensorRT-LLM) do in-flight batching inside the backend instead.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.mode = params.get("MODE", "text")
        self.chat = params.get("CHAT", "true").lower() == "true"
        self.default_max_tokens = int(params.get("MAX_TOKENS", 32))
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.tokenizer = AutoTokenizer.from_pretrained(params["MODEL_DIR"])
        self.model = None
        if self.mode in ("text", "generate"):
            import torch
            from transformers import AutoModelForCausalLM

            self.torch = torch
            torch.set_num_threads(int(params.get("THREADS", 1)))
            self.model = AutoModelForCausalLM.from_pretrained(params["MODEL_DIR"], dtype=torch.float32)
            self.model.eval()
        eos = self.tokenizer.eos_token_id
        self.stop_ids = set(eos if isinstance(eos, list) else [eos])

    # -- the pieces ------------------------------------------------------------------------
    def prompt_ids(self, text):
        if self.chat:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def greedy(self, ids, max_tokens):
        """Yield new token ids one by one (greedy, KV cache reused between steps)."""
        torch = self.torch
        with torch.inference_mode():
            step_input, past = torch.tensor([list(ids)]), None  # (1, prompt_len)
            for _ in range(max_tokens):
                out = self.model(input_ids=step_input, past_key_values=past, use_cache=True)
                past = out.past_key_values
                token = int(out.logits[0, -1].argmax())
                if token in self.stop_ids:
                    return
                yield token
                step_input = torch.tensor([[token]])  # (1, 1): only the new token from now on

    def decode(self, ids):
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # -- Triton entry point ----------------------------------------------------------------
    def execute(self, requests):
        responses = []
        for request in requests:
            sender = request.get_response_sender() if self.decoupled else None
            try:
                if sender is not None:
                    self.stream(request, sender)
                    continue
                responses.append(pb_utils.InferenceResponse(self.run(request)))
            except Exception as exc:  # report to the client instead of killing the stub
                error = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{type(exc).__name__}: {exc}"))
                if sender is not None:
                    sender.send(error, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    responses.append(error)
        return None if self.decoupled else responses

    def _max_tokens(self, request):
        t = pb_utils.get_input_tensor_by_name(request, "max_tokens")
        return int(t.as_numpy().reshape(-1)[0]) if t is not None else self.default_max_tokens

    def _text(self, request):
        raw = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def run(self, request):
        if self.mode == "tokenize":
            ids = np.array(self.prompt_ids(self._text(request)), dtype=np.int64)
            return [pb_utils.Tensor("input_ids", ids)]
        if self.mode == "generate":
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1)
            new = list(self.greedy(ids.tolist(), self._max_tokens(request)))
            return [pb_utils.Tensor("output_ids", np.array(new, dtype=np.int64))]
        if self.mode == "detokenize":
            ids = pb_utils.get_input_tensor_by_name(request, "output_ids").as_numpy().reshape(-1)
            return [pb_utils.Tensor("text_output", np.array([self.decode(ids).encode()], dtype=object))]
        new = list(self.greedy(self.prompt_ids(self._text(request)), self._max_tokens(request)))
        return [pb_utils.Tensor("text_output", np.array([self.decode(new).encode()], dtype=object))]

    def stream(self, request, sender):
        """Decoupled: send each new piece of text as its own response, then a final flag."""
        new, sent = [], ""
        for token in self.greedy(self.prompt_ids(self._text(request)), self._max_tokens(request)):
            new.append(token)
            text = self.decode(new)
            if text.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
                continue
            piece, sent = text[len(sent) :], text
            if piece:
                sender.send(
                    pb_utils.InferenceResponse(
                        [pb_utils.Tensor("text_output", np.array([piece.encode()], dtype=object))]
                    )
                )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
