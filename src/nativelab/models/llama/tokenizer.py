"""A byte-level BPE tokenizer built from the vocabulary and merges stored in a GGUF file (offline)."""

from __future__ import annotations


class Tokenizer:
    def __init__(self, data: dict):
        try:
            from tokenizers import Tokenizer as HFTokenizer
            from tokenizers import decoders, models, pre_tokenizers
        except ImportError:
            raise ImportError("the tokenizer needs the tokenizers package: pip install tokenizers") from None
        vocab = {tok: i for i, tok in enumerate(data["tokens"])}
        merges = [tuple(m.split(" ", 1)) for m in data["merges"]]
        tk = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        specials = [t for t, kind in zip(data["tokens"], data["token_types"]) if kind == 3]  # control tokens
        if specials:
            tk.add_special_tokens(specials)
        self._tk = tk
        self.bos, self.eos = data["bos"], data["eos"]

    def encode(self, text: str) -> list[int]:
        return self._tk.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tk.decode(ids, skip_special_tokens=True)
