"""The scripts copy each other's shared code by design: each one is self-contained. This test keeps the copies
equal: every top-level function and class that two or more scripts define under the same name has the same
source in each, except where a script is listed in VARIANTS as having its own version. So a fix made in one
copy and not in the others fails here."""

import ast
import dataclasses
import importlib.util
import inspect
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from conftest import TINY  # noqa: E402

import benchmark  # noqa: E402

CAPTURE = dict(capture_output=True, text=True, timeout=300, env={**os.environ, "SDL_VIDEODRIVER": "dummy"})
SCRIPTS = ["mappo_mpe", "mappo_mpe_rnn", "mat_mpe", "mat_mpe_ep_critic"]
ALL = frozenset(SCRIPTS)

# name -> the scripts whose copy is meant to differ from the others' (which must still agree among themselves)
VARIANTS = {
    "Hyperparameters": ALL,  # each algorithm's own settings and defaults
    "Args": ALL,  # and its own run-control flags (no --compile for the GRUs; a wandb project per algorithm)
    "check_args": ALL,  # each algorithm's own impossible settings
    "memory_estimate": ALL,  # each network's own activations per agent-step
    "ppo_update": ALL,  # what each algorithm keeps of a rollout
    "ppo_step": ALL,  # how each algorithm scores a minibatch
    "main": {"mappo_mpe_rnn", "mat_mpe", "mat_mpe_ep_critic"},  # GRU hidden states; MAT acts on the alive mask
    "RolloutBuffer": {"mappo_mpe_rnn", "mat_mpe", "mat_mpe_ep_critic"},  # GRU states; MAT's state-less; decoding orders
    "Agent": {"mappo_mpe_rnn"},  # GRU actors and critic
    "evaluate": {"mappo_mpe_rnn", "mat_mpe", "mat_mpe_ep_critic"},  # GRU hidden states; MAT masks the dead
    "training_state": {"mappo_mpe_rnn"},  # keeps the GRUs' hidden states for the next rollout
    "resume_training": {"mappo_mpe_rnn"},  # and puts them back
    "TrainingRun": {"mappo_mpe_rnn"},  # the GRUs have no --compile
    "compile_for_device": {"mat_mpe", "mat_mpe_ep_critic"},  # the transformer's entry points
    "MultiAgentTransformer": {"mat_mpe_ep_critic"},  # the critic on the state replaces the encoder's value head
    "build_agent": {"mat_mpe", "mat_mpe_ep_critic"},  # the transformer (the GRUs' Agent is built as the MLPs')
}


def top_level_sources(module) -> dict[str, str]:
    """Source of every function and class the module itself defines at its top level."""
    return {
        name: inspect.getsource(obj)
        for name, obj in vars(module).items()
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == module.__name__
    }


SOURCES = {
    name: top_level_sources(importlib.import_module(name))
    for name in SCRIPTS
    if os.path.exists(os.path.join(ROOT, f"{name}.py"))
}
SHARED = sorted({n for s in SOURCES.values() for n in s if sum(n in s for s in SOURCES.values()) >= 2})


def test_the_scripts_share_their_plumbing():
    """Guards the test itself: with at least two scripts, the shared names include the whole env section."""
    assert len(SOURCES) >= 2
    assert {"make_env", "evaluate", "BatchedMPE", "compute_gae", "ValueNorm", "load_checkpoint"} <= set(SHARED)


@pytest.mark.parametrize("name", SHARED)
def test_shared_code_is_identical(name):
    copies = {script: sources[name] for script, sources in SOURCES.items() if name in sources}
    own = VARIANTS.get(name, frozenset())
    common = {script: source for script, source in copies.items() if script not in own}
    first = next(iter(common.values()), None)
    differing = [script for script, source in common.items() if source != first]
    assert not differing, f"{name} differs between {sorted(common)}: fix every copy, or list a variant in VARIANTS"
    if first is not None and own != ALL:  # a listed variant that no longer differs is taken off the list
        stale = [script for script in own & copies.keys() if copies[script] == first]
        assert not stale, f"{name} in {stale} is the same as in the other scripts: remove it from VARIANTS"


@pytest.mark.parametrize("script", SCRIPTS)
def test_capture_video_without_imageio_ffmpeg_is_one_error_line(script, monkeypatch):
    """Without imageio-ffmpeg, imageio cannot write mp4: the run stops before it starts, not at the first video."""
    module = importlib.import_module(script)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "imageio_ffmpeg" else find_spec(name, *a)
    )
    with pytest.raises(SystemExit, match="^error: --capture-video needs imageio-ffmpeg"):
        module.check_args(module.Args(capture_video=True))
    module.check_args(module.Args())


@pytest.mark.parametrize(
    "script, entry_points",
    [
        ("mappo_mpe", ["act", "get_dist", "get_value"]),
        ("mat_mpe", ["act", "evaluate_actions", "get_value"]),
        ("mat_mpe_ep_critic", ["act", "evaluate_actions", "get_value"]),
    ],
)
def test_compile_traces_every_entry_point_and_the_env_step_whole(script, entry_points, tmp_path, monkeypatch, capsys):
    """On a GPU (`--compile`, the default there) the network entry points of the training loop go to torch.compile,
    acting with CUDA graphs, which need one whole graph a call, the update's inside the CUDA graph of each minibatch
    step, which needs them free of host syncs, and the batched env's `advance` to Inductor's fusion. Here
    each is traced by Dynamo in full (`fullgraph`) through a training iteration and run by its eager backend. A CPU
    compiles acting and `advance` only, and nothing without --compile."""
    module, torch_compile, compiled = importlib.import_module(script), torch.compile, []

    def compile_whole_and_run_eagerly(function, mode=None):
        compiled.append((function.__name__, mode))
        return torch_compile(function, backend="eager", fullgraph=True)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch, "compile", compile_whole_and_run_eagerly)
    flags = ["--total-timesteps", "100", "--n-rollout-threads", "4", "--n-eval-episodes", "2", "--ppo-epoch", "2"]
    args = module.parse_args(flags)
    try:
        assert module.main(args)["global_step"] == 100 and compiled == []  # a CPU: eager unless told
        monkeypatch.setattr(module, "compiles", lambda device: True)
        args = dataclasses.replace(args, compile=True)
        assert module.main(args)["global_step"] == 100 and compiled == [("advance", None), ("act", "default")]
        assert "step       100/100 | SPS" in capsys.readouterr().out  # one iteration: no compile line in its place
        compiled.clear()
        on_cpu = module.compile_for_device
        monkeypatch.setattr(
            module, "compile_for_device", lambda agent, envs, _: on_cpu(agent, envs, torch.device("cuda"))
        )
        assert module.main(args)["global_step"] == 100  # compiled as on a GPU, the update not graphed here
    finally:
        torch._dynamo.reset()
    modes = [(name, "reduce-overhead" if name == "act" else "default") for name in entry_points]  # in GraphedStep
    assert compiled == [("advance", None)] + modes


@pytest.mark.parametrize("script", ["mappo_mpe", "mat_mpe", "mat_mpe_ep_critic"])
def test_a_cpu_runs_eager_at_any_length_unless_given_compile(script, monkeypatch):
    """So a run is a prefix of a longer one with its seed, and a first run never meets the compiler; --cuda compiles
    by default where there is a GPU (else the run goes on the CPU). TrainingRun compiles where `args.compile`."""
    module = importlib.import_module(script)
    for gpu in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda gpu=gpu: gpu)
        for flags in ([], ["--total-timesteps", "4000000"], ["--cuda", "--total-timesteps", "4000000"]):
            assert module.parse_args(flags).compile == ("--cuda" in flags and gpu)
        assert module.parse_args(["--compile"]).compile and not module.parse_args(["--cuda", "--no-compile"]).compile


def test_a_compile_that_cannot_build_is_one_warning_line_and_the_run_goes_on_eager(capsys):
    """A C++ compiler that answers but cannot build (here /bin/true; Apple's clang without OpenMP, a temporary folder
    that cannot run what it holds): its trial kernel fails, one line says so, and the run is eager. `compiles` is the
    same in the three scripts that compile."""
    module, cpu = importlib.import_module("mat_mpe"), torch.device("cpu")
    torch._dynamo.reset()  # the trial compiles anew
    try:
        with importlib.import_module("torch._inductor.config").patch({"cpp.cxx": (None, "/bin/true")}):
            assert not module.compiles(cpu)
        (line,) = capsys.readouterr().out.splitlines()
        assert line.startswith("warning: --compile: torch.compile cannot build here (") and line.endswith(
            "running eager"
        )
        torch._dynamo.reset()
        assert module.compiles(cpu) and capsys.readouterr().out == ""
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("script", ["mappo_mpe", "mat_mpe", "mat_mpe_ep_critic"])
def test_a_compiled_runs_sps_and_eta_leave_the_compile_out(script, tmp_path, monkeypatch, capsys):
    """The compile (here 3 s of sleep in the first call of `act`) is said once, "compiled in 3 s", in place of the
    first iteration's progress line and SPS; the next iteration gives the first, timed from the compile's end."""
    module = importlib.import_module(script)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(module, "compiles", lambda device: True)

    def compile_for_device(agent, envs, device):
        act = agent.act

        def first_act(*args, **kwargs):
            time.sleep(3)
            agent.act = act
            return act(*args, **kwargs)

        agent.act = first_act

    monkeypatch.setattr(module, "compile_for_device", compile_for_device)
    summary = module.main(module.parse_args([*TINY, "--total-timesteps", "300", "--compile"]))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    assert lines[0] == "step       100 | compiled in 3 s (once a run)" and len(lines) == 3
    sps = int(lines[1].split("SPS")[1].split()[0])  # 100 steps in under a second: not the 200 in 3 s
    assert lines[1].startswith("step       200/300 |") and sps > 100, lines[1]
    events = EventAccumulator(os.path.join("runs", summary["run_name"])).Reload()
    assert [event.step for event in events.Scalars("charts/SPS")] == [200, 300]


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_env_written_as_the_pettingzoo_tutorial_trains_on_the_first_try(script, tmp_path):
    """tests/tutorial_env.py (a ParallelEnv class and no `parallel_env`, no `render_mode`, MultiDiscrete observations,
    no state) named as `module:Class`, with no other flag: the run says that its critic takes the observations joined
    and which discount it took and why (30-step episodes: 0.9), trains to its end and saves that discount; the run
    folder names the env with a dot, as a path can."""
    flags = ["--env-id", "tests.tutorial_env:MeetEnv", "--total-timesteps", "240", "--n-rollout-threads", "4"]
    flags += ["--episode-length", "30", "--n-eval-episodes", "2", "--ppo-epoch", "1"]
    run = subprocess.run([sys.executable, os.path.join(ROOT, f"{script}.py"), *flags], cwd=tmp_path, **CAPTURE)
    assert run.returncode == 0 and run.stderr == "", run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0] == (
        "warning: --env-id tests.tutorial_env:MeetEnv: it has no Box state_space of at most 4096 numbers; the critic "
        "takes the observations joined"
    )
    assert lines[1].startswith("training on cpu") and lines[2] == "gamma 0.9, from the env's time limit: 30 steps"
    (run_name,) = os.listdir(tmp_path / "runs")
    assert run_name.startswith(f"tests.tutorial_env.MeetEnv__{script}__1__") and lines[-1].startswith("run in runs/")
    checkpoint = torch.load(tmp_path / "runs" / run_name / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 240 and checkpoint["args"]["gamma"] == 0.9


@pytest.mark.parametrize("script", SCRIPTS)
def test_what_is_not_a_parallel_env_is_one_error_line_and_a_class_with_its_methods_trains(script, capsys):
    """An AEC env (multiwalker's `env`) and a gymnasium single-agent env are one line naming what was made and what is
    needed; a class with a parallel env's methods that does not subclass ParallelEnv (no `unwrapped`) is read and
    stepped as the env it is. `module:name` reaches a submodule too, as `module.name` does."""
    module = importlib.import_module(script)
    for env_id, found in [
        ("pettingzoo.sisl.multiwalker_v9:env", "made an AEC env"),
        ("gymnasium.envs.classic_control.cartpole:CartPoleEnv", "made CartPoleEnv, without possible_agents"),
    ]:
        with pytest.raises(SystemExit) as refused:
            module.make_env(env_id, {})
        assert str(refused.value) == (
            f"error: --env-id {env_id}: {found}; the scripts take a PettingZoo parallel env: a module's parallel_env, "
            "or pettingzoo.utils.aec_to_parallel(env)"
        )
    spec = module.get_env_spec("tests.tutorial_env:PlainMeetEnv", {})
    assert (spec.agents, spec.episode_limit, spec.has_state) == (["blue", "red"], 30, False)
    envs = module.PettingZooVecEnv(spec, 2, 0, torch.device("cpu"))
    envs.reset()
    assert envs.step(torch.zeros(2, 2, dtype=torch.long)).rewards.shape == (2, 2)
    assert module.import_path("mpe2:simple_spread_v3") is importlib.import_module("mpe2.simple_spread_v3")


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_state_that_fails_with_every_agent_playing_is_a_fault_and_its_size_is_checked(script, monkeypatch, capsys):
    """state() raising at the first reset (every agent in the episode) is a fault of the env, one error line, as its
    README says, not a fallback; a state of another size than its state_space is one too, at the probe or in training;
    a state_space of more numbers than the networks take is not used, and the warning says what the critic takes
    instead: here, where the observations joined do not fit either, each agent's own (no state)."""
    module = importlib.import_module(script)
    with pytest.raises(module.EnvError, match=r"^--env-id tests.faulty_env: its state\(\) raised RuntimeError\('state"):
        module.get_env_spec("tests.faulty_env", {"fail": "state"})
    with pytest.raises(
        module.EnvError, match=r"^--env-id tests.faulty_env: its state\(\) has 5 numbers, its state_space 4$"
    ):
        module.get_env_spec("tests.faulty_env", {"fail": "wide_state"})
    spec = module.get_env_spec("tests.faulty_env", {})
    with pytest.raises(module.EnvError, match=r"its state\(\) has 4 numbers, its state_space 3$"):
        module.PettingZooEnv(spec._replace(state_dim=3)).reset()
    monkeypatch.setattr(module, "MAX_INPUTS", 3)  # a state_space of 4 numbers, two observations of 2 each
    spec = module.get_env_spec("tests.faulty_env", {})
    assert not spec.has_state and spec.state_dim == 0
    assert capsys.readouterr().out == (
        "warning: --env-id tests.faulty_env: it has no Box state_space of at most 3 numbers; the critic takes each "
        "agent's observation (4 joined)\n"
    )


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("max_cycles", [5, 450])
def test_a_state_that_cannot_answer_after_the_last_step_bootstraps_from_the_one_before(script, max_cycles):
    """faulty_env's "joined_state" (the observations of the agents still playing, none after the last step) keeps its
    state whatever the episode's length (beyond the probe's 400 steps too): a truncated episode's last state is then
    the one before the last step, and training goes on."""
    module = importlib.import_module(script)
    spec = module.get_env_spec("tests.faulty_env", {"fail": "joined_state", "max_cycles": max_cycles})
    assert spec.has_state and spec.episode_limit == max_cycles
    env = module.PettingZooEnv(spec)
    _, info = env.reset(seed=0)
    for _ in range(max_cycles):
        before = info["state"]
        _, _, _, _, info = env.step(np.zeros(2, dtype=np.int64))
    assert info["truncated"].all() and np.array_equal(info["last_state"], before)
    np.testing.assert_array_equal(info["state"], [0, 0, 1, 0])  # the next episode's first state


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_probe_reads_the_limit_the_env_keeps_and_plays_the_same_every_time(script):
    """tests/dying_env.py keeps its 40-step limit as `limit`, and its agents die at random (numpy's global generator)
    before it: the probe reads 40, not "none met"; it seeds the global generators, so that it plays the same way
    whatever their state (after it, what they draw is the same too); a discrete action is numbered from its space's
    `start`."""
    module = importlib.import_module(script)
    drawn = []
    for seed in (1, 2):
        np.random.seed(seed)
        spec = module.get_env_spec("tests.dying_env", {"death_chance": 0.3, "max_cycles": 40})
        drawn.append((spec.episode_limit, np.random.random(), random.random()))
    assert drawn[0] == drawn[1] and drawn[0][0] == 40
    spec = module.get_env_spec("tests.dying_env", {"action_start": -1})
    env = module.PettingZooEnv(spec)
    assert [env.env_action("agent_2", np.int64(a)) for a in range(4)] == [-1, 0, 1, 2]
    env.reset(seed=0)
    env.step(np.array([1, 2, 3]))  # the env asserts that each action is in its space


@pytest.mark.parametrize("script", SCRIPTS)
def test_threads_follow_the_cores_this_process_may_use(script, monkeypatch):
    """Half the cores this process may run on (its affinity, not the host's count); where the OS tells neither, one."""
    module = importlib.import_module(script)

    class Started(Exception):
        pass

    def started(*_):
        raise Started(torch.get_num_threads())

    monkeypatch.setattr(module, "get_env_spec", started)
    threads = torch.get_num_threads()
    try:
        monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1, 2, 3}, raising=False)
        monkeypatch.setattr(os, "cpu_count", lambda: 64)
        with pytest.raises(Started, match="^2$"):
            module.main(module.Args())
        monkeypatch.delattr(os, "sched_getaffinity", raising=False)
        monkeypatch.setattr(os, "cpu_count", lambda: None)
        with pytest.raises(Started, match="^1$"):
            module.main(module.Args())
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("mode,optimum", [("costly", -10.0), ("helpful", 17.5)])
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_team_optimum_that_needs_the_credit_after_a_death_is_learned(script, mode, optimum, tmp_path, monkeypatch):
    """tests/leave_env.py: agent 0 may leave the episode, which costs the team (its optimum -10 per agent: stay) or
    pays it at a cost to the one who leaves (17.5: leave at once). With the team's reward an agent's credit runs on
    after it left, so each script's greedy policy is the team's optimum after 3,000 env steps; one whose credit
    ended at its death leaves in the first (-23.5) and stays in the second (10)."""
    module = importlib.import_module(script)
    monkeypatch.chdir(tmp_path)
    flags = ["--env-id", "tests.leave_env", "--env-kwargs", "mode", mode, "--total-timesteps", "3000"]
    flags += ["--n-rollout-threads", "8", "--eval-interval", "3000", "--n-eval-episodes", "4"]
    assert module.main(module.parse_args(flags))["best_eval"] == pytest.approx(optimum)


RANDOM_ENV_CASES = {  # tests/random_env.py's keyword arguments: the script, the text of its one error line ("": none)
    "unbounded Box actions": ("mappo_mpe", "action box_unbounded", "unsupported actions"),
    "an infinite last observation": (
        "mappo_mpe_rnn",
        "fault inf_obs_dying fault_at 10 death_chance 0.1 n_agents 3",
        "its step() returned a NaN or infinity",
    ),
    "an infinite state": ("mat_mpe", "state infinite fault_at 30", "its state() returned a NaN or infinity"),
    "a wider observation within the padding": (
        "mat_mpe_ep_critic",
        "obs sizes n_agents 3 wide_obs True",
        "an observation of agent_0 does not fit its Box(-1.0, 1.0, (2,), float32)",
    ),
    "a NaN MultiBinary observation": (
        "mappo_mpe",
        "obs multibinary fault nan_obs fault_at 5",
        "does not fit its MultiBinary(3)",
    ),
    "deaths the probe did not see": (
        "mappo_mpe_rnn",
        "state left death_chance 0.5 deaths_from 400",
        "once an agent left, unseen at start: make state() answer then",
    ),
    "masks in step() infos only": ("mat_mpe", "masks info masks_at_reset False", ""),
}


@pytest.mark.parametrize("case", RANDOM_ENV_CASES)
def test_what_the_random_env_check_found_is_one_error_line_or_a_clean_run(case, tmp_path):
    """Found by the random-env check (tests/random_env.py; `benchmark.py random-envs`): each of these printed numpy
    warnings before its error line, named another call, trained on without a word, or (masks in step()'s infos only)
    sent forbidden actions; now each is one `error:` line naming the fault, or a clean run that obeys the masks (the
    env raises on a forbidden action) and says where it found them. The deaths come after the start-up probe's 400
    steps, and the run's one env plays 600."""
    script, kwargs, message = RANDOM_ENV_CASES[case]
    flags = ["--env-id", "tests.random_env:RandomEnv", "--env-kwargs", *kwargs.split(), "--n-rollout-threads", "1"]
    flags += ["--total-timesteps", "600", "--n-eval-episodes", "2", "--eval-interval", "300", "--ppo-epoch", "1"]
    run = subprocess.run([sys.executable, os.path.join(ROOT, f"{script}.py"), *flags], cwd=tmp_path, **CAPTURE)
    if message:
        assert run.returncode == 1 and run.stderr.startswith("error:") and message in run.stderr, run.stderr[-2000:]
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr[-2000:]
    else:
        assert run.returncode == 0 and run.stderr == "", run.stderr[-2000:]
        assert "action masks in its step() infos only: all actions allowed at a reset" in run.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_without_a_state_that_fits_the_critic_takes_each_agents_own_observation(script, tmp_path):
    """Three agents of 1,500 numbers each and no state: the observations joined (4,500) would exceed the 4,096 inputs
    the networks take, so the spec has none (one warning line) and every critic takes each agent's own observation
    (and id): a run with deaths trains to its end, and no layer has more inputs than one agent's (1,500 + 3)."""
    kwargs = "obs long n_agents 3 death_chance 0.05 limit 20"
    flags = ["--env-id", "tests.random_env:RandomEnv", "--env-kwargs", *kwargs.split(), "--n-rollout-threads", "2"]
    flags += ["--total-timesteps", "200", "--episode-length", "20", "--n-eval-episodes", "2", "--ppo-epoch", "1"]
    run = subprocess.run([sys.executable, os.path.join(ROOT, f"{script}.py"), *flags], cwd=tmp_path, **CAPTURE)
    assert run.returncode == 0 and run.stderr == "", run.stderr[-2000:]
    warning = "no Box state_space of at most 4096 numbers; the critic takes each agent's observation (4,500 joined)"
    assert warning in run.stdout.splitlines()[0]
    (checkpoint,) = tmp_path.glob("runs/*/checkpoint.pt")
    weights = torch.load(checkpoint, weights_only=True)["agent"]
    assert max(w.shape[-1] for w in weights.values() if w.dim() == 2) == 1503
    critic = [w for name, w in weights.items() if name.startswith("critic") and w.dim() == 2]
    width = 64 if script == "mat_mpe_ep_critic" else 1503  # the state critic reads each agent's representation
    assert not critic or critic[0].shape[-1] == width  # the MLP critics' first layer (MAT's is its encoder)


def test_the_wrapper_of_envs_md_trains_on_level_based_foraging(tmp_path):
    """The wrapper docs/envs.md gives for EPyMARL's gymnasium envs, copied from that page as a user would, trains
    `mappo_mpe.py` (the env plumbing is the same in every script) on Foraging-8x8-2p-2f-coop-v3 with LBF's valid
    actions as masks: the time limit read (50 steps: gamma 0.92), a clean run to its end."""
    (tmp_path / "epymarl_env.py").write_text(benchmark.envs_md_wrapper())
    flags = ["--env-id", "epymarl_env", "--env-kwargs", "key", "Foraging-8x8-2p-2f-coop-v3", "masks", "True"]
    flags += ["--total-timesteps", "200", "--n-rollout-threads", "2", "--n-eval-episodes", "2", "--ppo-epoch", "1"]
    env = CAPTURE["env"] | {"PYTHONPATH": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, os.path.join(ROOT, "mappo_mpe.py"), *flags], cwd=tmp_path, **CAPTURE | {"env": env}
    )
    assert run.returncode == 0 and run.stderr == "", run.stderr[-3000:]
    assert "gamma 0.92, from the env's time limit: 50 steps" in run.stdout and "run in runs/epymarl_env__" in run.stdout


ALGORITHM_LOSSES = ["ValueNorm", "RolloutBuffer", "compute_gae", "masked_mean", "policy_loss_fn", "value_loss_fn"]
ALGORITHM_END = ALGORITHM_LOSSES + ["minibatch_indices", "ppo_step", "ppo_update", "build_agent", "main"]
SETTINGS = ["Hyperparameters", "MPE_SCENARIOS", "PRESETS", "CONTINUOUS_PRESETS", "layer_init"]
POLICIES = ["Gaussian", "action_distribution"]
TRANSFORMER = ["feed_forward", "head", "Attention", "EncodeBlock", "DecodeBlock", *POLICIES]
ABOVE_THE_BANNER = {  # in order: the settings, the networks, value normalization, buffer and GAE, the update, main
    "mappo_mpe": [*SETTINGS, "mlp", "mlp_net", *POLICIES, "Agent", *ALGORITHM_END],
    "mappo_mpe_rnn": [*SETTINGS, "mlp", "gru_over_sequence", "RecurrentNet", *POLICIES, "Agent", *ALGORITHM_END],
    "mat_mpe": [*SETTINGS, *TRANSFORMER, "MultiAgentTransformer", *ALGORITHM_END],
    "mat_mpe_ep_critic": [*SETTINGS, "mlp", "mlp_net", *TRANSFORMER, "MultiAgentTransformer", *ALGORITHM_END],
}


@pytest.mark.parametrize("script", SCRIPTS)
def test_above_the_banner_only_the_algorithm(script):
    """What a script defines above its banner is the algorithm's, in the order a reader needs it, so that a new
    feature of the run's machinery lands below it; and `main` reaches that machinery through two names only, the
    training run and test mode."""
    source = open(os.path.join(ROOT, f"{script}.py")).read()
    above, banner, below = source.partition("\n# " + "=" * 30 + " Below:")
    below = below.split("\n", 1)[1]
    top_level = lambda tree: [
        name
        for node in tree.body
        for name in (
            [node.name]
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            else [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        )
    ]
    assert top_level(ast.parse(above)) == ABOVE_THE_BANNER[script]
    main = next(n for n in ast.parse(above).body if getattr(n, "name", "") == "main")
    used = {n.id for statement in main.body for n in ast.walk(statement) if isinstance(n, ast.Name)}
    assert used & set(top_level(ast.parse(below))) == {"TrainingRun", "run_evaluation_only"}


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_update_moves_value_norm_once_per_minibatch_and_epoch(script, tmp_path, monkeypatch):
    """One iteration of 3 epochs of 2 minibatches: ValueNorm's debiasing term (1 - beta^k after k updates of the
    official schedule, whatever the returns) is that of 6 updates, as the official codes make them."""
    module = importlib.import_module(script)
    monkeypatch.chdir(tmp_path)
    flags = ["--total-timesteps", "100", "--n-rollout-threads", "4", "--n-eval-episodes", "1", "--ppo-epoch", "3"]
    run_name = module.main(module.parse_args([*flags, "--num-mini-batch", "2"]))["run_name"]
    checkpoint = torch.load(tmp_path / "runs" / run_name / "checkpoint.pt", weights_only=True)
    beta = module.ValueNorm().beta
    assert checkpoint["value_norm"]["debiasing_term"].item() == pytest.approx(1 - beta**6, rel=1e-5)


@pytest.mark.parametrize("script", ["mat_mpe", "mat_mpe_ep_critic"])
@pytest.mark.parametrize(
    "flags,passes", [(["--ppo-epoch", "0", "--gamma", "0.9"], 3), (["--gamma", "0.9"], 10), (["--ppo-epoch", "2"], 2)]
)
def test_mat_chooses_its_passes_by_the_discount_unless_given(script, flags, passes, tmp_path, monkeypatch):
    """MAT's default --ppo-epoch 0: 3 passes over each rollout below a discount of 0.99, 10 at 0.99; the official
    preset's 10 whatever the discount; a count given is kept. Read from ValueNorm's debiasing term after one
    iteration (1 - beta^passes)."""
    module = importlib.import_module(script)
    monkeypatch.chdir(tmp_path)
    assert module.Args().ppo_epoch == 0
    argv = ["--preset", "official", "--total-timesteps", "100", "--n-rollout-threads", "4", "--n-eval-episodes", "1"]
    run_name = module.main(module.parse_args([*argv, *flags]))["run_name"]
    checkpoint = torch.load(tmp_path / "runs" / run_name / "checkpoint.pt", weights_only=True)
    beta = module.ValueNorm().beta
    assert checkpoint["value_norm"]["debiasing_term"].item() == pytest.approx(1 - beta**passes, rel=1e-5)


RUN_CONTROL = (
    "exp_name cuda n_training_threads compile track wandb_project_name wandb_entity capture_video save_model "
    "eval_checkpoint eval_n_agents resume checkpoint_interval eval_interval n_eval_episodes eval_sample eval_max_steps "
    "log_interval"
)


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("decay", [False, True])
def test_a_resume_may_change_the_run_control_flags_and_no_other(script, decay):
    """Each flag in turn saved with another value: a resume refuses every one but those that control the run, and
    --total-timesteps too unless --linear-lr-decay sets its schedule by it."""
    module = importlib.import_module(script)
    args = module.Args(linear_lr_decay=decay, resume="checkpoint.pt")
    allowed = {name for name in RUN_CONTROL.split() if hasattr(args, name)} | (set() if decay else {"total_timesteps"})
    refused = set()
    for name in vars(args):
        saved = {"args": vars(args) | {name: "other"}, "global_step": 0, "env": {}}
        saved["progress"] = {"eval_step": 0, "global_step": 0}
        try:
            module.check_resume(args, saved)
        except SystemExit as refusal:
            assert f"--{name.replace('_', '-')} ('other' there" in str(refusal)
            refused.add(name)
    assert refused == vars(args).keys() - allowed
