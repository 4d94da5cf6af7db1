"""The scripts copy each other's shared code by design: each one is self-contained. This test keeps the copies
equal: every top-level function and class that two or more scripts define under the same name has the same
source in each, except where a script is listed in VARIANTS as having its own version. So a fix made in one
copy and not in the others fails here."""

import importlib.util
import inspect
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CAPTURE = dict(capture_output=True, text=True, timeout=300, env={**os.environ, "SDL_VIDEODRIVER": "dummy"})
SCRIPTS = ["mappo_mpe", "mappo_mpe_rnn", "mat_mpe", "mat_mpe_ep_critic"]
ALL = frozenset(SCRIPTS)

# name -> the scripts whose copy is meant to differ from the others' (which must still agree among themselves)
VARIANTS = {
    "Args": ALL,  # each script's own flags and defaults
    "check_args": ALL,  # each algorithm's own impossible settings
    "memory_estimate": ALL,  # each network's own activations per agent-step
    "ppo_update": ALL,  # how each algorithm scores a minibatch
    "main": {"mappo_mpe_rnn", "mat_mpe", "mat_mpe_ep_critic"},  # GRU hidden states; MAT acts on the alive mask
    "RolloutBuffer": {"mappo_mpe_rnn", "mat_mpe"},  # GRU hidden states and episode starts; MAT stores no state
    "Agent": {"mappo_mpe_rnn"},  # GRU actors and critic
    "evaluate": {"mappo_mpe_rnn", "mat_mpe", "mat_mpe_ep_critic"},  # GRU hidden states; MAT masks the dead
    "training_state": {"mappo_mpe_rnn"},  # keeps the GRUs' hidden states for the next rollout
    "resume_training": {"mappo_mpe_rnn"},  # and puts them back
    "MultiAgentTransformer": {"mat_mpe_ep_critic"},  # the critic on the state replaces the encoder's value head
    "build_agent": {"mappo_mpe_rnn", "mat_mpe", "mat_mpe_ep_critic"},  # the transformer; the GRUs have no --compile
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
def test_compile_traces_every_entry_point_and_the_env_step_whole(script, entry_points, tmp_path, monkeypatch):
    """On a GPU (`--compile`, the default there) the network entry points of the training loop go to torch.compile
    with CUDA graphs, which need one whole graph a call, and the batched env's `advance` to Inductor's fusion. Here
    each is traced by Dynamo in full (`fullgraph`) through a training iteration and run by its eager backend; on the
    CPU a run compiles nothing."""
    module, torch_compile, compiled = importlib.import_module(script), torch.compile, []

    def compile_whole_and_run_eagerly(function, mode=None):
        compiled.append((function.__name__, mode))
        return torch_compile(function, backend="eager", fullgraph=True)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch, "compile", compile_whole_and_run_eagerly)
    flags = ["--total-timesteps", "100", "--n-rollout-threads", "4", "--n-eval-episodes", "2", "--ppo-epoch", "2"]
    try:
        assert module.main(module.parse_args(flags))["global_step"] == 100 and compiled == []  # the CPU: eager
        build_agent, batched_mpe = module.build_agent, module.BatchedMPE  # as main calls them on a GPU
        monkeypatch.setattr(module, "build_agent", lambda spec, args, device, _: build_agent(spec, args, device, True))
        monkeypatch.setattr(
            module, "BatchedMPE", lambda spec, n, seed, device, _: batched_mpe(spec, n, seed, device, True)
        )
        assert module.main(module.parse_args(flags))["global_step"] == 100
    finally:
        torch._dynamo.reset()
    assert compiled == [("advance", None)] + [(name, "reduce-overhead") for name in entry_points]


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
        "warning: --env-id tests.tutorial_env:MeetEnv: it has no Box state_space; the critic takes the observations "
        "joined"
    )
    assert lines[1].startswith("training on cpu") and lines[2] == "gamma 0.9, from the env's time limit: 30 steps"
    (run_name,) = os.listdir(tmp_path / "runs")
    assert run_name.startswith(f"tests.tutorial_env.MeetEnv__{script}__1__") and lines[-1].startswith("run in runs/")
    checkpoint = torch.load(tmp_path / "runs" / run_name / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 240 and checkpoint["args"]["gamma"] == 0.9
