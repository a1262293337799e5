# Sourced by run_lora_finetune_hf.sh and run_full_finetune_hf.sh, after they set `args` (their training
# choices): adds MODEL_PATH and launches `nativelab finetune` with the script's own arguments appended.
# MODEL_PATH=/path/to/Qwen3-1.7B: a local Hugging Face checkpoint instead of the offline default.
# NPROC=N: N processes under torchrun, one per device (neuron:0..N-1), the model sharded with FSDP2;
# --batch-size is then per rank. Default: one process. PYTHON: the interpreter (default python3).
# MAX_STEPS=N, LOG_EVERY=N, SAMPLE_TOKENS=N (the before/after samples' length): a short run of the guide's
# command as typed (tests/test_guide.py runs it so).
launch_finetune() {
  if [ -n "${MODEL_PATH:-}" ]; then args+=(--model-path "$MODEL_PATH"); fi
  if [ -n "${MAX_STEPS:-}" ]; then args+=(--max-steps "$MAX_STEPS"); fi
  if [ -n "${LOG_EVERY:-}" ]; then args+=(--log-every "$LOG_EVERY"); fi
  if [ -n "${SAMPLE_TOKENS:-}" ]; then args+=(--sample-tokens "$SAMPLE_TOKENS"); fi
  local launch=("${PYTHON:-python3}" -m nativelab.cli)
  if [ "${NPROC:-1}" -gt 1 ]; then
    launch=("${PYTHON:-python3}" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" -m nativelab.cli)
  fi
  "${launch[@]}" finetune "${args[@]}" "$@"
}
