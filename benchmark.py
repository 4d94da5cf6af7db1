"""The benchmark harness: the grid behind the README's results, the panel, scaling, single learning runs and the speed
measurements of docs/, each a mode that trains the scripts as a user runs them (a process a run, in bench/) and ends
with a Markdown table; benchmark_plot.py draws the figures. benchmark.sh holds the command of each README figure.

    python benchmark.py grid --out docs/benchmark/grid    # the README's results (about 10 hours on a 2-core CPU)
    python benchmark.py grid --print-commands             # its training commands, one per line, for a cluster
    python benchmark.py learn listener --script mat       # one run of mat_mpe.py on speaker-listener, and its curve
    python benchmark.py speed --script mappo --smoke      # any mode on a tiny budget, as the tests run them
"""

import contextlib
import dataclasses
import glob
import importlib
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import numpy as np
import torch
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import benchmark_plot

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {"mappo": "mappo_mpe", "rnn": "mappo_mpe_rnn", "mat": "mat_mpe", "mat_ep": "mat_mpe_ep_critic"}
SCENARIOS = {"spread": "simple_spread_v3", "listener": "simple_speaker_listener_v4", "reference": "simple_reference_v3"}
BUDGETS = {  # env steps per grid run: full is the README's
    "full": {"spread": 2_000_000, "listener": 2_000_000, "reference": 3_000_000},
    "quick": {"spread": 500_000, "listener": 500_000, "reference": 800_000},
}
# The single learning runs of `learn`: their flags under the preset. The official codes train speaker-listener and
# reference for 15 epochs (the MAPPO preset has it, MAT's adds it here); reference for 3M env steps.
LEARN_FLAGS = {
    "spread": "",
    "partial": "--env-id mpe2.simple_spread_v3 --env-kwargs num_agent_neighbors 1 num_landmark_neighbors 1",  # mpe2
    "listener": "--env-id simple_speaker_listener_v4",
    "reference": "--env-id simple_reference_v3 --total-timesteps 3000000",
    "spread-continuous": "--continuous-actions",
    "listener-continuous": "--env-id simple_speaker_listener_v4 --continuous-actions",
}
PANEL_ENVS = {  # envs nobody tuned for (docs/panel.md); arena and tutorial are not in the default panel
    "spread": "--env-id mpe2.simple_spread_v3",
    "multiwalker": "--env-id pettingzoo.sisl.multiwalker_v9",
    "kaz": "--env-id pettingzoo.butterfly.knights_archers_zombies_v11",
    "pursuit": "--env-id pettingzoo.sisl.pursuit_v5",
    "halfcheetah": "--env-id gymnasium_robotics.mamujoco_v1 --env-kwargs scenario HalfCheetah agent_conf 2x3",
    "arena": "--env-id tests.arena_env",  # short episodes and deaths
    "tutorial": "--env-id tests.tutorial_env:MeetEnv",  # written as PettingZoo's tutorial writes an env
    # EPyMARL's suites through the wrapper of docs/envs.md, evaluated by sampling as EPyMARL evaluates (issue 84)
    "lbf8": "--env-id epymarl_env --env-kwargs key Foraging-8x8-2p-2f-coop-v3 --eval-sample",
    "lbf8-2s": "--env-id epymarl_env --env-kwargs key Foraging-2s-8x8-2p-2f-coop-v3 --eval-sample",
    "lbf10": "--env-id epymarl_env --env-kwargs key Foraging-10x10-3p-3f-v3 --eval-sample",
    "rware-tiny": "--env-id epymarl_env --env-kwargs key rware-tiny-2ag-v2 time_limit 500 --eval-sample",
    # MAgent2's hundreds of agents (issue 100): gather's 495 share one team; battle's two teams of 81 one policy
    "gather": "--env-id magent2.environments.gather_v5",
    "battle": "--env-id magent2.environments.battle_v4 --no-team-reward",
}
# The settings screen of `sweep` (docs/tuning.md), changes from the official spread settings: the discount and the
# entropy bonus first, then one knob at a time changed from gamma 0.9 (G90), the best of those for MAPPO
SWEEP = {"official": "", **{f"g{g}e3": f"--gamma 0.{g} --ent-coef 0.003" for g in (95, 90, 85, 80)}}
G90 = {"g90": "", "g90e1": "--ent-coef 0.001", "g90-threads16": "--n-rollout-threads 16"}
G90 |= {"g90-epoch15": "--ppo-epoch 15", "g90-epoch5": "--ppo-epoch 5", "g90-minibatch2": "--num-mini-batch 2"}
G90 |= {"g90-lr1e-3-decay": "--lr 1e-3 --linear-lr-decay", "g90-lambda0.9": "--gae-lambda 0.9"}
G90 |= {"g90-individual": "--no-team-reward", "g90-clip0.1": "--clip 0.1"}
G90_OWN = {  # the script's own knobs
    "mat": {"g90-clip0.2": "--clip 0.2", "g90-embd128": "--n-embd 128", "g90-block2": "--n-block 2"},
    "mappo": {"g90-hidden128": "--hidden-size 128", "g90-relu": "--activation relu"},
}
SMOKE_FLAGS = "--total-timesteps 400 --n-rollout-threads 2 --episode-length 10 --n-eval-episodes 2 --eval-interval 100"
SMOKE_FLAGS += " --log-interval 100"  # each run 400 env steps: its table comes out, its numbers meaning nothing


@dataclasses.dataclass
class Mode:
    script: Literal["mappo", "rnn", "mat", "mat_ep"] = "mappo"
    """mappo (mappo_mpe.py), rnn (mappo_mpe_rnn.py), mat (mat_mpe.py) or mat_ep (mat_mpe_ep_critic.py)"""
    seed: int = 1
    """seed of the learning runs"""
    preset: Literal["tuned", "official"] = "tuned"
    """--preset of the learning runs: the scripts' own default, or the official codes' settings"""
    smoke: bool = False
    """a tiny budget, as the tests run each mode: 400 env steps a run, short timings, the first rows only"""
    bench: str = os.path.join(HERE, "bench")
    """where the runs (runs/), their logs and the tables go"""

    def command(self, *flags: str, script: str | None = None) -> list[str]:
        """A training command of `script` (this mode's by default), SMOKE_FLAGS first: the mode's own flags win."""
        file = os.path.join(HERE, f"{SCRIPTS[script or self.script]}.py")
        return [sys.executable, file, *SMOKE_FLAGS.split() * self.smoke, *flags]

    def learning(self, *flags: str) -> list[str]:
        return self.command("--seed", str(self.seed), "--preset", self.preset, *flags)

    def steps(self, n: int) -> str:
        return str(400 if self.smoke else n)

    def seconds(self, full: float) -> float:
        return 0.05 if self.smoke else full

    def path(self, *parts: str) -> str:
        os.makedirs(self.bench, exist_ok=True)
        return os.path.join(self.bench, *parts)


def run(command: list[str], log: str, cwd: str, tee: bool = False) -> int:
    """Runs `command` in `cwd` with its output into the file `log` (and to stdout with `tee`), each line as it is
    printed (a run's progress can be followed in its log); its exit status."""
    os.makedirs(os.path.dirname(log), exist_ok=True)
    env = os.environ | {"SDL_VIDEODRIVER": "dummy", "PYTHONUNBUFFERED": "1"}  # a pipe would hold 8 kB of lines back
    pipe = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(log, "a", buffering=1) as f, subprocess.Popen(command, cwd=cwd, env=env, **pipe) as process:
        for line in process.stdout:
            f.write(line)
            if tee:
                print(line, end="")
    return process.returncode


def resume_flags(runs: str, name: str) -> list[str]:
    """`--resume` with the newest checkpoint of the runs called `name` under `runs` (a stopped run goes on), or none."""
    checkpoints = sorted(glob.glob(os.path.join(runs, f"*{name}__*", "checkpoint.pt")), key=os.path.getmtime)
    return ["--resume", os.path.abspath(checkpoints[-1])] if checkpoints else []


def train_unfinished(jobs: int, commands: dict[str, list[str]], cwd: str):
    """Runs each training command of `commands` ({log: command}) whose log does not say it ended, `jobs` at a time."""
    run_jobs(jobs, [lambda log=log, c=c: run(c, log, cwd) for log, c in commands.items() if not finished(log)])


def run_jobs(jobs: int, tasks: list) -> list:
    """Calls each task (a function of no argument), `jobs` at a time; their results in order."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda task: task(), tasks))


def scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of a run folder's TensorBoard scalars."""
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def newest_run(runs: str, exp_name: str) -> str:
    return max(glob.glob(os.path.join(runs, f"*__{exp_name}__*")), key=os.path.getmtime)


def later_median(series: list[tuple[int, float]]) -> float:
    """The median of the later two thirds of a timing series (the first iterations warm up)."""
    return statistics.median([value for _, value in series][len(series) // 3 :])


def row(*cells) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def header(*columns: str) -> str:  # a Markdown table's first two lines
    return row(*columns) + "\n" + "|---" * len(columns) + "|"


def finished(log: str) -> bool:
    """Whether the training run that logs to `log` ended (its summary line, `run in ...`)."""
    return os.path.exists(log) and re.search("^run in ", open(log).read(), re.M) is not None


def returns_at(tags: dict, step: int) -> str:
    """Two cells: the mean of the last 10 logged training returns and the last evaluation, at or before `step`."""
    last = [v for s, v in tags["charts/episodic_return"] if s <= step][-10:]
    return f"{sum(last) / len(last):.2f} | {[v for s, v in tags['eval/episodic_return'] if s <= step][-1]:.2f}"


def curve_table(run_dir: str) -> str:
    """The training and evaluation returns of a run at round numbers of env steps, and its final SPS."""
    tags = scalars(run_dir)
    end = tags["charts/episodic_return"][-1][0]
    lines = [f"run {run_dir}: final SPS {tags['charts/SPS'][-1][1]:.0f}"]
    lines.append(header("env steps", "train (mean of the last 10 logs)", "eval (the last at or before)"))
    marks = [m * 100_000 for m in (1, 3, 5, 10, 15, 20, 25, 30) if m * 100_000 <= end + 1]
    lines += [row(f"{mark:,}", returns_at(tags, mark)) for mark in marks or [end]]
    return "\n".join(lines)


def script_module(name: str):
    sys.path.insert(0, HERE)
    return importlib.import_module(SCRIPTS.get(name, name))


def raw_env_rate(env_id: str, seconds: float) -> float:
    """Env steps per second of mpe2's parallel_env, one process, actions from action_space.sample()."""
    env = importlib.import_module(f"mpe2.{env_id}").parallel_env(max_cycles=25)
    env.reset(seed=0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step({a: env.action_space(a).sample() for a in env.agents})
        if not env.agents:
            env.reset()
        steps += 1
    return steps / (time.perf_counter() - start)


def batched_env_rate(env_id: str, n_envs: int, seconds: float) -> float:
    """Env steps per second of the scripts' BatchedMPE with `n_envs` envs on one CPU thread, random actions."""
    m = script_module("mappo")
    torch.set_num_threads(1)
    envs = m.BatchedMPE(
        m.get_env_spec(env_id, m.scenario_kwargs(m.Args(env_id=env_id))), n_envs, 0, torch.device("cpu")
    )
    envs.reset()
    n_actions = torch.as_tensor(envs.spec.avail_actions.sum(axis=1))  # (n_agents,)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step((torch.rand(n_envs, len(n_actions)) * n_actions).long())
        steps += 1
    return steps * n_envs / (time.perf_counter() - start)


def timed(call, seconds: float) -> float:
    """Milliseconds per call of `call`, over `seconds` after 3 warm-up calls."""
    for _ in range(3):
        call()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or not calls:
        call()
        calls += 1
    return 1000 * (time.perf_counter() - start) / calls


# ---------------------------------------- The grid -------------------------------------------------------------------


@dataclasses.dataclass
class Grid(Mode):
    """Scripts x scenarios x seeds with --preset tuned, each keeping its best model, then its absolute metric (that
    model re-evaluated greedily on 320 mpe2 episodes) and a record of it (curves and numbers, a few kB) in OUT/records;
    the figures, results.md (rliable's IQM, mean and optimality gap with 95% bootstrap intervals) and marl_eval.json
    from the records. Run again, after Ctrl-C or on another machine with OUT's records, it skips the recorded runs and
    resumes the stopped ones from their checkpoints."""

    budget: Literal["full", "quick"] = "full"
    """full: spread 2M, speaker-listener 2M, reference 3M env steps (the README's); quick: 500k, 500k, 800k"""
    seeds: int = 0
    """seeds a script and scenario; 0: 5 on spread, 3 elsewhere"""
    jobs: int = 2
    """runs side by side"""
    scripts: tuple[Literal["mappo", "rnn", "mat", "mat_ep"], ...] = ("mappo", "rnn", "mat", "mat_ep")  # to train
    scenarios: tuple[Literal["spread", "listener", "reference"], ...] = ("spread", "listener", "reference")  # on
    out: str = ""
    """folder of the records, figures and tables (the README's: docs/benchmark/grid); default bench/grid_BUDGET"""
    print_commands: bool = False
    """only print the training commands, one per line (for a cluster), and train nothing"""

    def runs(self) -> list[tuple[str, str, int]]:
        """(scenario, script, seed) of every run, scenario by scenario, the seeds of a script together."""
        seeds = lambda scenario: self.seeds or (5 if scenario == "spread" else 3)
        return [(c, s, k) for c in self.scenarios for s in self.scripts for k in range(1, seeds(c) + 1)]

    def training(self, scenario: str, script: str, seed: int) -> list[str]:
        steps = self.steps(BUDGETS[self.budget][scenario])
        flags = ["--env-id", SCENARIOS[scenario], "--preset", "tuned", "--seed", str(seed), "--total-timesteps", steps]
        return ["python", *self.command(*flags, "--save-model", script=script)[1:]]

    def __call__(self):
        if self.print_commands:
            print("\n".join(shlex.join(self.training(*r)) for r in self.runs()))
            return
        work, out = self.path(f"grid_{self.budget}"), os.path.abspath(self.out or self.path(f"grid_{self.budget}"))
        records, info = os.path.join(out, "records"), os.path.join(out, "env_info.json")
        os.makedirs(records, exist_ok=True)
        if not os.path.exists(info):  # first, while the CPU is idle
            rates = {SCENARIOS[c]: round(raw_env_rate(SCENARIOS[c], self.seconds(10))) for c in self.scenarios}
            benchmark_plot.write(info, json.dumps({env_id: {"steps_per_s": rate} for env_id, rate in rates.items()}))
        lock, start = threading.Lock(), time.time()

        def train(scenario: str, script: str, seed: int):
            name = f"{SCENARIOS[scenario]}__{SCRIPTS[script]}__{seed}"  # the run folder's name, less its time
            log = os.path.join(work, "logs", f"{name}.log")
            if not finished(log):
                resume = resume_flags(os.path.join(work, "runs"), name)
                for folder in [] if resume else glob.glob(os.path.join(work, "runs", f"{name}__*")):
                    shutil.rmtree(folder)  # an earlier try stopped before its first checkpoint
                if run([sys.executable, *self.training(scenario, script, seed)[1:], *resume], log, work):
                    return
            (folder,) = glob.glob(os.path.join(work, "runs", f"{name}__*"))
            run([sys.executable, __file__, "absolute", folder], log, work)
            with lock:  # now: a grid stopped later keeps it
                benchmark_plot.save_records(os.path.join(work, "runs"), records)

        done = lambda c, s, k: os.path.exists(os.path.join(records, f"{SCENARIOS[c]}__{SCRIPTS[s]}__{k}.json"))  # noqa
        run_jobs(self.jobs, [lambda r=r: train(*r) for r in self.runs() if not done(*r)])
        print(f"grid of {len(self.runs())} runs, {self.jobs} side by side: {(time.time() - start) / 60:.0f} minutes")
        benchmark_plot.main(benchmark_plot.Args(os.path.join(work, "runs"), env_info=info, out=out, records=records))


def absolute_metric(run_dir: str):
    """The best model of a run folder (ENV__SCRIPT__SEED__TIME, trained with --save-model) re-evaluated greedily on
    320 mpe2 episodes seeded apart from the 32 that chose it (the absolute metric of Gorsane et al. 2022), into
    RUN_DIR/absolute_metric.json; a run that has one keeps it."""
    path = os.path.join(run_dir, "absolute_metric.json")
    if os.path.exists(path):
        return
    _, script_name, seed, _ = os.path.basename(os.path.abspath(run_dir)).split("__")
    script, seed = script_module(script_name), int(seed) + 1000
    flags = ["--eval-checkpoint", f"{run_dir}/best_model.pt", "--n-eval-episodes", "320", "--seed", str(seed)]
    args = script.parse_args(flags)
    returns = script.run_evaluation_only(args)  # (320, n_agents), on the CPU
    with open(path, "w") as f:
        json.dump({"checkpoint": "best_model.pt", "seed": seed, "returns": returns.mean(axis=1).tolist()}, f)


# ---------------------------------------- Learning runs --------------------------------------------------------------


@dataclasses.dataclass
class Learn(Mode):
    """One learning run of the script on a scenario (LEARN_FLAGS), logged to bench/SCRIPT_SCENARIO[_PRESET]_seedSEED
    .log, then its returns at round numbers of env steps."""

    scenario: tyro.conf.Positional[Literal[tuple(LEARN_FLAGS)]] = "spread"  # with its flags of LEARN_FLAGS

    def __call__(self):
        name = f"{self.script}_{self.scenario}" + ("_official" if self.preset == "official" else "")
        flags = LEARN_FLAGS[self.scenario].split()
        if self.preset == "official" and self.scenario.split("-")[0] in ("listener", "reference"):
            flags += ["--ppo-epoch", "15"]
        run(self.learning(*flags, "--exp-name", name), self.path(f"{name}_seed{self.seed}.log"), self.bench, tee=True)
        print(curve_table(newest_run(self.path("runs"), f"{name}__{self.seed}")))


@dataclasses.dataclass
class Panel(Mode):
    """Each env of the panel x scripts x seeds with the defaults an env without a preset gets (no flag but the env's
    own), skipping finished runs and resuming stopped ones; each env's uniformly random policy first (20 episodes);
    then a table."""

    envs: tuple[Literal[tuple(PANEL_ENVS)], ...] = ("spread", "multiwalker", "kaz", "pursuit", "halfcheetah")
    """envs of PANEL_ENVS"""
    scripts: tuple[Literal["mappo", "rnn", "mat", "mat_ep"], ...] = ("mappo", "rnn", "mat", "mat_ep")  # to train
    seeds: tuple[int, ...] = (1,)  # of each script on each env
    budget: int = 500_000
    """env steps per run"""
    jobs: int = 2
    """runs side by side"""

    def __call__(self):
        work, commands, rows = self.path("panel"), {}, []
        os.makedirs(work, exist_ok=True)
        if any("epymarl_env" in PANEL_ENVS[env] for env in self.envs):  # importable here and in the trainings
            benchmark_plot.write(os.path.join(work, "epymarl_env.py"), envs_md_wrapper())
            sys.path.insert(0, work)
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [work, os.environ.get("PYTHONPATH")]))
        randoms = benchmark_plot.read_json(os.path.join(work, "random.json"), {})  # measured once an env
        randoms |= {env: random_return(PANEL_ENVS[env].split()) for env in self.envs if env not in randoms}
        benchmark_plot.write(os.path.join(work, "random.json"), json.dumps(randoms))
        for env, script, seed in [(e, s, k) for e in self.envs for s in self.scripts for k in self.seeds]:
            name, budget = f"panel_{env}_{script}_{seed}", self.steps(self.budget)
            flags = [*PANEL_ENVS[env].split(), "--seed", str(seed), "--total-timesteps", budget, "--exp-name", name]
            resume = resume_flags(os.path.join(work, "runs"), f"__{name}")  # a run stopped by a sitting's end
            commands[log := os.path.join(work, "logs", f"{name}.log")] = self.command(*flags, *resume, script=script)
            rows.append((env, script, seed, name, log))
        train_unfinished(self.jobs, commands, work)
        print(header("env", "random", "script", "seed", "env steps", "train (last 10% of episodes)", "eval (last)"))
        for env, script, seed, name, log in rows:
            if not finished(log):  # it failed: its log says why
                print(row(env, f"{randoms[env]:.2f}", script, seed, f"failed, see {log}", "", ""))
                continue
            tags = scalars(newest_run(os.path.join(work, "runs"), name))
            train = [v for _, v in tags.get("charts/episodic_return", [])]
            (step, last), mean = tags["eval/episodic_return"][-1], np.mean(train[-max(1, len(train) // 10) :])
            print(f"| {env} | {randoms[env]:.2f} | {script} | {seed} | {step:,} | {mean:.2f} | {last:.2f} |")


def envs_md_wrapper() -> str:
    """The wrapper docs/envs.md gives for EPyMARL's gymnasium envs (epymarl_env.py), as a user copies it."""
    page = open(os.path.join(HERE, "docs", "envs.md")).read()
    return re.search(r"```python\n(# epymarl_env\.py.*?)```", page, re.S).group(1)


def random_return(flags: list[str]) -> float:
    """The mean per-agent return of 20 episodes of seeded uniformly random actions in the env of `flags`."""
    m = script_module("mappo")
    args = m.parse_args(flags)
    env, returns = m.make_env(args.env_id, m.scenario_kwargs(args)), []
    for episode in range(20):
        env.reset(seed=episode)
        spaces = {a: env.action_space(a) for a in env.possible_agents}
        for i, space in enumerate(spaces.values()):  # the episode's random actions, the same every time
            space.seed(1000 * episode + i)
        total = dict.fromkeys(spaces, 0.0)
        while env.agents:
            for agent, reward in env.step({a: spaces[a].sample() for a in env.agents})[1].items():
                total[agent] += reward
        returns.append(np.mean(list(total.values())))
    return float(np.mean(returns))


# ---------------------------------------- Random envs ----------------------------------------------------------------

RANDOM_ENV = "tests.random_env:RandomEnv"  # its behaviour set by --env-kwargs (see its docstring)
RANDOM_FLAGS = "--total-timesteps 400 --n-rollout-threads 2 --n-eval-episodes 2 --eval-interval 200 --ppo-epoch 1"
REFUSED = {  # a kind the README refuses: the text its error line holds
    "obs": {"image": "unsupported observations", "tuple": "unsupported observations"},
    "action": dict.fromkeys(("box_unbounded", "box_half", "multidiscrete", "mixed"), "unsupported actions"),
}
NOT_FINITE = ("returned a NaN or infinity", "does not fit")  # a Box observation, or a discrete one
FAULTS = {  # a fault of the env: the texts of which its error line holds one
    "reset": ("its reset() raised",),
    "step": ("its step() raised",),
    "nan_obs": NOT_FINITE,
    "nan_reward": ("returned a NaN or infinity",),
    "inf_obs_dying": NOT_FINITE,
}
# Chosen configurations beside the drawn ones: each defect the check has found, and the README's edge cases
CHOSEN_CONFIGS = [
    dict(action="box_unbounded"),  # -inf + inf was a numpy warning before the error line
    dict(fault="inf_obs_dying", fault_at=10, death_chance=0.1, n_agents=3),  # inf * 0 likewise
    dict(state="left", death_chance=0.002, n_agents=3),  # a state() that fails after deaths the probe may not see
    dict(masks="info", masks_at_reset=False),  # masks in step()'s infos only: they were ignored
    dict(state="infinite", fault_at=30),  # an infinite state() was reported as step()'s
    dict(obs="sizes", n_agents=3, wide_obs=True),  # a wider observation within the padding was taken
    dict(masks="observation", mask_dtype="bool", action_start=3, n_agents=3),
    dict(obs="discrete", masks="info", mask_dtype="float32"),
    dict(obs="multidiscrete", limit=0, death_chance=0.05),  # no time limit: the deaths end the episodes
    dict(obs="box2d", action="box", death_chance=0.1, state="box"),
    dict(state="left", death_chance=0.2),  # the probe sees a death: the observations joined, one warning
    dict(state="wrong_size"),
    dict(obs="multibinary", action="box", masks="info"),  # masks with Box actions: refused
    dict(fault="reset", fault_at=20),
    dict(fault="nan_reward", fault_at=15, obs="sizes"),
]


def random_env_config(seed: int) -> dict:
    """A configuration of tests/random_env.py drawn from `seed`: the common kinds mostly, a refused kind, a fault or a
    wider observation sometimes, so that most runs train and each way of failing comes up."""
    rng = np.random.default_rng(seed)
    pick = lambda options, chances=None: options[rng.choice(len(options), p=chances)]
    config = dict(n_agents=int(rng.integers(1, 5)), limit=pick([10, 25, 7, 0], [0.4, 0.3, 0.2, 0.1]))
    kinds = ["box", "box2d", "sizes", "discrete", "multidiscrete", "multibinary", "image", "tuple"]
    config["obs"] = pick(kinds, [0.2, 0.15, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05])
    config["action"] = pick(
        ["discrete", "box", "box_unbounded", "box_half", "multidiscrete", "mixed"], [0.5, 0.3] + [0.05] * 4
    )
    config["death_chance"] = pick([0.0, 0.02, 0.1, 0.3])
    masks = pick(
        ["", "info", "observation"], [0.3, 0.35, 0.35] if config["action"] == "discrete" else [0.9, 0.05, 0.05]
    )
    if masks:
        config |= dict(
            masks=masks, mask_dtype=pick(["int8", "bool", "float32"]), masks_at_reset=bool(rng.random() < 0.7)
        )
    config["state"] = pick(["none", "box", "left", "wrong_size", "infinite"], [0.35, 0.3, 0.2, 0.05, 0.1])
    if rng.random() < 0.25:
        config |= dict(fault=pick(list(FAULTS)), fault_at=int(rng.integers(0, 150)))
    if config["obs"] == "sizes" and config["n_agents"] > 1 and rng.random() < 0.2:
        config["wide_obs"] = True
    if config["action"] == "discrete" and rng.random() < 0.3:
        config["action_start"] = int(rng.integers(1, 4))
    if config["limit"] == 0 and not config["death_chance"]:  # an episode that never ends: evaluations at their cap
        config["death_chance"] = 0.05
    return config


def promised_outcome(config: dict) -> tuple[str, ...]:
    """What the README promises for a configuration: ("clean",), or ("error", text...) for one `error:` line holding one
    of the texts; ("clean", "error", text) where either is promised (a state() that fails once an agent left, when
    the start-up probe may not see a death)."""
    texts = [REFUSED[key][config[key]] for key in REFUSED if config.get(key) in REFUSED[key]]
    if config.get("action") == "mixed" and config.get("n_agents", 2) == 1:  # agent 0's Discrete alone: not a mix
        texts.remove("unsupported actions")
    if config.get("masks") and config.get("action", "discrete") != "discrete":
        texts.append("unsupported action masks")
    if config.get("wide_obs"):
        texts.append("does not fit")
    texts += {"wrong_size": ["has 6 numbers"], "infinite": ["its state() returned a NaN or infinity"]}.get(
        config.get("state"), []
    )
    fault = config.get("fault", "")
    if fault and (fault != "reset" or config.get("limit", 10) or config.get("death_chance")):
        if fault != "inf_obs_dying" or config.get("death_chance"):
            texts += FAULTS[fault]
    if texts:
        return ("error", *texts)
    if config.get("state") == "left" and config.get("death_chance"):  # where the probe met a death, or not
        return ("clean", "error", "once an agent left")
    return ("clean",)


def run_random_env(script: str, config: dict, timeout: float = 300.0) -> tuple[str, str]:
    """Trains `script` on the configured env at a tiny budget, as a new user runs it: what happened (`classify`) and
    the output's last line; "hang" where it ran past `timeout` seconds."""
    kwargs = [str(x) for item in config.items() for x in item]
    command = [
        sys.executable,
        os.path.join(HERE, f"{SCRIPTS[script]}.py"),
        "--env-id",
        RANDOM_ENV,
        "--env-kwargs",
        *kwargs,
    ]
    with tempfile.TemporaryDirectory() as cwd:
        try:
            env = os.environ | {"SDL_VIDEODRIVER": "dummy", "PYTHONPATH": HERE}
            result = subprocess.run(
                command + RANDOM_FLAGS.split(), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
            )
        except subprocess.TimeoutExpired:
            return "hang", f"no end after {timeout:.0f} s"
    return classify(result.returncode, result.stdout, result.stderr)


def classify(returncode: int, stdout: str, stderr: str) -> tuple[str, str]:
    """What a run's exit code and output say happened: "clean" (exit 0, nothing on stderr), "one error line" (exit 1
    and a single `error:` line), "forbidden action" (one error line about one), "error line with other lines before
    it", "traceback", or "exit N"; and the output's last line."""
    errors = stderr.strip().splitlines()
    last = (errors or stdout.strip().splitlines() or [""])[-1]
    if "Traceback" in stderr:
        return "traceback", last
    if returncode == 0 and not errors:
        return "clean", last
    if returncode == 1 and len(errors) == 1 and last.startswith("error:"):
        return ("forbidden action" if "forbidden action" in last else "one error line"), last
    if last.startswith("error:"):
        return "error line with other lines before it", last
    return f"exit {returncode}", last


def random_env_verdict(config: dict, outcome: str, last: str) -> bool:
    """Whether what happened is what the README promises for the configuration."""
    promised = promised_outcome(config)
    if outcome == "clean":
        return "clean" in promised
    return (
        outcome == "one error line"
        and "error" in promised
        and any(text in last for text in promised if text not in ("clean", "error"))
    )


@dataclasses.dataclass
class RandomEnvs(Mode):
    """The README's promises held against random envs: configurations of tests/random_env.py (CHOSEN_CONFIGS, then
    ones drawn from seeds), each through one script in turn at a tiny budget: what happened against what the README
    promises (trains clean, or ends in exactly one `error:` line that names the fault), a reproducing command for each
    defect, and a table (bench/random_envs.md)."""

    drawn: int = 85
    """configurations drawn from seeds 0, 1, ... beside the 15 chosen ones"""
    jobs: int = 2
    """runs side by side"""

    def __call__(self):
        configs = CHOSEN_CONFIGS + [random_env_config(seed) for seed in range(self.drawn)]
        configs = configs[: 2 if self.smoke else None]
        scripts = list(SCRIPTS)
        runs = [(scripts[k % len(scripts)], config) for k, config in enumerate(configs)]
        outcomes = run_jobs(self.jobs, [lambda r=r: run_random_env(*r) for r in runs])
        lines = [header("#", "script", "--env-kwargs", "promised", "what happened", "last line", "verdict")]
        defects = []
        for k, ((script, config), (outcome, last)) in enumerate(zip(runs, outcomes)):
            ok = random_env_verdict(config, outcome, last)
            kwargs = shlex.join(str(x) for item in config.items() for x in item)
            promised = " or ".join(x for x in promised_outcome(config)[:2])
            lines.append(
                row(k, script, kwargs, promised, outcome, last[:100].replace("|", "/"), "ok" if ok else "DEFECT")
            )
            if not ok:
                defects.append(
                    f"python {SCRIPTS[script]}.py --env-id {RANDOM_ENV} --env-kwargs {kwargs} {RANDOM_FLAGS}"
                )
        lines.append(f"\n{len(runs)} configurations, {len(defects)} defects")
        lines += [f"- `{command}`" for command in defects]
        benchmark_plot.write(self.path("random_envs.md"), "\n".join(lines) + "\n")
        print("\n".join(lines))


@dataclasses.dataclass
class Scaling(Mode):
    """Spread at each team size, 2M env steps, skipping finished runs; then the final return against N of every
    script run so, with the hand-written policies (returns_vs_agents.png, scaling.md); the points of OUT/scaling.json
    that these runs do not have stay."""

    n_agents: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 10)  # the team sizes
    jobs: int = 2
    """runs side by side"""
    out: str = ""
    """folder of the figure, scaling.md and scaling.json (the README's: docs/benchmark/scaling); empty: bench/scaling"""

    def __call__(self):
        work, commands = self.path("scaling"), {}
        for n, name in [(n, f"{SCRIPTS[self.script]}_n{n}") for n in self.n_agents]:
            log = os.path.join(work, "logs", f"simple_spread_v3__{name}__{self.seed}.log")
            for folder in [] if finished(log) else glob.glob(f"{work}/runs/simple_spread_v3__{name}__{self.seed}__*"):
                shutil.rmtree(folder)  # an unfinished earlier try
            commands[log] = self.learning("--n-agents", str(n), "--exp-name", name)
        train_unfinished(self.jobs, commands, work)
        benchmark_plot.main(benchmark_plot.Args(os.path.join(work, "runs"), scaling=True, out=self.out or work))


@dataclasses.dataclass
class Sweep(Mode):
    """The settings screen of SWEEP, G90 and the script's G90_OWN: spread, 500k env steps per setting with the
    official settings under each change, skipping those done; then a table at half-way and at the end."""

    preset: Literal["tuned", "official"] = "official"  # the settings the changes are laid over
    jobs: int = 2
    """runs side by side"""

    def __call__(self):
        own = G90 | G90_OWN["mat" if "mat" in self.script else "mappo"]
        configs = SWEEP | {name: f"--gamma 0.9 {flags}".strip() for name, flags in own.items()}
        configs = dict(list(configs.items())[: 2 if self.smoke else None])
        logs = {name: self.path(f"{self.script}_sweep_{name}_seed{self.seed}.log") for name in configs}
        budget = ["--total-timesteps", self.steps(500_000), "--ppo-epoch", "10"]  # MAT's too: one change a row
        commands = {
            logs[n]: self.learning(*budget, *f.split(), "--exp-name", f"{self.script}_sweep_{n}")
            for n, f in configs.items()
        }
        train_unfinished(self.jobs, commands, self.bench)
        columns = "half-way: train", "eval", "end: train", "eval", "entropy at the end"
        print(header("setting", "flags (over the official spread settings)", *columns))
        for name, flags in [(n, f) for n, f in configs.items() if finished(logs[n])]:
            tags = scalars(newest_run(self.path("runs"), f"{self.script}_sweep_{name}__{self.seed}"))
            end, entropy = tags["charts/episodic_return"][-1][0], tags["losses/entropy"][-1][1]
            halves = [returns_at(tags, step) for step in (end // 2, end)]
            print(row(name, f"`{flags}`" if flags else "none", *halves, f"{entropy:.2f}"))


@dataclasses.dataclass
class Resume(Mode):
    """Spread for 600k env steps straight, and the same run stopped by SIGTERM at 300k, then resumed: equal
    parameters and equal logs, step for step?"""

    def __call__(self):
        total, runs = self.steps(600_000), self.path("runs")
        stop = int(total) // 2  # at the first progress line from half-way on
        straight, stopped = (
            self.learning("--total-timesteps", total, "--exp-name", f"{self.script}_resume_{k}")
            for k in ("straight", "stopped")
        )
        run(straight, self.path(f"{self.script}_resume_straight.log"), self.bench)
        log = self.path(f"{self.script}_resume_stopped.log")
        with open(log, "w") as f:
            process = subprocess.Popen([straight[0], "-u", *stopped[1:]], cwd=self.bench, stdout=f, stderr=f)
        logged = lambda: [int(n.replace(",", "")) for n in re.findall(r"^step +([\d,]+)/", open(log).read(), re.M)]
        while max(logged(), default=0) < stop:
            if process.poll() is not None:
                raise SystemExit(f"error: the run to stop ended first: {open(log).read()[-500:]}")
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        process.wait()
        print(open(log).read().splitlines()[-1])  # where it stopped
        resumed = newest_run(runs, f"{self.script}_resume_stopped")
        run([*stopped, "--resume", f"{resumed}/checkpoint.pt"], log, self.bench)
        print(curve_table(resumed))
        print(same_runs(newest_run(runs, f"{self.script}_resume_straight"), resumed))


def same_runs(straight: str, resumed: str) -> str:
    """Whether two runs' final checkpoints hold bit-identical parameters and their logs the same values at every
    step (wall-clock times aside)."""
    a, b = (torch.load(f"{run_dir}/checkpoint.pt", weights_only=True) for run_dir in (straight, resumed))
    same = a["agent"].keys() == b["agent"].keys() and all(torch.equal(a["agent"][k], b["agent"][k]) for k in a["agent"])
    timing = lambda tag: tag == "charts/SPS" or tag.startswith("perf/")
    x, y = ({t: v for t, v in scalars(r).items() if not timing(t)} for r in (straight, resumed))
    differing = [t for t in x if x[t] != y.get(t)]
    identical = not differing and x.keys() == y.keys()
    return (
        f"at step {a['global_step']:,} and {b['global_step']:,}: parameters bit-identical: {same}; {len(x)} logged "
        f"series, identical at every step: {identical} {differing}"
    )


@dataclasses.dataclass
class OfficialTask(Mode):
    """Spread, 500k env steps with the official settings, on the task of the official codes' MPE copy (landmarks in
    0.8 x U(-1, 1), damping and acceleration before the move), in training (the batched env) and in evaluation."""

    def __call__(self):
        from unittest import mock

        from mpe2._mpe_utils import core
        from mpe2.simple_spread import simple_spread

        m, scenario = script_module(self.script), simple_spread.Scenario

        def reset_world(self, world, np_random, reset_world=scenario.reset_world):
            reset_world(self, world, np_random)
            for landmark in world.landmarks:
                landmark.state.p_pos = 0.8 * np_random.uniform(-1, +1, world.dim_p)

        def reset_envs(self, envs, reset_envs=m.BatchedMPE.reset_envs):
            reset_envs(self, envs)
            scale = torch.where(envs[:, None, None], 0.8, 1.0)  # the landmarks of the envs just reset
            self.pos = torch.cat([self.pos[:, : self.n_agents], self.pos[:, self.n_agents :] * scale], dim=1)

        def integrate_state(self, p_force):  # the official copy moves with the new velocity, mpe2 with the old
            for entity, force in [(e, f) for e, f in zip(self.entities, p_force) if e.movable]:  # spread's agents
                entity.state.p_vel = entity.state.p_vel * (1 - self.damping) + (force / entity.mass) * self.dt
                entity.state.p_pos += entity.state.p_vel * self.dt  # they have no max_speed

        def integrate(self, force):
            self.vel = self.vel * (1 - m.DAMPING) + force * m.DT
            self.pos = torch.cat([self.pos[:, : self.n_agents] + self.vel * m.DT, self.pos[:, self.n_agents :]], dim=1)

        patches = [(scenario, "reset_world", reset_world), (m.BatchedMPE, "reset_envs", reset_envs)]
        patches += [(core.World, "integrate_state", integrate_state), (m.BatchedMPE, "integrate", integrate)]
        name = f"{self.script}_official_task"
        flags = ["--seed", str(self.seed), "--preset", "official", "--total-timesteps", self.steps(500_000)]
        argv = self.command(*flags, "--exp-name", name)[2:]
        with contextlib.ExitStack() as stack, contextlib.chdir(self.path()):
            for owner, attribute, new in patches:
                stack.enter_context(mock.patch.object(owner, attribute, new))
            m.main(m.parse_args(argv))
        print(curve_table(newest_run(self.path("runs"), name)))


# ---------------------------------------- Speed ----------------------------------------------------------------------


def cpu_times() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs since boot; the host takes steal time from this VM."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
    return fields[7], sum(fields)


@dataclasses.dataclass
class Speed(Mode):
    """SPS of a 300k-step spread run with 32 envs, next to mpe2's raw env step rate before and after it."""

    def __call__(self):
        (steal0, total0), before = cpu_times(), raw_env_rate("simple_spread_v3", self.seconds(10))
        log = self.path(f"{self.script}_speed.log")
        flags = ["--n-rollout-threads", "32", "--total-timesteps", self.steps(300_000), "--eval-interval", "1000000"]
        run(self.learning(*flags, "--exp-name", f"{self.script}_speed"), log, self.bench, tee=True)
        after, (steal1, total1) = raw_env_rate("simple_spread_v3", self.seconds(10)), cpu_times()
        sps, rate = int(re.findall(r"SPS +(\d+)", open(log).read())[-1]), (before + after) / 2
        print(
            f"raw env rate {rate:.0f} steps/s (before {before:.0f}, after {after:.0f}); end-to-end SPS {sps}; ratio "
            f"{sps / rate:.2f}; CPU time stolen by the host {100 * (steal1 - steal0) / (total1 - total0):.0f}%"
        )


@dataclasses.dataclass
class EnvRate(Mode):
    """Env steps per second with random actions, one thread: mpe2's parallel_env and the batched env."""

    def __call__(self):
        print(header("scenario", "mpe2 parallel_env", "batched, 32 envs", "ratio", "batched, 1,024 envs", "ratio"))
        for env_id in SCENARIOS.values():
            plain = raw_env_rate(env_id, self.seconds(10))
            small, large = (batched_env_rate(env_id, n, self.seconds(5)) for n in (32, 1024))
            cells = f"{plain:,.0f}", f"{small:,.0f}", f"{small / plain:.0f}x", f"{large:,.0f}", f"{large / plain:.0f}x"
            print(row(env_id, *cells))


@dataclasses.dataclass
class Devices(Mode):
    """The same command on the CPU and with --cuda (eager and compiled) at each number of rollout threads, a few
    iterations a run, evaluating at the last, a torch thread per core; then SPS and per-phase times of every run."""

    threads: tuple[int, ...] = (32, 512, 4096)  # --n-rollout-threads of the runs
    devices: tuple[Literal["cpu", "cuda"], ...] = ("cpu", "cuda")  # cuda: eager (--no-compile) and compiled
    iterations: int = 12  # of each run
    run_timeout: int = 300
    """seconds a run may take"""

    def __call__(self):
        for n, device in [(n, d) for n in self.threads for d in self.devices]:
            for mode in ("eager", "compile") if device == "cuda" else ("eager",):
                name = f"{self.script}_devices_{device}_{n}_{mode}"
                flags = ["--n-rollout-threads", str(n), "--total-timesteps", self.steps(n * 25 * self.iterations)]
                flags += ["--eval-interval", str(10**12), "--n-training-threads", str(os.cpu_count())]
                eager = mode == "eager" and device == "cuda" and self.script != "rnn"  # which has no --compile
                flags += ["--cuda"] * (device == "cuda") + ["--no-compile"] * eager
                command = ["timeout", str(self.run_timeout), *self.learning(*flags, "--exp-name", name)]
                if run(command, self.path("devices", f"{name}.log"), self.bench):
                    print(f"{name} failed: {open(self.path('devices', f'{name}.log')).read().splitlines()[-1:]}")
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
        print(f"{self.script}: {gpu}, {os.cpu_count()} CPU cores (a torch thread each), torch {torch.__version__}")
        print(header("device", "threads", "compile", "env steps", "SPS", "steady SPS", "rollout ms", "update ms"))
        for run_dir in sorted(glob.glob(self.path("runs", f"*__{self.script}_devices_*")), key=os.path.getmtime):
            _, device, n, mode = os.path.basename(run_dir).split("__")[1].rsplit("_", 3)
            tags = scalars(run_dir)
            if "perf/update_ms" in tags:
                rollout, update = later_median(tags["perf/rollout_ms"]), later_median(tags["perf/update_ms"])
                (step, sps), steady = tags["charts/SPS"][-1], int(n) * 25 / (rollout + update) * 1000
                times = f"{sps:,.0f}", f"{steady:,.0f}", f"{rollout:.1f}", f"{update:.1f}"
                print(row(device, n, mode, f"{step:,}", *times))


@dataclasses.dataclass
class Threads(Mode):
    """SPS of one run alone and of two side by side, with one torch thread (the default on 2 cores) and one per core:
    spread with --preset tuned on the batched env (96k steps), then mpe2's spread on the generic path (19,200)."""

    def __call__(self):
        print(header("env path", "torch threads", "alone: SPS", "side by side: SPS of each", "slowdown"))
        os.environ.pop("OMP_NUM_THREADS", None)
        paths = {"batched": ["--preset", "tuned", "--total-timesteps", self.steps(96_000)]}
        paths["generic"] = ["--env-id", "mpe2.simple_spread_v3", "--total-timesteps", self.steps(19_200)]
        for path, flags in paths.items():
            for threads in (1,) if self.smoke else (1, os.cpu_count()):
                logs = [self.path("threads", f"{path}_{threads}_{k}.log") for k in range(3)]
                command = self.command(*flags, "--n-training-threads", str(threads), "--eval-interval", str(10**9))
                run(command, logs[0], self.bench)  # alone, then two side by side
                run_jobs(2, [lambda c=command, g=g: run(c, g, self.bench) for g in logs[1:]])
                sps = [int(re.findall(r"SPS +(\d+)", open(log).read())[-1]) for log in logs]
                slowdown = f"{2 * sps[0] / sum(sps[1:]):.2f}x"
                print(row(path, threads, f"{sps[0]:,}", f"{sps[1]:,} / {sps[2]:,}", slowdown))


@dataclasses.dataclass
class Acting(Mode):
    """mat_mpe.py's acting time per step for 32 envs of spread, its KV cache against the official code's full
    re-decode at each agent's turn, N = 3, 6, 12."""

    timing_seconds: float = 3.0  # each case is timed for this long

    def __call__(self):
        m = script_module("mat")
        torch.set_num_threads(1)  # steadier than two on a 2-core machine, and no slower at this size
        print(
            header("agents", "KV cache (ms per step)", "full re-decode, as the official code (ms per step)", "speed-up")
        )
        for n_agents in (3, 6, 12):
            cached, full = acting_times(m, n_agents, self.seconds(self.timing_seconds))
            print(row(n_agents, f"{cached:.2f}", f"{full:.2f}", f"{full / cached:.2f}x"))


def acting_times(m, n_agents: int, seconds: float) -> tuple[float, float]:
    """Milliseconds per acting step of 32 envs with `n_agents`: MAT's KV cache, and the official code's full re-decode
    of the whole sequence at each agent's turn."""
    spec = m.get_env_spec("simple_spread_v3", m.scenario_kwargs(m.Args(n_agents=n_agents)))
    model = m.MultiAgentTransformer(spec, m.Args(n_agents=n_agents))
    obs, alive = torch.randn(32, n_agents, spec.obs_dim), torch.ones(32, n_agents, dtype=torch.bool)
    avail = torch.as_tensor(spec.avail_actions).expand(32, -1, -1)  # every action available

    def full_re_decode(obs_rep):
        shifted = model.start_token.repeat(32, n_agents, 1)
        for i in range(n_agents):
            action = m.action_distribution(model.decode(shifted, obs_rep)[:, i], avail[..., i, :], None).sample()
            if i + 1 < n_agents:
                shifted[:, i + 1] = model.action_tokens(action, alive[:, i])

    encode = lambda: model.encode(model.agent_inputs(obs))[0]
    with torch.no_grad():
        cached = timed(lambda: model.decode_autoregressive(encode(), avail, alive, False), seconds)
        return cached, timed(lambda: full_re_decode(encode()), seconds)


@dataclasses.dataclass
class Critic(Mode):
    """mat_mpe_ep_critic.py's critic, forward and backward per update (10 epochs over a 25 x 32 rollout): once per
    env with one head per agent, against the official layout of one pass per agent on its copy of the state."""

    timing_seconds: float = 3.0  # each case is timed for this long

    def __call__(self):
        m = script_module("mat_ep")
        torch.set_num_threads(1)  # as acting; the update's second thread would add noise to a 2-core measurement
        columns = "once per env, one head per agent (ms)", "replicated per agent, one head (ms)", "ratio"
        print(header("agents", "state dim", *columns))
        for n_agents in (3, 12):
            args = m.Args(n_agents=n_agents)
            spec = m.get_env_spec("simple_spread_v3", m.scenario_kwargs(args))
            width = spec.state_dim + n_agents * args.n_embd  # the state and the encoder's representations
            state = torch.randn(25 * 32, width)
            times = []
            once = m.mlp_net(width, n_agents, 1.0, args)  # the script's critic
            per_agent = m.mlp_net(width, 1, 1.0, args)  # the official layout: every agent's copy of the state
            for critic, x in ((once, state), (per_agent, state.repeat_interleave(n_agents, dim=0))):

                def update(critic=critic, x=x):
                    for _ in range(10):
                        critic.zero_grad()
                        critic(x).sum().backward()

                times.append(timed(update, self.seconds(self.timing_seconds)))
            print(f"| {n_agents} | {spec.state_dim} | {times[0]:.1f} | {times[1]:.1f} | {times[1] / times[0]:.2f}x |")


@dataclasses.dataclass
class UpdateGraph(Mode):
    """Milliseconds per PPO update (10 passes over a 25-step rollout of random data, the device synchronized,
    the median of updates 4 to 8) four ways: eager; the networks compiled with reduce-overhead, as before issue 85;
    each minibatch step a CUDA graph of eager kernels; a CUDA graph of the compiled networks, as the scripts run on a
    GPU. On a CPU the eager way (one torch thread) and its floor: the same update's matrix products alone."""

    threads: int = 32
    """--n-rollout-threads of the rollout"""

    def __call__(self):
        m, cuda = script_module(self.script), torch.cuda.is_available()
        ways = ["eager", "compiled", "graph of eager kernels", "graph of compiled networks"][: 4 if cuda else 1]
        if not cuda:
            torch.set_num_threads(1)  # as the scripts train on the 2-core CPU
        times = [update_ms(m, self.threads, way) for way in ways]
        if not cuda:
            times += [matmul_floor_ms(m, self.threads)]
            ways, times = [*ways, "matmul floor", "eager / floor"], [*times, times[0] / times[1]]
        print(header("script", "envs", *ways))
        print(row(f"`{SCRIPTS[self.script]}.py`", self.threads, *(f"{ms:.1f}" for ms in times)))


def update_inputs(m, n_envs: int, device: torch.device) -> tuple:
    """A script's agent, optimizer and value norm, and a rollout of random data, for its `ppo_update`."""
    args = m.Args(n_rollout_threads=n_envs, ppo_epoch=10)  # the official 10 passes, as docs/speed.md measured
    spec = m.get_env_spec(args.env_id, m.scenario_kwargs(args))
    torch.manual_seed(0)
    agent, value_norm, optimizer = m.build_agent(spec, args, device)
    buffer = m.RolloutBuffer(25, n_envs, spec, device)
    for name in ("obs", "state", "values", "logprobs"):
        getattr(buffer, name, torch.empty(0)).normal_()
    buffer.actions.random_(0, spec.action_dim)
    advantages, returns = torch.randn(2, 25, n_envs, len(spec.agents), device=device)
    return agent, optimizer, value_norm, buffer, advantages, returns, args


def update_ms(m, n_envs: int, way: str) -> float:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    agent, *inputs = update_inputs(m, n_envs, device)
    if way.endswith("compiled networks"):
        m.compile_for_device(agent, None, device)
    for name in ("get_dist", "evaluate_actions", "get_value") if way == "compiled" else ():
        if hasattr(agent, name):
            setattr(agent, name, torch.compile(getattr(agent, name), mode="reduce-overhead"))
    step = m.GraphedStep() if way.startswith("graph") else m.ppo_step
    times = []
    for _ in range(8):
        torch.cuda.synchronize() if device.type == "cuda" else None
        start = time.perf_counter()
        m.ppo_update(agent, *inputs, step)  # waits for its stats
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times[3:])


def matmul_floor_ms(m, n_envs: int) -> float:
    """A CPU update's matrix products alone, in a tight loop: of every linear layer call of one update, the forward
    product, the weight's gradient and, where autograd needs it, the input's, at their shapes (median of 5)."""
    agent, *inputs = update_inputs(m, n_envs, torch.device("cpu"))
    products = []

    def record(layer, layer_inputs, _):
        x = layer_inputs[0].detach().flatten(0, -2)  # (rows, in_features)
        w, dy = layer.weight.detach(), torch.randn(len(x), layer.out_features)  # (out, in), (rows, out)
        products.extend([(x, w.t()), (dy.t(), x)] + [(dy, w)] * layer_inputs[0].requires_grad)

    hooks = [layer.register_forward_hook(record) for layer in agent.modules() if isinstance(layer, torch.nn.Linear)]
    m.ppo_update(agent, *inputs, m.ppo_step)
    for hook in hooks:
        hook.remove()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for a, b in products:
            torch.mm(a, b)
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


MODES = {"grid": Grid, "learn": Learn, "panel": Panel, "scaling": Scaling, "sweep": Sweep, "resume": Resume}
MODES |= {"official-task": OfficialTask, "speed": Speed, "env-rate": EnvRate, "devices": Devices}
MODES |= {
    "threads": Threads,
    "acting": Acting,
    "critic": Critic,
    "random-envs": RandomEnvs,
    "update-graph": UpdateGraph,
}


def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["absolute"]:  # run folders, as many as given
        for run_dir in argv[1:]:
            absolute_metric(run_dir)
        return
    mode = tyro.extras.subcommand_cli_from_dict(MODES, args=argv)
    for name, value in vars(mode).items():  # counts, which tyro takes as any integer
        least = 0 if name in ("seed", "seeds") else 1
        if type(value) is int and value < least:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be at least {least}, not {value}")
    mode()


if __name__ == "__main__":
    main()
