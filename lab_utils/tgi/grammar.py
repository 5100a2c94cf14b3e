"""Constrained decoding for TGI's `grammar` parameter: a token mask applied to the logits at every step.

TGI accepts `{"type": "json", "value": <JSON schema>}`, `{"type": "json_schema", "value":
{"name", "schema", "strict"}}` and `{"type": "regex", "value": "<regex>"}` (router/src/lib.rs,
`GrammarType`). The stand-in compiles the grammar with xgrammar (installed with vLLM) and, before
every sampling step, sets to -inf the logit of every token that would break it. The output is
valid by construction, not repaired afterwards.
"""

from __future__ import annotations

import json
import re
from typing import Any


class GrammarError(ValueError):
    """The grammar cannot be used (TGI answers 422 "grammar is not valid: ...")."""


class GrammarCompiler:
    """Compiles TGI grammars for one tokenizer; compiled grammars are cached by xgrammar."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)

    def compile(self, grammar: Any):
        """A compiled grammar for a TGI `grammar` object; raises GrammarError with TGI's reasons."""
        if not isinstance(grammar, dict) or set(grammar) - {"type", "value"} or "type" not in grammar:
            raise GrammarError(
                'grammar must be an object {"type": "json"|"json_schema"|"regex", "value": ...}'
            )
        kind, value = grammar["type"], grammar.get("value")
        try:
            if kind in ("json", "json_object"):
                schema = json.loads(value) if isinstance(value, str) else value
                return self._json(schema)
            if kind == "json_schema":
                if not isinstance(value, dict) or not isinstance(value.get("schema"), dict):
                    raise GrammarError(
                        'a json_schema grammar\'s value is {"name", "schema": {...}, "strict"}'
                    )
                return self._json(value["schema"])
            if kind == "regex":
                if not isinstance(value, str) or not value:
                    raise GrammarError("`value` cannot be empty for `regex` grammar")
                return self._compiler.compile_regex(value)
        except GrammarError:
            raise
        except Exception as e:  # xgrammar's parse errors (RuntimeError, InvalidJSONError, ...)
            msg = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e).splitlines()[0])  # drop xgrammar's log prefix
            raise GrammarError(f"grammar is not valid: {msg[:200]}") from None
        raise GrammarError(f"unknown grammar type {kind!r}; TGI knows json, json_schema and regex")

    def _json(self, schema: Any):
        if not isinstance(schema, dict):
            raise GrammarError("grammar is not valid: a json grammar's value is a JSON schema object")
        if "properties" not in schema:  # TGI's own rule (router/src/validation.rs)
            raise GrammarError("grammar is not valid: Grammar must have a 'properties' field")
        return self._compiler.compile_json_schema(json.dumps(schema), strict_mode=True)


class GrammarLogitsProcessor:
    """`fn(output_token_ids, logits) -> logits` that masks tokens the grammar forbids.

    The matcher is advanced lazily: each call first accepts the tokens sampled since the last
    call, so it works with the engine's SamplingParams.logits_processors hook as is.
    """

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.num_accepted = 0

    def __call__(self, output_token_ids: list[int], logits):
        for tok in output_token_ids[self.num_accepted :]:
            if not self.matcher.is_terminated():
                self.matcher.accept_token(int(tok))
            self.num_accepted += 1
        if self.matcher.is_terminated():
            return logits
        self.matcher.fill_next_token_bitmask(self.bitmask)
        row = logits.unsqueeze(0).float().contiguous()  # (1, vocab)
        self._xgr.apply_token_bitmask_inplace(row, self.bitmask, vocab_size=self.vocab_size)
        return row[0].to(logits.dtype)
