"""A rank program for tests/test_finetune_distributed.py, run under torchrun: `nativelab finetune`'s own
argument parsing and run(), then (on every rank: a sharded forward is a collective) the trained model's
logits on fixed tokens, which rank 0 writes with the losses to $FT_RESULT for the test to compare."""

import os
import sys

import torch
import torch.distributed as dist

import nativelab  # noqa: F401
from nativelab.apps.finetune import parse_args
from nativelab.finetune import run
from nativelab.finetune.model import base_of

if __name__ == "__main__":
    res = run(parse_args(sys.argv[1:]))
    model = res.model.eval()
    ids = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits = model(input_ids=ids.to(next(model.parameters()).device)).logits.cpu()
    base = base_of(model)
    if dist.get_rank() == 0:
        torch.save({"losses": res.losses, "eval_before": res.eval_before, "eval_after": res.eval_after,
                    "logits": logits, "ids": ids, "sample_after": res.sample_after,
                    "tied": base.lm_head.weight is base.model.embed_tokens.weight}, os.environ["FT_RESULT"])
    dist.destroy_process_group()
