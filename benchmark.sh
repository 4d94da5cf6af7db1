#!/usr/bin/env bash
# The command behind each of the README's tables and figures, and behind the measurements of docs/. Run a block with
# `bash benchmark.sh NAME`, or copy its lines. They are slow (minutes to hours on a 2-core CPU): run them by hand, not
# in CI. Each line is a script's own command or a mode of benchmark.py (`python benchmark.py MODE --help`), with the
# scripts' defaults unless it says otherwise; any mode takes --smoke (a tiny budget, as the tests run them).
set -euo pipefail
cd "$(dirname "$0")"
export SDL_VIDEODRIVER=dummy

case "${1:-}" in
  results)  # README, Results: the table and the figure (docs/benchmark/grid), 44 runs, about 10 hours two at a time.
    # Run again after a stop, or on another machine with the records in docs/benchmark/grid/records: it goes on.
    python benchmark.py grid --out docs/benchmark/grid
    ;;
  results-quick)  # the same grid at a quarter of the budget (spread, speaker-listener 500k, reference 800k)
    python benchmark.py grid --budget quick
    ;;
  cluster)  # the grid's training commands, one per line, to spread over machines; then `results` on their records
    python benchmark.py grid --print-commands
    ;;
  policies)  # README, Quick start and Results: the hand-written policies (the figures' lines, the optimality gap)
    python reference_policies.py --n-agents 1 2 3 4 6 8 10 --episodes 200 --out docs/benchmark/reference_policies.json
    ;;
  scaling)  # README, the figure of the final return against N (docs/benchmark/scaling), spread at N = 1 to 10, 2M
    for script in mappo mat; do python benchmark.py scaling --script "$script" --out docs/benchmark/scaling; done
    ;;
  gpu)  # README, the GPU table (docs/speed.md): on a machine with an NVIDIA GPU, the graphed update against the eager
    pytest -q tests/test_gpu.py
    for script in mappo mat; do python benchmark.py update-graph --script "$script" --threads 32; done
    python benchmark.py update-graph --script mappo --threads 4096
    python benchmark.py update-graph --script mat --threads 512
    mkdir -p bench
    python mat_mpe.py --n-rollout-threads 32 --exp-name mat_cpu > bench/mat_cpu.log 2>&1 &
    python mat_mpe.py --cuda --n-rollout-threads 32 --exp-name mat_gpu; kill -INT %1
    python mappo_mpe.py --cuda --n-rollout-threads 4096 --total-timesteps 10240000
    ;;
  official-task)  # README, How these numbers relate: each script on the official codes' MPE task, 500k env steps
    for script in mappo rnn mat mat_ep; do python benchmark.py official-task --script "$script"; done
    ;;
  panel)  # README, Your own env, and docs/panel.md: every script with its defaults on envs nobody tuned for, 500k;
    # then EPyMARL's LBF tasks and RWARE at 2M env steps
    python benchmark.py panel
    python benchmark.py panel --envs lbf8 lbf8-2s lbf10 --budget 2000000
    python benchmark.py panel --envs rware-tiny --scripts mappo mat --budget 2000000
    # MAgent2's many agents, one at a time (gather's run holds about 20 GiB), as far as a CPU allows: on our 2-core CPU
    # battle about 13 env steps/s, gather about 2, some 13 hours (docs/panel.md)
    python benchmark.py panel --envs battle --scripts mappo --budget 100000
    python benchmark.py panel --envs gather --scripts mappo --budget 100000
    ;;
  speed)  # docs/speed.md: end-to-end SPS next to the env's own rate, the batched env, torch threads, MAT's timings
    for script in mappo rnn mat mat_ep; do python benchmark.py speed --script "$script" --preset official; done
    python benchmark.py env-rate
    python benchmark.py threads --script mappo
    python benchmark.py acting
    python benchmark.py critic
    ;;
  random-envs)  # docs/envs.md, Random envs: the README's promises held against 100 configurations of a random env
    python benchmark.py random-envs
    ;;
  resume)  # docs/resume.md: a run stopped by SIGTERM and resumed equals one straight, parameters and logs
    python benchmark.py resume --script mappo --preset official
    ;;
  sweep)  # docs/tuning.md: the settings screen on spread, 500k env steps a setting, from the official settings
    for script in mappo mat; do python benchmark.py sweep --script "$script"; done
    ;;
  official)  # docs/results.md: single runs with the official codes' settings, on the three scenarios and continuous
    for scenario in spread listener reference spread-continuous listener-continuous; do
      python benchmark.py learn "$scenario" --script mappo --preset official
    done
    ;;
  *)
    echo "usage: bash benchmark.sh results|results-quick|cluster|policies|scaling|gpu|official-task|panel|speed|random-envs|resume|sweep|official"
    exit 2
    ;;
esac
