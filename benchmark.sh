#!/usr/bin/env bash
# Learning curves and speed of the scripts, as reported in the README. Slow: run it by hand, not in CI.
#   bash benchmark.sh ALGO speed      # SPS with 32 rollout threads next to the raw env step rate (~3 min)
#   bash benchmark.sh ALGO spread     # simple_spread_v3 to 2M env steps with PRESET's settings (official here)
#   bash benchmark.sh ALGO partial    # the same on mpe2 itself, each agent observing its nearest agent and landmark
#   bash benchmark.sh ALGO listener   # simple_speaker_listener_v4, 2M steps, 15 epochs (MAPPO: separate actors)
#   bash benchmark.sh ALGO reference  # simple_reference_v3, 3M steps, 15 epochs
#   bash benchmark.sh ALGO spread-continuous    # spread as above with --continuous-actions
#   bash benchmark.sh ALGO listener-continuous  # speaker-listener as above with --continuous-actions
#   bash benchmark.sh mat acting      # MAT acting time per step, KV cache vs full re-decode, N = 3, 6, 12
#   bash benchmark.sh mat critic      # mat_mpe_ep_critic.py's critic per update: once per env vs per agent, N = 3, 12
#                                     # (acting and critic time each case for TIMING_SECONDS, 3)
#   bash benchmark.sh ALGO env-rate   # env steps/s, random actions, one thread: mpe2's parallel_env and the batched env
#   bash benchmark.sh ALGO versus REV # SPS against the script at git revision REV, back to back, twice (300k steps)
#   bash benchmark.sh ALGO official-task  # spread, 500k steps, on the task of the official codes' MPE copy
#   bash benchmark.sh ALGO resume     # spread 600k straight, and stopped by SIGTERM at 300k then resumed: equal?
#   bash benchmark.sh ALGO sweep      # the settings screen: spread, 500k steps per setting, JOBS (2) side by side
#   bash benchmark.sh ALGO devices    # SPS and per-phase times on the CPU and with --cuda (and torch.compile) at
#                                     # THREADS (32 512 4096) rollout threads, one run at a time (see devices())
#   bash benchmark.sh ALGO threads    # SPS alone and two runs side by side, one torch thread against one per core
#   bash benchmark.sh ALGO scaling    # spread with N_AGENTS ("1 2 3 4 6 8 10") agents, 2M steps each, JOBS side by
#                                     # side; then the final return against N of every script run so (bench/scaling)
#   bash benchmark.sh panel           # the panel of envs nobody tuned for, with the defaults (PANEL, SCRIPTS, SEEDS,
#                                     # BUDGET, JOBS; see panel()), into bench/panel and bench/panel.log
#   bash benchmark.sh grid [OPTIONS]  # scripts x scenarios x seeds with --preset tuned, then plots and a table
#   bash benchmark.sh --print-commands [OPTIONS]  # the grid's training commands, one per line, nothing else
#   bash benchmark.sh absolute RUN_DIR...  # the absolute metric of these finished runs (the grid measures its own)
# Grid OPTIONS: --budget full|quick (full: spread 2M, speaker-listener 2M, reference 3M env steps, the README's;
# quick: spread and speaker-listener 500k, reference 800k), --seeds N (5 on spread, 3 elsewhere), --jobs N (runs side
# by side, 2), --scripts "mappo rnn mat mat_ep", --scenarios "spread listener reference", --out DIR (bench/grid_BUDGET;
# the README's grid: docs/benchmark/grid). Every run keeps its best model and ends with its absolute metric: that model
# re-evaluated on 320 mpe2 episodes; then a record of it (its curves and numbers, a few kB) goes to DIR/records. The grid
# writes the figures, results.md (IQM, mean and optimality gap with 95% bootstrap confidence intervals, by rliable) and
# marl_eval.json (marl-eval's layout) into DIR, from the records. The same grid command again, after Ctrl-C or on
# another machine with DIR's records, skips the recorded runs and resumes the stopped ones from their checkpoints.
# SEED (1) and PRESET (official, the official codes' settings the docs' single runs compare with; or tuned, the
# scripts' own default) choose the seed and the --preset of the learning and speed runs of the other modes.
# SMOKE=1 runs a mode on a tiny budget, as the tests do: 400 env steps a run, 2 envs of 10-step rollouts, 2 evaluation
# episodes, timings of TIMING_SECONDS (0.05 then), sweep's first two settings, threads' one-thread rows; its tables
# come out, their numbers meaning nothing.
# ALGO is mappo (mappo_mpe.py), rnn (mappo_mpe_rnn.py), mat (mat_mpe.py) or mat_ep (mat_mpe_ep_critic.py). Runs go to bench/runs (TensorBoard) and
# bench/ALGO_*.log; every run ends with a table of its returns.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
caller="$PWD"  # where run folders given to `absolute` are found
mkdir -p "$here/bench"
cd "$here/bench"
export SDL_VIDEODRIVER=dummy
seed="${SEED:-1}"
preset="${PRESET:-official}"
smoke=()  # flags every learning run gets first, so that a mode's own flags win over them; written
# ${smoke[@]+"${smoke[@]}"}, which bash before 4.4 (macOS's 3.2) expands when empty under `set -u`
if [ -n "${SMOKE:-}" ]; then
  smoke=(--total-timesteps 400 --n-rollout-threads 2 --episode-length 10 --n-eval-episodes 2 --eval-interval 100)
  smoke+=(--log-interval 100)
  export TIMING_SECONDS="${TIMING_SECONDS:-0.05}"
fi

steps() {  # the env steps of a run whose budget is $1: $1, or 400 with SMOKE
  if [ -n "${SMOKE:-}" ]; then echo 400; else echo "$1"; fi
}

script_of() {  # the script file of ALGO $1, or nothing
  case "$1" in
    mappo|mat) echo "${1}_mpe.py" ;;
    rnn) echo "mappo_mpe_rnn.py" ;;
    mat_ep) echo "mat_mpe_ep_critic.py" ;;
  esac
}

usage() {
  echo "usage: bash benchmark.sh mappo|rnn|mat|mat_ep speed|spread|partial|listener|reference|spread-continuous|listener-continuous|official-task|env-rate|resume|sweep|scaling|devices|threads|versus REV, bash benchmark.sh mat acting|critic, bash benchmark.sh grid|--print-commands [OPTIONS], bash benchmark.sh absolute RUN_DIR..., bash benchmark.sh panel"
  exit 2
}

algo="${1:-}"
script="../$(script_of "$algo")"
if [ "$script" = ../ ] && [ "$algo" != grid ] && [ "$algo" != --print-commands ] && [ "$algo" != absolute ] &&
  [ "$algo" != panel ]; then
  usage
fi

raw_env_rate() {  # single-process random-action env steps per second of mpe2's parallel_env for scenario $1, with
  # actions from action_space.sample()
  python - "$1" <<'PY'
import importlib, os, sys, time
env = importlib.import_module(f"mpe2.{sys.argv[1]}").parallel_env(max_cycles=25)
env.reset(seed=0)
steps, start = 0, time.perf_counter()
while time.perf_counter() - start < float(os.environ.get("TIMING_SECONDS", 10)):
    env.step({a: env.action_space(a).sample() for a in env.agents})
    if not env.agents:
        env.reset()
    steps += 1
print(f"{steps / (time.perf_counter() - start):.0f}")
PY
}

batched_env_rate() {  # env steps per second of the scripts' batched env (BatchedMPE) for scenario $1 with $2 envs on
  # the CPU, one torch thread, uniformly random discrete actions drawn in the loop
  python - "$1" "$2" "$here" <<'PY'
import os, sys, time
import torch
sys.path.insert(0, sys.argv[3])
from mappo_mpe import Args, BatchedMPE, get_env_spec, scenario_kwargs
torch.set_num_threads(1)
env_id, n_envs = sys.argv[1], int(sys.argv[2])
envs = BatchedMPE(get_env_spec(env_id, scenario_kwargs(Args(env_id=env_id))), n_envs, 0, torch.device("cpu"))
envs.reset()
n_actions = torch.as_tensor(envs.spec.avail_actions.sum(axis=1))  # (n_agents,)
steps, start = 0, time.perf_counter()
while time.perf_counter() - start < float(os.environ.get("TIMING_SECONDS", 5)):
    envs.step((torch.rand(n_envs, len(n_actions)) * n_actions).long())
    steps += 1
print(f"{steps * n_envs / (time.perf_counter() - start):.0f}")
PY
}

cpu_times() {  # "steal total" jiffies of all CPUs since boot; the host takes steal time from this VM
  awk '/^cpu /{print $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat
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

train() {  # name, flags...: one run, logged to bench/ALGO_NAME[_PRESET]_seedSEED.log
  local name="${algo}_$1"; shift
  [ "$preset" = official ] || name+="_$preset"
  python "$script" ${smoke[@]+"${smoke[@]}"} --exp-name "$name" --seed "$seed" --preset "$preset" "$@" 2>&1 | tee "${name}_seed$seed.log"
  curve "__${name}__${seed}__" | tee -a "${name}_seed$seed.log"
}

acting_time() {  # milliseconds per acting call for 32 envs of simple_spread_v3 with N agents
  python - <<'PY'
import os, sys, time
import torch
sys.path.insert(0, "..")
import mat_mpe as m
torch.set_num_threads(1)  # steadier than two on a 2-core machine, and no slower at this size

def full_re_decode(model, obs_rep, avail, alive):  # the official MAT's acting: the whole sequence at each agent's turn
    B, n_agents, _ = obs_rep.shape
    shifted = model.start_token.repeat(B, n_agents, 1)
    for i in range(n_agents):
        action = m.action_distribution(model.decode(shifted, obs_rep)[:, i], avail[..., i, :], None).sample()
        if i + 1 < n_agents:
            shifted[:, i + 1] = model.action_tokens(action, alive[:, i])

print("| agents | KV cache (ms per step) | full re-decode, as the official code (ms per step) | speed-up |")
print("|---|---|---|---|")
for n_agents in (3, 6, 12):
    spec = m.get_env_spec("simple_spread_v3", m.scenario_kwargs(m.Args(n_agents=n_agents)))
    model = m.MultiAgentTransformer(spec, m.Args(n_agents=n_agents))
    obs, alive = torch.randn(32, n_agents, spec.obs_dim), torch.ones(32, n_agents, dtype=torch.bool)
    avail = torch.as_tensor(spec.avail_actions).expand(32, -1, -1)  # every action available
    times = {}
    with torch.no_grad():
        for name in ("cached", "full"):
            def act():
                obs_rep = model.encode(model.agent_inputs(obs, None))[0]
                if name == "cached":
                    model.decode_autoregressive(obs_rep, avail, alive, False)
                else:
                    full_re_decode(model, obs_rep, avail, alive)
            for _ in range(20):
                act()
            start, calls = time.perf_counter(), 0
            while time.perf_counter() - start < float(os.environ.get("TIMING_SECONDS", 3)):
                act()
                calls += 1
            times[name] = 1000 * (time.perf_counter() - start) / calls
    print(f"| {n_agents} | {times['cached']:.2f} | {times['full']:.2f} | {times['full'] / times['cached']:.2f}x |")
PY
}

critic_time() {  # milliseconds of critic forward + backward per update (10 epochs over a 25 x 32 rollout)
  python - <<'PY'
import os, sys, time
import torch
sys.path.insert(0, "..")
import mat_mpe_ep_critic as m
torch.set_num_threads(1)  # as acting; the update's second thread would add noise to a 2-core measurement
print("| agents | state dim | once per env, one head per agent (ms) | replicated per agent, one head (ms) | ratio |")
print("|---|---|---|---|---|")
for n_agents in (3, 12):
    args = m.Args(n_agents=n_agents)
    spec = m.get_env_spec("simple_spread_v3", m.scenario_kwargs(args))
    once = m.mlp_net(spec.state_dim, n_agents, 1.0, args)  # the script's critic
    per_agent = m.mlp_net(spec.state_dim, 1, 1.0, args)  # the official layout: every agent's copy of the state
    state = torch.randn(25 * 32, spec.state_dim)
    replicated = state.repeat_interleave(n_agents, dim=0)  # (25 * 32 * n_agents, state_dim)
    times = []
    for critic, x in ((once, state), (per_agent, replicated)):
        def update():
            for _ in range(10):
                critic.zero_grad()
                critic(x).sum().backward()
        update()
        start, calls = time.perf_counter(), 0
        while time.perf_counter() - start < float(os.environ.get("TIMING_SECONDS", 3)):
            update()
            calls += 1
        times.append(1000 * (time.perf_counter() - start) / calls)
    print(f"| {n_agents} | {spec.state_dim} | {times[0]:.1f} | {times[1]:.1f} | {times[1] / times[0]:.2f}x |")
PY
}

stop_and_resume() {  # 600k steps of spread straight, and the same run stopped by SIGTERM at 300k, then resumed
  local name="${algo}_resume_stopped" total stop
  total="$(steps 600000)"
  stop=$(( total / 2 ))
  [ -z "${SMOKE:-}" ] || stop=100  # at the first progress line, with most of the run left to stop in
  train resume_straight --total-timesteps "$total"
  python -u "$script" ${smoke[@]+"${smoke[@]}"} --exp-name "$name" --seed "$seed" --preset "$preset" --total-timesteps "$total" \
    > "$name.log" 2>&1 &
  local pid=$!
  until grep -Eq "^step +$(python -c "print(f'{$stop:,}')")/" "$name.log" 2>/dev/null; do
    kill -0 "$pid" || exit 1
    sleep 0.1
  done
  kill -TERM "$pid"
  wait "$pid" || true
  tail -1 "$name.log"
  local run
  run=$(ls -td runs/*__"${name}"__* | head -1)
  python "$script" ${smoke[@]+"${smoke[@]}"} --exp-name "$name" --seed "$seed" --preset "$preset" --total-timesteps "$total" \
    --resume "$run/checkpoint.pt" 2>&1 \
    | tee -a "$name.log"
  curve "__${name}__" | tee -a "$name.log"
  python - "$(ls -td runs/*__"${algo}"_resume_straight__* | head -1)" "$run" <<'PY'
import sys
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
straight, resumed = sys.argv[1:]
a, b = (torch.load(f"{run}/checkpoint.pt", weights_only=True) for run in (straight, resumed))
same_params = a["agent"].keys() == b["agent"].keys() and all(torch.equal(a["agent"][k], b["agent"][k]) for k in a["agent"])
timing = lambda tag: tag == "charts/SPS" or tag.startswith("perf/")  # wall-clock times differ from run to run
def scalars(run):
    events = EventAccumulator(run, size_guidance={"scalars": 0})
    events.Reload()
    return {t: [(e.step, e.value) for e in events.Scalars(t)] for t in events.Tags()["scalars"] if not timing(t)}
x, y = scalars(straight), scalars(resumed)
differing = [t for t in x if x[t] != y.get(t)]
print(f"at step {a['global_step']:,} and {b['global_step']:,}: parameters bit-identical: {same_params}; "
      f"{len(x)} logged series, identical at every step: {not differing and x.keys() == y.keys()} {differing}")
PY
}

official_task() {  # runs the script on simple_spread_v3 changed into the official codes' MPE task, in training (the
  # batched env) and in evaluation (mpe2)
  python - "$script" ${smoke[@]+"${smoke[@]}"} --exp-name "${algo}_official_task" --seed "$seed" --preset official \
    --total-timesteps "$(steps 500000)" \
    "$@" <<'PY'
import importlib, os, sys
import torch
from mpe2._mpe_utils import core
from mpe2.simple_spread import simple_spread

script = sys.argv.pop(1)
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
module = importlib.import_module(os.path.basename(script)[: -len(".py")])

# 1. The official copy starts landmarks in 0.8 x U(-1, 1); mpe2 in U(-1, 1).
reset_world = simple_spread.Scenario.reset_world
def reset_world_official(self, world, np_random):
    reset_world(self, world, np_random)
    for landmark in world.landmarks:
        landmark.state.p_pos = 0.8 * np_random.uniform(-1, +1, world.dim_p)
simple_spread.Scenario.reset_world = reset_world_official

reset_envs = module.BatchedMPE.reset_envs
def reset_envs_official(self, envs):
    reset_envs(self, envs)
    scale = torch.where(envs[:, None, None], 0.8, 1.0)  # the landmarks of the envs just reset
    self.pos = torch.cat([self.pos[:, : self.n_agents], self.pos[:, self.n_agents :] * scale], dim=1)
module.BatchedMPE.reset_envs = reset_envs_official

# 2. The official copy damps and accelerates first, then moves with the new velocity; mpe2 moves with the
# old velocity first, so an action changes an agent's position one step later than in the official task.
def integrate_state_official(self, p_force):
    for i, entity in enumerate(self.entities):
        if not entity.movable:
            continue
        entity.state.p_vel = entity.state.p_vel * (1 - self.damping)
        if p_force[i] is not None:
            entity.state.p_vel += (p_force[i] / entity.mass) * self.dt
        entity.state.p_pos += entity.state.p_vel * self.dt  # spread agents have no max_speed
core.World.integrate_state = integrate_state_official

def integrate_official(self, force):
    self.vel = self.vel * (1 - module.DAMPING) + force * module.DT
    self.pos = torch.cat([self.pos[:, : self.n_agents] + self.vel * module.DT, self.pos[:, self.n_agents :]], dim=1)
module.BatchedMPE.integrate = integrate_official

module.main(module.parse_args(sys.argv[1:]))
PY
}

versus() {  # this script against its copy at git revision $1 (a file that git shows), the same command back to back:
  # 300k steps of spread with 32 envs, the two alternated twice; prints each run's SPS and median per-iteration times
  local rev="$1" file run
  file="$(basename "$script")"
  mkdir -p "versus_$rev"
  git -C "$here" show "$rev:$file" > "versus_$rev/$file"
  for round in 1 2; do
    for run in "versus_$rev/$file" "$script"; do
      local name="${algo}_versus_$([ "$run" = "$script" ] && echo current || echo "$rev")_$round"
      python "$run" ${smoke[@]+"${smoke[@]}"} --exp-name "$name" --seed "$seed" --preset "$preset" --n-rollout-threads 32 \
        --total-timesteps "$(steps 300000)" > "$name.log" 2>&1
    done
  done
  python - "$algo" "$rev" <<'PY'
import glob, os, statistics, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
algo, rev = sys.argv[1:]
print(f"| run | SPS | rollout ms (median) | update ms (median) |")
print("|---|---|---|---|")
for round in (1, 2):
    for which in (rev, "current"):
        run = max(glob.glob(f"runs/*__{algo}_versus_{which}_{round}__*"), key=os.path.getmtime)
        events = EventAccumulator(run, size_guidance={"scalars": 0})
        events.Reload()
        later = lambda tag: [e.value for e in events.Scalars(tag)][len(events.Scalars(tag)) // 3 :]  # noqa: E731
        median = lambda tag: statistics.median(later(tag))  # noqa: E731
        sps = events.Scalars("charts/SPS")[-1].value
        print(f"| {which}, round {round} | {sps:.0f} | {median('perf/rollout_ms'):.1f} | {median('perf/update_ms'):.1f} |")
PY
}

devices() {  # the same command on the CPU and with --cuda (DEVICES: "cpu cuda") at each of THREADS (32 512 4096) rollout
  # threads, with --cuda eager (--no-compile) and compiled (MODES: "eager compile"), ITERATIONS (12) iterations a run,
  # evaluating only at the last, a torch thread per core; then a table of SPS and per-phase times of every such run
  local n device mode name iterations="${ITERATIONS:-12}"
  mkdir -p devices
  for n in ${THREADS:-32 512 4096}; do
    for device in ${DEVICES:-cpu cuda}; do
      for mode in $([ "$device" = cuda ] && echo "${MODES:-eager compile}" || echo eager); do
        name="${algo}_devices_${device}_${n}_${mode}"
        timeout "${RUN_TIMEOUT:-300}" python "$script" ${smoke[@]+"${smoke[@]}"} --exp-name "$name" --preset "$preset" \
          --n-rollout-threads "$n" --total-timesteps "$(steps $(( n * 25 * iterations )))" \
          --eval-interval 1000000000000 --n-training-threads "$(nproc)" \
          $([ "$device" = cuda ] && echo --cuda) $([ "$device$mode" = cudaeager ] && [ "$algo" != rnn ] && echo --no-compile) \
          >"devices/$name.log" 2>&1 \
          || echo "$name failed: $(tail -1 "devices/$name.log")"
      done
    done
  done
  python - "$algo" <<'PY'
import glob, os, statistics, sys
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
algo = sys.argv[1]
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
print(f"{algo}: {gpu}, {os.cpu_count()} CPU cores (a torch thread each), torch {torch.__version__}")
print("| device | threads | compile | env steps | SPS | steady SPS | rollout ms | update ms |")
print("|---|---|---|---|---|---|---|---|")
for run in sorted(glob.glob(f"runs/*__{algo}_devices_*"), key=os.path.getmtime):
    _, device, n, mode = run.split("__")[1].rsplit("_", 3)
    events = EventAccumulator(run, size_guidance={"scalars": 0})
    events.Reload()
    if "perf/update_ms" not in events.Tags()["scalars"]:
        continue
    later = lambda tag: [e.value for e in events.Scalars(tag)][len(events.Scalars(tag)) // 3 :]  # noqa: E731
    rollout, update = statistics.median(later("perf/rollout_ms")), statistics.median(later("perf/update_ms"))
    (last,), steady = events.Scalars("charts/SPS")[-1:], int(n) * 25 / (rollout + update) * 1000
    print(f"| {device} | {n} | {mode} | {last.step:,} | {last.value:,.0f} | {steady:,.0f} | {rollout:.1f} | {update:.1f} |")
PY
}

threads() {  # SPS of one run alone and of two side by side, with --n-training-threads 1 (the default on 2 cores) and with one
  # torch thread per core (torch's own default, the scripts' before the flag): spread with --preset tuned on the
  # batched env (96k steps), then mpe2's spread on the generic path (19,200 steps); OMP_NUM_THREADS unset
  local path threads flags k
  unset OMP_NUM_THREADS
  mkdir -p threads
  echo "| env path | torch threads | alone: SPS | side by side: SPS of each | slowdown |"
  echo "|---|---|---|---|---|"
  for path in batched generic; do
    flags=(--preset tuned --total-timesteps "$(steps 96000)")
    [ "$path" = generic ] && flags=(--env-id mpe2.simple_spread_v3 --total-timesteps "$(steps 19200)")
    for threads in 1 $([ -n "${SMOKE:-}" ] || nproc); do
      for k in 0 1 2; do  # run 0 alone, then runs 1 and 2 side by side
        python "$script" ${smoke[@]+"${smoke[@]}"} "${flags[@]}" --n-training-threads "$threads" --eval-interval 1000000000 \
          --exp-name "${algo}_threads" > "threads/${path}_${threads}_$k.log" 2>&1 &
        [ "$k" = 1 ] || wait
      done
      python - "$path" "$threads" <<'PY'
import re, sys
path, threads = sys.argv[1:]
sps = [int(re.findall(r"SPS +(\d+)", open(f"threads/{path}_{threads}_{k}.log").read())[-1]) for k in range(3)]
print(f"| {path} | {threads} | {sps[0]:,} | {sps[1]:,} / {sps[2]:,} | {2 * sps[0] / (sps[1] + sps[2]):.2f}x |")
PY
    done
  done
}

panel_env() {  # the --env-id and --env-kwargs of panel env $1
  case "$1" in
    spread) echo "--env-id mpe2.simple_spread_v3" ;;
    multiwalker) echo "--env-id pettingzoo.sisl.multiwalker_v9" ;;
    kaz) echo "--env-id pettingzoo.butterfly.knights_archers_zombies_v11" ;;
    pursuit) echo "--env-id pettingzoo.sisl.pursuit_v5" ;;
    halfcheetah) echo "--env-id gymnasium_robotics.mamujoco_v1 --env-kwargs scenario HalfCheetah agent_conf 2x3" ;;
    arena) echo "--env-id tests.arena_env" ;;  # short episodes and deaths (docs/panel.md), not in the default panel
    tutorial) echo "--env-id tests.tutorial_env:MeetEnv" ;;  # written as PettingZoo's tutorial writes an env
  esac
}

panel() {  # PANEL ("spread multiwalker kaz pursuit halfcheetah") x SCRIPTS ("mappo rnn mat mat_ep") x SEEDS ("1") with
  # the defaults an env without a preset gets (no flag but the env's own), BUDGET (500000) env steps, JOBS (2) side by
  # side, skipping finished runs; each env's uniformly random policy first (20 episodes); then a table in bench/panel
  local env name s run jobs="${JOBS:-2}"
  mkdir -p panel/logs
  cd panel
  for env in ${PANEL:-spread multiwalker kaz pursuit halfcheetah}; do
    [ -f "logs/random_$env.log" ] || panel_random $(panel_env "$env") > "logs/random_$env.log" 2>&1
    for name in ${SCRIPTS:-mappo rnn mat mat_ep}; do
      for s in ${SEEDS:-1}; do
        run="panel_${env}_${name}_$s"
        grep -q "^run in " "logs/$run.log" 2>/dev/null && continue
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
        python "$here/$(script_of "$name")" ${smoke[@]+"${smoke[@]}"} $(panel_env "$env") --seed "$s" \
          --total-timesteps "$(steps "${BUDGET:-500000}")" \
          --exp-name "$run" > "logs/$run.log" 2>&1 &
      done
    done
  done
  wait
  python - <<'PY'
import glob, os, re
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
print("| env | random | script | seed | env steps | train (last 10% of episodes) | eval (last) |")
print("|---|---|---|---|---|---|---|")
for log in sorted(glob.glob("logs/panel_*.log"), key=os.path.getmtime):
    stem, seed = os.path.basename(log)[len("panel_") : -len(".log")].rsplit("_", 1)
    name = next(n for n in ("mat_ep", "mappo", "rnn", "mat") if stem.endswith(f"_{n}"))
    env = stem[: -len(name) - 1]
    runs = glob.glob(f"runs/*__panel_{env}_{name}_{seed}__*")
    random = (re.findall(r"random ([-\d.]+)", open(f"logs/random_{env}.log").read()) or ["?"])[-1]
    if not runs:
        continue
    events = EventAccumulator(runs[0], size_guidance={"scalars": 0})
    events.Reload()
    scalars = events.Tags()["scalars"]
    train = [e.value for e in events.Scalars("charts/episodic_return")] if "charts/episodic_return" in scalars else []
    evals = events.Scalars("eval/episodic_return") if "eval/episodic_return" in scalars else []
    last = np.mean(train[-max(1, len(train) // 10) :]) if train else float("nan")
    steps = evals[-1].step if evals else 0
    print(f"| {env} | {random} | {name} | {seed} | {steps:,} | {last:.2f} | {evals[-1].value if evals else float('nan'):.2f} |")
PY
}

panel_random() {  # "random R": the mean per-agent return of 20 episodes of uniformly random actions in the env named
  # by the flags given (--env-id ID [--env-kwargs K V ...])
  python - "$here" "$@" <<'PY'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import mappo_mpe as m
args = m.parse_args(sys.argv[2:])
env = m.make_env(args.env_id, m.scenario_kwargs(args))
returns = []
for episode in range(20):
    env.reset(seed=episode)
    total = {a: 0.0 for a in env.possible_agents}
    while env.agents:
        _, rewards, _, _, _ = env.step({a: env.action_space(a).sample() for a in env.agents})
        for a, r in rewards.items():
            total[a] += r
    returns.append(np.mean(list(total.values())))
print(f"random {np.mean(returns):.2f} (std {np.std(returns):.2f}, 20 episodes)")
PY
}

scaling() {  # spread with --preset tuned at each team size of N_AGENTS, 2M env steps, JOBS at a time, skipping finished
  # runs; then the figure and table of every script's runs in bench/scaling, with the hand-written policies
  local jobs="${JOBS:-2}" name n run
  name="$(basename "$script" .py)"
  mkdir -p scaling/logs
  cd scaling
  for n in ${N_AGENTS:-1 2 3 4 6 8 10}; do
    run="simple_spread_v3__${name}_n${n}__${seed}"
    grep -q "^run in " "logs/$run.log" 2>/dev/null && continue
    rm -rf "runs/${run}__"*  # an unfinished earlier try
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    python "$here/$name.py" ${smoke[@]+"${smoke[@]}"} --preset tuned --n-agents "$n" --seed "$seed" --exp-name "${name}_n$n" \
      > "logs/$run.log" 2>&1 &
  done
  wait
  python "$here/benchmark_plot.py" runs --scaling --out .
}

sweep_configs() {  # the settings screened by `sweep`, one "name: flags" per line, flags changed from the official
  # spread settings, in the order they run. First the discount and the entropy bonus, the knobs an earlier probe found
  # strongest; then one knob at a time changed from g90 (gamma 0.9), the best of those for MAPPO.
  local base="--gamma 0.9"
  echo "official:"
  echo "g95e3: --gamma 0.95 --ent-coef 0.003"
  echo "g90e3: --gamma 0.9 --ent-coef 0.003"
  echo "g85e3: --gamma 0.85 --ent-coef 0.003"
  echo "g80e3: --gamma 0.8 --ent-coef 0.003"
  echo "g90: $base"
  echo "g90e1: --gamma 0.9 --ent-coef 0.001"
  echo "g90-threads16: $base --n-rollout-threads 16"
  echo "g90-epoch15: $base --ppo-epoch 15"
  echo "g90-epoch5: $base --ppo-epoch 5"
  echo "g90-minibatch2: $base --num-mini-batch 2"
  echo "g90-lr1e-3-decay: $base --lr 1e-3 --linear-lr-decay"
  echo "g90-lambda0.9: $base --gae-lambda 0.9"
  echo "g90-individual: $base --no-team-reward"
  echo "g90-clip0.1: $base --clip 0.1"
  if [ "$algo" = mat ] || [ "$algo" = mat_ep ]; then
    echo "g90-clip0.2: $base --clip 0.2"
    echo "g90-embd128: $base --n-embd 128"
    echo "g90-block2: $base --n-block 2"
  else
    echo "g90-hidden128: $base --hidden-size 128"
    echo "g90-relu: $base --activation relu"
  fi
}

sweep() {  # trains every setting of sweep_configs for 500k steps, JOBS at a time, skipping those already done
  local jobs="${JOBS:-2}" preset=official name flags  # the flags are changes from the official settings
  while IFS=: read -r name flags; do
    grep -q "^run in " "${algo}_sweep_${name}_seed$seed.log" 2>/dev/null && continue
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    # shellcheck disable=SC2086  # flags are words
    train "sweep_$name" --total-timesteps "$(steps 500000)" $flags > /dev/null &
  done < <(sweep_configs | head -n "$([ -n "${SMOKE:-}" ] && echo 2 || echo 100)")
  wait
  python - "$algo" "$seed" "$(sweep_configs)" <<'PY'
import glob, os, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
algo, seed, configs = sys.argv[1:]
print("| setting | flags (over the official spread settings) | half-way: train / eval | end: train / eval | entropy at the end |")
print("|---|---|---|---|---|")
for line in configs.splitlines():
    name, flags = line.split(":", 1)
    log = f"{algo}_sweep_{name}_seed{seed}.log"
    if not os.path.exists(log) or "\nrun in " not in open(log).read():  # not run, or stopped before the end
        continue
    run = max(glob.glob(f"runs/*__{algo}_sweep_{name}__{seed}__*"), key=os.path.getmtime)
    events = EventAccumulator(run, size_guidance={"scalars": 0})
    events.Reload()
    train = [(e.step, e.value) for e in events.Scalars("charts/episodic_return")]
    evals = [(e.step, e.value) for e in events.Scalars("eval/episodic_return")]
    cells = []
    for mark in (train[-1][0] // 2, train[-1][0]):  # 250k and 500k
        last = [v for s, v in train if s <= mark][-10:]
        cells.append(f"{sum(last) / len(last):.2f} / {[v for s, v in evals if s <= mark][-1]:.2f}")
    entropy = events.Scalars("losses/entropy")[-1].value
    print(f"| {name} | {f'`{flags.strip()}`' if flags.strip() else 'none'} | {cells[0]} | {cells[1]} | {entropy:.2f} |")
PY
}

env_id_of() {  # the mpe2 env id of grid scenario $1, or nothing
  case "$1" in
    spread) echo simple_spread_v3 ;;
    listener) echo simple_speaker_listener_v4 ;;
    reference) echo simple_reference_v3 ;;
  esac
}

grid_budget() {  # env steps per run of grid scenario $1 under budget $2
  case "$2:$1" in
    full:spread) echo 2000000 ;;
    full:listener) echo 2000000 ;;
    full:reference) echo 3000000 ;;
    quick:spread) echo 500000 ;;
    quick:listener) echo 500000 ;;
    quick:reference) echo 800000 ;;
  esac
}

grid_options() {  # reads the grid OPTIONS into budget, seeds, jobs, scripts and scenarios; one error line on bad input
  budget=full seeds="" jobs=2 scripts="mappo rnn mat mat_ep" scenarios="spread listener reference" out=""
  while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "error: $1 needs a value"; exit 1; }
    case "$1" in
      --budget) budget="$2" ;;
      --seeds) seeds="$2" ;;
      --jobs) jobs="$2" ;;
      --scripts) scripts="$2" ;;
      --scenarios) scenarios="$2" ;;
      --out) out="$(cd "$caller" && mkdir -p "$2" && cd "$2" && pwd)" ;;
      *) echo "error: unknown grid option $1 (options: --budget, --seeds, --jobs, --scripts, --scenarios, --out)"; exit 1 ;;
    esac
    shift 2
  done
  [ "$budget" = full ] || [ "$budget" = quick ] || { echo "error: --budget must be full or quick, not $budget"; exit 1; }
  [ -z "$seeds" ] || [[ "$seeds" =~ ^[1-9][0-9]*$ ]] || { echo "error: --seeds must be a positive integer, not $seeds"; exit 1; }
  [[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "error: --jobs must be a positive integer, not $jobs"; exit 1; }
  local name
  for name in $scripts; do
    [ -n "$(script_of "$name")" ] || { echo "error: unknown script $name (scripts: mappo rnn mat mat_ep)"; exit 1; }
  done
  for name in $scenarios; do
    [ -n "$(env_id_of "$name")" ] || { echo "error: unknown scenario $name (scenarios: spread listener reference)"; exit 1; }
  done
  [ -n "$scripts" ] && [ -n "$scenarios" ] || { echo "error: --scripts and --scenarios need at least one name"; exit 1; }
  out="${out:-$here/bench/grid_$budget}"
}

grid_runs() {  # "SCENARIO ALGO SEED" per run of the grid, scenario by scenario, the seeds of a script together
  local scenario name s
  for scenario in $scenarios; do
    for name in $scripts; do
      for s in $(seq "${seeds:-$([ "$scenario" = spread ] && echo 5 || echo 3)}"); do
        echo "$scenario $name $s"
      done
    done
  done
}

grid_command() {  # the training command of grid run $1 (scenario) $2 (ALGO) $3 (seed); it keeps the best model
  local smoke_flags=""
  [ ${#smoke[@]} -eq 0 ] || smoke_flags=" ${smoke[*]}"
  printf 'python %q%s --env-id %s --preset tuned --seed %s --total-timesteps %s --save-model\n' "$here/$(script_of "$2")" \
    "$smoke_flags" "$(env_id_of "$1")" "$3" "$(steps "$(grid_budget "$1" "$budget")")"
}

env_info() {  # JSON: each grid scenario's single-process random-action env step rate
  local scenario separator="{"
  for scenario in $scenarios; do
    printf '%s"%s": {"steps_per_s": %s}' "$separator" "$(env_id_of "$scenario")" "$(raw_env_rate "$(env_id_of "$scenario")")"
    separator=", "
  done
  echo "}"
}

absolute_metric() {  # the best model of run folder $1 (ENV__SCRIPT__SEED__TIME, with --save-model) re-evaluated
  # greedily on 320 mpe2 episodes, seeded apart from the 32 that chose it (the absolute metric of Gorsane et al.
  # 2022), into $1/absolute_metric.json
  python - "$here" "$1" <<'PY'
import json, os, sys
import torch
sys.path.insert(0, sys.argv[1])
run = sys.argv[2].rstrip("/")
_, script_name, seed, _ = os.path.basename(run).split("__")
script, seed = __import__(script_name), int(seed) + 1000
args = script.parse_args(["--eval-checkpoint", f"{run}/best_model.pt", "--n-eval-episodes", "320", "--seed", str(seed)])
returns = script.run_evaluation_only(args, torch.device("cpu"))  # (320, n_agents)
with open(f"{run}/absolute_metric.json", "w") as f:
    json.dump({"checkpoint": "best_model.pt", "seed": seed, "returns": returns.mean(axis=1).tolist()}, f)
PY
}

grid_run() {  # grid run $1 (scenario) $2 (ALGO) $3 (seed), run folder $4 less its time: trains it, or resumes a
  # stopped try from its checkpoint (on Ctrl-C each run saves one), then measures its absolute metric
  local checkpoint
  if ! grep -q "^run in " "logs/$4.log" 2>/dev/null; then
    checkpoint="$(compgen -G "runs/${4}__*/checkpoint.pt" || true)"
    [ -n "$checkpoint" ] || rm -rf runs/"${4}"__*  # the folder of an earlier try stopped before its first checkpoint
    eval "$(grid_command "$1" "$2" "$3") ${checkpoint:+--resume $checkpoint}" || return
  fi
  absolute_metric "$(compgen -G "runs/${4}__*")"
  python "$here/benchmark_plot.py" runs --records "$out/records" --records-only  # now: a grid stopped later keeps it
}

grid() {  # trains the grid in bench/grid_BUDGET, jobs at a time, skipping the runs with an absolute metric or a record
  # in OUT/records; then records the finished runs there and writes the plots, a table and marl_eval.json into OUT
  mkdir -p "grid_$budget/logs" "$out/records"
  cd "grid_$budget"
  [ -f "$out/env_info.json" ] || env_info > "$out/env_info.json"  # first, while the CPU is idle
  local start=$SECONDS scenario name s run
  while read -r scenario name s; do
    run="$(env_id_of "$scenario")__$(basename "$(script_of "$name")" .py)__$s"  # the run folder's name, less its time
    [ -f "$out/records/$run.json" ] || [ -n "$(compgen -G "runs/${run}__*/absolute_metric.json" || true)" ] && continue
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    grid_run "$scenario" "$name" "$s" "$run" >> "logs/$run.log" 2>&1 &
  done < <(grid_runs)
  wait
  echo "grid of $(grid_runs | wc -l) runs, $jobs side by side: $(( (SECONDS - start) / 60 )) minutes"
  python "$here/benchmark_plot.py" runs --records "$out/records" --env-info "$out/env_info.json" --out "$out"
}

listener_flags=(--env-id simple_speaker_listener_v4 --ppo-epoch 15)
reference_flags=(--env-id simple_reference_v3 --ppo-epoch 15 --total-timesteps "$(steps 3000000)")
if [ "$algo" = mappo ] || [ "$algo" = rnn ]; then  # as the official MAPPO runs these two: relu (its spread runs use tanh)
  listener_flags+=(--separate-actors --activation relu)
  reference_flags+=(--activation relu)
fi

case "$algo" in
  panel) panel | tee "panel.log"; exit ;;
  grid) grid_options "${@:2}"; grid | tee "grid_$budget.log"; exit ;;
  --print-commands)
    grid_options "${@:2}"
    grid_runs | while read -r scenario name s; do grid_command "$scenario" "$name" "$s"; done
    exit
    ;;
  absolute)
    for run in "${@:2}"; do
      cd "$caller" && run="$(cd "$run" && pwd)" && cd "$here/bench"
      [ -f "$run/absolute_metric.json" ] || absolute_metric "$run"
    done
    exit
    ;;
esac

case "${2:-}" in
  speed)
    log="${algo}_speed.log"
    read -r steal0 total0 <<< "$(cpu_times)"
    before=$(raw_env_rate simple_spread_v3)
    python "$script" ${smoke[@]+"${smoke[@]}"} --exp-name "${algo}_speed" --preset "$preset" --n-rollout-threads 32 \
      --total-timesteps "$(steps 300000)" \
      --eval-interval 1000000 \
      2>&1 | tee "$log"
    after=$(raw_env_rate simple_spread_v3)
    read -r steal1 total1 <<< "$(cpu_times)"
    sps=$(grep -o 'SPS *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
    python -c "r = ($before + $after) / 2; print(f'raw env rate {r:.0f} steps/s (before {$before}, after {$after}); end-to-end SPS $sps; ratio {$sps / r:.2f}; CPU time stolen by the host {100 * ($steal1 - $steal0) / ($total1 - $total0):.0f}%')" \
      | tee -a "$log"
    ;;
  env-rate)
    echo "| scenario | mpe2 parallel_env | batched, 32 envs | ratio | batched, 1,024 envs | ratio |"
    echo "|---|---|---|---|---|---|"
    for env_id in simple_spread_v3 simple_reference_v3 simple_speaker_listener_v4; do
      plain=$(raw_env_rate $env_id)
      small=$(batched_env_rate $env_id 32)
      large=$(batched_env_rate $env_id 1024)
      python -c "print(f'| $env_id | {$plain:,} | {$small:,} | {$small / $plain:.0f}x | {$large:,} | {$large / $plain:.0f}x |')"
    done | tee env_rate.log
    ;;
  versus) [ -n "${3:-}" ] || usage; versus "$3" 2>&1 | tee "${algo}_versus_$3.log" ;;
  spread) train spread ;;
  partial) train partial --env-id mpe2.simple_spread_v3 --env-kwargs num_agent_neighbors 1 num_landmark_neighbors 1 ;;
  listener) train listener "${listener_flags[@]}" ;;
  spread-continuous) train spread_continuous --continuous-actions ;;
  listener-continuous) train listener_continuous "${listener_flags[@]}" --continuous-actions ;;
  reference) train reference "${reference_flags[@]}" ;;
  resume) stop_and_resume 2>&1 | tee "${algo}_resume.log" ;;
  sweep) sweep | tee "${algo}_sweep.log" ;;
  scaling) scaling ;;
  threads) threads | tee "${algo}_threads.log" ;;
  devices) devices 2>&1 | tee "${algo}_devices.log" ;;
  official-task)
    official_task 2>&1 | tee "${algo}_official_task.log"
    curve "__${algo}_official_task__" | tee -a "${algo}_official_task.log"
    ;;
  acting) [ "$algo" = mat ] && acting_time | tee mat_acting.log ;;
  critic) [ "$algo" = mat ] && critic_time | tee mat_critic.log ;;
  *) usage ;;
esac
