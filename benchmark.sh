#!/usr/bin/env bash
# Learning curves and speed of the scripts, as reported in the README. Slow: run it by hand, not in CI.
#   bash benchmark.sh speed      # SPS with 32 rollout threads next to the raw env step rate (~2 min)
#   bash benchmark.sh spread     # simple_spread_v3 to 2M env steps with the defaults
#   bash benchmark.sh listener   # simple_speaker_listener_v4, 2M steps (official: separate actors, 15 epochs)
#   bash benchmark.sh reference  # simple_reference_v3, 3M steps (official: 15 epochs)
# Runs go to bench/runs (TensorBoard) and bench/*.log; every run ends with a table of its returns.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$here/bench"
cd "$here/bench"
export SDL_VIDEODRIVER=dummy
seed="${SEED:-1}"

raw_env_rate() {  # single-process random-action env steps per second, as REFERENCE.md measures it
  python - "$1" <<'PY'
import sys, time
sys.path.insert(0, "..")
from mappo_mpe import make_env
env = make_env(sys.argv[1], 3, 25)
env.reset(seed=0)
steps, start = 0, time.perf_counter()
while time.perf_counter() - start < 10.0:
    env.step({a: env.action_space(a).sample() for a in env.agents})
    steps += 1
    if not env.agents:
        env.reset()
print(f"{steps / (time.perf_counter() - start):.0f}")
PY
}

curve() {  # table of training and evaluation returns of the newest run matching $1
  python - "$1" <<'PY'
import glob, os, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
run = max(glob.glob(f"runs/*{sys.argv[1]}*"), key=os.path.getmtime)
ea = EventAccumulator(run, size_guidance={"scalars": 0})
ea.Reload()
train = [(e.step, e.value) for e in ea.Scalars("charts/episodic_return")]
evals = [(e.step, e.value) for e in ea.Scalars("eval/episodic_return")]
sps = ea.Scalars("charts/SPS")[-1].value
print(f"run {run}: final SPS {sps:.0f}")
print("| env steps | train episodic_return (mean of the last 10 logs) | eval episodic_return (last eval at or before) |")
print("|---|---|---|")
marks = [100_000, 300_000, 500_000, 1_000_000, 1_500_000, 2_000_000, 2_500_000, 3_000_000]
for mark in [m for m in marks if m <= train[-1][0] + 1]:
    last = [v for s, v in train if s <= mark][-10:]
    ev = [v for s, v in evals if s <= mark]
    print(f"| {mark:,} | {sum(last) / len(last):.2f} | {ev[-1]:.2f} |")
PY
}

train() {  # name, flags...
  local name="$1"; shift
  python ../mappo_mpe.py --exp-name "$name" --seed "$seed" "$@" 2>&1 | tee "$name.log"
  curve "$name" | tee -a "$name.log"
}

case "${1:-}" in
  speed)
    before=$(raw_env_rate simple_spread_v3)
    python ../mappo_mpe.py --exp-name speed --n-rollout-threads 32 --total-timesteps 300000 --eval-interval 1000000 \
      2>&1 | tee speed.log
    after=$(raw_env_rate simple_spread_v3)
    sps=$(grep -o 'SPS *[0-9]*' speed.log | tail -1 | grep -o '[0-9]*')
    python -c "r = ($before + $after) / 2; print(f'raw env rate {r:.0f} steps/s (before {$before}, after {$after}); end-to-end SPS $sps; ratio {$sps / r:.2f}')" \
      | tee -a speed.log
    ;;
  spread) train spread ;;
  listener) train listener --env-id simple_speaker_listener_v4 --separate-actors --ppo-epoch 15 ;;
  reference) train reference --env-id simple_reference_v3 --ppo-epoch 15 --total-timesteps 3000000 ;;
  *) echo "usage: bash benchmark.sh speed|spread|listener|reference"; exit 2 ;;
esac
