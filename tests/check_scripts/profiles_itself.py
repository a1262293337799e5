"""A script that profiles itself (a nativelab.profile session around its loop): checked, both the check and the
script's own session see every fallback and transfer. Writes what its session saw to argv[1]."""
import json
import sys

import torch

import nativelab.profile

x = torch.arange(8.0).flip(0).to("neuron")
with nativelab.profile.Session("own") as s:
    for step in range(3):
        order = torch.argsort(x + step)  # argsort falls back to the CPU
        print(f"step {step} first {order[0].item()}")  # .item(): a host sync every step
summary = s.summary()
with open(sys.argv[1], "w") as f:
    json.dump({"fallbacks": summary["fallbacks"], "transfers": summary["transfers"]}, f)
