"""Supervised fine-tuning (LoRA and full) of Hugging Face models on the device: `nativelab finetune`."""

from .train import Config, Result, run

__all__ = ["Config", "Result", "run"]
