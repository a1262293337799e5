"""A typical Hugging Face training loop written for CUDA (nothing Trainium-specific): a small Llama from a
config (random weights, offline), batches padded to the longest sequence of each batch, loss logged every step.

    python examples/hf_train_cuda.py                      # CUDA if present, else the CPU
    nativelab check --device-from cuda examples/hf_train_cuda.py
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=2000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
model = LlamaForCausalLM(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

lengths = [37, 64, 90, 51, 120, 77]  # each batch padded to its longest example
for step, length in enumerate(lengths):
    ids = torch.randint(3, cfg.vocab_size, (4, length), device=device)
    mask = torch.ones_like(ids)
    mask[0, length // 2:] = 0  # one short example, right-padded
    labels = ids.masked_fill(mask == 0, -100)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    opt.zero_grad()
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    print(f"step {step} len {length} loss {out.loss.item():.3f}")
