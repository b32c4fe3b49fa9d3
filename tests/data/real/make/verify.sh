#!/usr/bin/env bash
# Lists the TensorBoard tags of every event directory here and tries `rlreg register` on every file,
# once with default options and once with --on-disorder error, each into a fresh SQLite file.
# Usage: PY=/path/to/python-with-tensorboard RLREG=/path/to/rlreg bash make/verify.sh   (from tests/data/real)
set -u
PY=${PY:-python}
RLREG=${RLREG:-rlreg}
DB=$(mktemp -d)/verify.db
INPUTS=(
  cleanrl_ppo_cartpole/runs/CartPole-v1__ppo__1__1796394563
  cleanrl_ppo_cartpole/runs
  trl_grpo_tiny/beta0.04/runs/Dec04_14-39-08_vm
  trl_grpo_tiny/beta0.04/checkpoint-30/trainer_state.json
  trl_grpo_tiny/beta0.04/trainer_state_after_train.json
  trl_grpo_tiny/num_iterations2/runs/Dec04_14-38-05_vm
  trl_grpo_tiny/num_iterations2/checkpoint-20/trainer_state.json
  trl_grpo_tiny/num_iterations2/trainer_state_after_train.json
  trl_grpo_tiny/beta0_eval/runs/Dec04_15-00-02_vm
  trl_grpo_tiny/beta0_eval/checkpoint-20/trainer_state.json
  trl_grpo_tiny/beta0_eval/trainer_state_after_train.json
  sb3_ppo_cartpole_logger
  sb3_ppo_cartpole_logger/progress.csv
  sb3_ppo_cartpole_logger/progress.json
  sb3_ppo_cartpole_tensorboard_log/tb
  verl_tracking_grpo/console.log
  verl_tracking_grpo/verl_grpo_tiny/qwen_tiny_gsm8k_grpo.jsonl
  openrlhf_tensorboard_grpo/qwen_tiny_grpo_k3
)
echo "## TensorBoard tags"
for d in $(find . -name 'events.out.tfevents.*' -printf '%h\n' | sort -u); do
  echo "### $d"
  "$PY" make/list_tensorboard_tags.py "$d" 2>/dev/null
done
for mode in default error; do
  echo "## rlreg register ($mode)"
  for f in "${INPUTS[@]}"; do
    rm -f "$DB"
    if [ "$mode" = default ]; then out=$("$RLREG" --db "sqlite:///$DB" register "$f" 2>&1); rc=$?
    else out=$("$RLREG" --db "sqlite:///$DB" register --on-disorder error "$f" 2>&1); rc=$?; fi
    echo "- $f: rc=$rc: $(echo "$out" | grep -E '^(registered|error|Error)' | head -3 | tr '\n' ' ')"
  done
done
