"""What the test files share: running a script end to end on a tiny budget, and checking its output."""

import contextlib
import copy
import dataclasses
import io
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = [
    "--total-timesteps",
    "200",
    "--n-rollout-threads",
    "4",
    "--n-eval-episodes",
    "2",
    "--eval-interval",
    "100",
    "--log-interval",
    "100",
    "--ppo-epoch",
    "2",
]


@pytest.fixture
def run_script(request):
    """`run_script(cwd, *flags, check=True)` runs the script named by the test module's SCRIPT."""
    script = os.path.join(ROOT, request.module.SCRIPT)

    def run(cwd, *flags, check=True) -> subprocess.CompletedProcess:
        env = {**os.environ, "SDL_VIDEODRIVER": "dummy"}
        result = subprocess.run(
            [sys.executable, script, *flags], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
        )
        if check:
            assert result.returncode == 0, result.stderr[-3000:]
        return result

    run.script = request.module.SCRIPT
    return run


@pytest.fixture
def stop_script(request):
    """`stop_script(cwd, signal_name, *flags, delay=0)` starts the test module's SCRIPT, waits for its first progress
    line and `delay` seconds, then sends it "SIGINT" or "SIGTERM". Returns the exit code, stdout and stderr."""
    script = os.path.join(ROOT, request.module.SCRIPT)

    def run(cwd, signal_name, *flags, delay: float = 0.0) -> tuple[int, str, str]:
        env = {**os.environ, "SDL_VIDEODRIVER": "dummy"}
        command = [sys.executable, script, *flags]
        proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        first_line = proc.stdout.readline()
        while first_line.startswith(("training on", "gamma", "--eval-max-steps", "warning", "PPO passes")):  # start-up
            first_line = proc.stdout.readline()
        assert first_line.startswith("step"), first_line + proc.stderr.read()[-2000:]
        time.sleep(delay)  # into the next iteration
        proc.send_signal(getattr(signal, signal_name))
        out, err = proc.communicate(timeout=120)
        return proc.returncode, first_line + out, err

    return run


STOP_FLAGS = ["--total-timesteps", "1000000", "--n-rollout-threads", "4", "--n-eval-episodes", "2"]
STOP_FLAGS += ["--log-interval", "100", "--eval-interval", "10000000"]


def assert_stops_cleanly(stop_script, cwd):
    """Ctrl-C ends a run with exit code 130 and one line saying where the run and its model are."""
    code, out, err = stop_script(cwd, "SIGINT", *STOP_FLAGS, "--save-model")
    assert code == 130 and err == "", err[-2000:]
    (last,) = [line for line in out.splitlines() if not line.startswith("step")]
    (run_name,) = os.listdir(cwd / "runs")
    assert last.startswith("stopped by SIGINT at step ") and f"runs/{run_name}, with checkpoint.pt, model.pt;" in last
    assert set(os.listdir(cwd / "runs" / run_name)) >= {"checkpoint.pt", "model.pt"}  # no evaluation: no best model
    assert "best_model.pt" not in os.listdir(cwd / "runs" / run_name)


def assert_one_line_error(result: subprocess.CompletedProcess, message: str):
    """The script failed with exit code 1 and a single `error: ...` line that contains `message`."""
    assert result.returncode == 1
    assert result.stderr.strip().startswith("error:") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def save_then_test_mode(run_script, cwd, *train_flags) -> tuple[str, subprocess.CompletedProcess]:
    """Trains with --save-model (a run to the end, in its run folder with its logs: the end-to-end check of spread's
    discrete actions), then evaluates model.pt in test mode with a video; returns the run name and the test-mode
    result, after checking both checkpoints and the video were written."""
    trained = run_script(cwd, *TINY, "--save-model", *train_flags)
    (run_name,) = os.listdir(cwd / "runs")
    run_dir = cwd / "runs" / run_name
    env_id = train_flags[train_flags.index("--env-id") + 1] if "--env-id" in train_flags else "simple_spread_v3"
    assert "step       200/200" in trained.stdout and run_name.startswith(f"{env_id}__{run_script.script[:-3]}__1__")
    assert {"model.pt", "best_model.pt"} <= set(os.listdir(run_dir))
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(run_dir))
    result = run_script(
        cwd, "--eval-checkpoint", str(run_dir / "model.pt"), "--n-eval-episodes", "3", "--capture-video"
    )
    assert f"trained 200 steps on {env_id}" in result.stdout and "over 3 episodes" in result.stdout
    (video,) = os.listdir(cwd / "videos" / run_name)
    assert video == "test_200.mp4" and os.path.getsize(cwd / "videos" / run_name / video) > 1000
    return run_name, result


# Envs that are not MPE scenarios, through gymnasium's vector envs: one where an agent dies (discrete and continuous
# actions with per-agent bounds), and PettingZoo envs no one here wrote: one with workers (--async-envs), pursuit's
# 7x7x3 observations (flattened), and MaMuJoCo (requirements-mamujoco.txt), a package attribute rather than a module.
KAZ = "pettingzoo.butterfly.knights_archers_zombies_v11"
GENERIC_ENVS = {
    "dying_discrete": ["--env-id", "tests.dying_env"],
    "dying_continuous": ["--env-id", "tests.dying_env", "--env-kwargs", "continuous", "True"],
    "multiwalker": ["--env-id", "pettingzoo.sisl.multiwalker_v9", "--env-kwargs", "max_cycles", "30", "--async-envs"],
    "kaz": ["--env-id", KAZ, "--env-kwargs", "max_cycles", "30"],
    "pursuit": ["--env-id", "pettingzoo.sisl.pursuit_v5", "--env-kwargs", "max_cycles", "30"],
    "mamujoco": ["--env-id", "gymnasium_robotics.mamujoco_v1", "--env-kwargs", "scenario", "HalfCheetah"]
    + ["agent_conf", "2x3", "max_episode_steps", "30"],
}


RESUME_FLAGS = ["--n-rollout-threads", "4", "--n-eval-episodes", "2", "--ppo-epoch", "2"]
RESUME_FLAGS += ["--eval-interval", "200", "--log-interval", "200", "--checkpoint-interval", "400"]


def logged_scalars(run_dir) -> dict:
    """Every scalar a run folder's event files hold but the speed and the timings: {tag: [(step, value), ...]}."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    tags = [tag for tag in events.Tags()["scalars"] if tag != "charts/SPS" and not tag.startswith("perf/")]
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in tags}


def assert_resume_is_exact(run_script, cwd, *flags):
    """800 steps straight, and 400 steps then --resume to 800, end with bit-identical parameters and log the
    same losses, returns and evaluations at every step (the resumed run appends to its run folder)."""
    for name in ("straight", "halves"):
        (cwd / name).mkdir()
    run_script(cwd / "straight", "--total-timesteps", "800", *RESUME_FLAGS, *flags)
    run_script(cwd / "halves", "--total-timesteps", "400", *RESUME_FLAGS, *flags)
    ((straight,), (halves,)) = ([d for d in (cwd / name / "runs").iterdir()] for name in ("straight", "halves"))
    resumed = run_script(cwd, "--total-timesteps", "800", *RESUME_FLAGS, *flags, "--resume", f"{halves}/checkpoint.pt")
    assert f"run in {halves}, with checkpoint.pt" in resumed.stdout
    assert "step       800/800" in resumed.stdout and "step       400" not in resumed.stdout
    first, second = (torch.load(d / "checkpoint.pt", weights_only=True) for d in (straight, halves))
    assert first["global_step"] == second["global_step"] == 800
    assert first["agent"].keys() == second["agent"].keys()
    assert all(torch.equal(first["agent"][k], second["agent"][k]) for k in first["agent"])
    assert first["optimizer"]["state"].keys() == second["optimizer"]["state"].keys()
    logged = logged_scalars(straight)
    assert {"losses/policy_loss", "losses/value_loss", "eval/episodic_return"} <= logged.keys()
    assert logged["losses/policy_loss"][-1][0] == 800 and logged == logged_scalars(halves)


# An env where nobody dies and no time limit ends an episode (a continuing task)
CONTINUING = ["--env-id", "tests.dying_env", "--env-kwargs", "death_step", "0", "max_cycles", "1000000000"]


def assert_evaluations_of_a_continuing_task_end(stop_script, run_script, cwd):
    """Evaluation episodes end after --eval-max-steps steps (said at start); a stop request ends an evaluation that
    would not end for hours: the run stops at once with its checkpoint, that evaluation not recorded (due again)."""
    (cwd / "capped").mkdir(), (cwd / "stopped").mkdir()
    result = run_script(cwd / "capped", *CONTINUING, *TINY, "--eval-max-steps", "30")
    assert "--eval-max-steps: evaluation episodes end after 30 steps if not before" in result.stdout
    assert [step for step, _ in logged_scalars(next((cwd / "capped" / "runs").iterdir()))["eval/episodic_return"]] == [
        100,
        200,
    ]
    flags = ["--n-rollout-threads", "4", "--n-eval-episodes", "2", "--log-interval", "100", "--eval-interval", "200"]
    stopped = [*CONTINUING, *flags, "--eval-max-steps", "1000000000"]
    code, out, err = stop_script(cwd / "stopped", "SIGTERM", *stopped, delay=2.0)  # in the evaluation at step 200
    assert code == 143 and err == "" and out.splitlines()[-1].startswith("stopped by SIGTERM at step 200;"), out + err
    (run_dir,) = (cwd / "stopped" / "runs").iterdir()
    progress = torch.load(run_dir / "checkpoint.pt", weights_only=True)["progress"]
    assert progress["global_step"] == 200 and progress["eval_step"] == 0


def assert_sigterm_checkpoint_resumes(stop_script, run_script, cwd):
    """SIGTERM ends a run with a checkpoint that a later call resumes in the same run folder."""
    code, out, err = stop_script(cwd, "SIGTERM", *STOP_FLAGS)
    assert code == 143 and err == "", err[-2000:]
    (run_dir,) = (cwd / "runs").iterdir()
    last = out.splitlines()[-1]
    assert last.startswith("stopped by SIGTERM at step ") and f"runs/{run_dir.name}, with checkpoint.pt" in last
    step = int(last.split(" at step ")[1].split(";")[0].replace(",", ""))
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert saved["global_step"] == step and saved["progress"]["global_step"] == step
    resumed = run_script(cwd, *STOP_FLAGS, "--total-timesteps", str(step + 200), "--resume", f"{run_dir}/checkpoint.pt")
    assert f"step {step + 200:>9,}/{step + 200:,}" in resumed.stdout, resumed.stdout
    assert os.listdir(cwd / "runs") == [run_dir.name]
    assert logged_scalars(run_dir)["losses/policy_loss"][-1][0] == step + 200


FAULT_FLAGS = ["--env-id", "tests.faulty_env", "--n-rollout-threads", "2", "--episode-length", "10"]
FAULT_FLAGS += ["--total-timesteps", "400", "--n-eval-episodes", "2", "--log-interval", "1000", "--ppo-epoch", "2"]


def assert_an_env_fault_keeps_the_last_update(run_script, cwd):
    """tests/faulty_env.py raises in its 30th step: after two updates of 20 env steps (2 envs x 10 steps), the run
    ends with one error line naming the env, the call, the step and the exception, and its checkpoint holds the
    second update (step 40). The same command with --resume goes on from there, until the fault comes again at the
    resumed process's 30th step: then the checkpoint holds step 80."""
    flags = [*FAULT_FLAGS, "--env-kwargs", "fail", "step", "at_call", "30"]
    result = run_script(cwd, *flags, check=False)
    message = "--env-id tests.faulty_env: its step() raised RuntimeError('step failed on purpose') at env step 58"
    assert_one_line_error(result, message)
    (run_name,) = os.listdir(cwd / "runs")
    checkpoint = cwd / "runs" / run_name / "checkpoint.pt"
    assert f"the run up to step 40 is kept: fix the env, add --resume runs/{run_name}/checkpoint.pt" in result.stderr
    assert torch.load(checkpoint, weights_only=False)["global_step"] == 40
    resumed = run_script(cwd, *flags, "--resume", str(checkpoint), check=False)
    assert_one_line_error(resumed, "its step() raised RuntimeError('step failed on purpose') at env step 98")
    assert torch.load(checkpoint, weights_only=False)["global_step"] == 80


def assert_a_resume_finishes_the_final_evaluation(module, cwd):
    """An env fault in the final evaluation (faulty_env's render, with --capture-video) keeps the run at its last step;
    the same command with --resume (no video) makes that evaluation, best_model.pt and model.pt, and keeps the discount
    of its checkpoint (0.95 written there) where the env's time limit would now give another (0.9); it prints that
    evaluation and saves it in the checkpoint. In-process: the caller runs it in `cwd`."""
    flags = [
        *FAULT_FLAGS,
        "--env-kwargs",
        "fail",
        "render",
        "at_call",
        "3",
        "--eval-interval",
        "1000000",
        "--save-model",
    ]
    with pytest.raises(SystemExit, match=r"render\(\) raised .* at env step 400; the run up to step 400 is kept"):
        module.main(module.parse_args([*flags, "--capture-video"]))
    (run_dir,) = (cwd / "runs").iterdir()
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert saved["progress"]["eval_step"] == 0 and saved["args"]["gamma"] == 0.9
    torch.save({**saved, "args": {**saved["args"], "gamma": 0.95}}, run_dir / "checkpoint.pt")
    with contextlib.redirect_stdout(io.StringIO()) as out:  # the run folder as users type it
        result = module.main(module.parse_args([*flags, "--resume", str(run_dir)]))
    assert result["global_step"] == 400 and result["best_eval"] > -float("inf")
    assert f"step       400 | the final evaluation {result['eval_return']:7.2f}\n" in out.getvalue()
    assert [step for step, _ in logged_scalars(run_dir)["eval/episodic_return"]] == [400]
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=False)["progress"]  # saved: made once
    assert (saved["eval_step"], saved["eval_return"]) == (400, result["eval_return"])
    for name in ("model.pt", "best_model.pt"):
        assert torch.load(run_dir / name, weights_only=False)["args"]["gamma"] == 0.95


def assert_bad_resumes_are_refused(run_script, cwd, module):
    """A model-only file, changed algorithm arguments, a finished run, another script's checkpoint and one of an
    earlier version (its envs' states pickled by worker processes) are each refused with one line by
    `module.main`."""
    run_script(cwd, *TINY, "--save-model")
    (run_dir,) = (cwd / "runs").iterdir()
    checkpoint = f"{run_dir}/checkpoint.pt"
    saved = torch.load(checkpoint, weights_only=True)
    other = "mat_mpe.py" if saved["script"] != "mat_mpe.py" else "mappo_mpe.py"
    torch.save({**saved, "script": other}, cwd / "other.pt")
    earlier = {k: v for k, v in saved.items() if k != "env"}
    torch.save({**earlier, "env_states": [b"pickled mpe2 env"] * 4}, cwd / "earlier.pt")
    changed = ["--total-timesteps", "400", "--gamma", "0.95", "--ppo-epoch", "3"]
    for flags, message in [
        (["--resume", f"{run_dir}/model.pt"], "holds a model only"),
        (
            ["--resume", checkpoint, *changed],
            "trained with other settings: --ppo-epoch (2 there, 3 here), --gamma (0.9 there, 0.95 here)",
        ),
        (["--resume", checkpoint], "is at step 200 already; give a larger --total-timesteps than 200"),
        (["--resume", str(cwd / "other.pt")], f"is a {other} checkpoint, this is {saved['script']}"),
        (["--resume", str(cwd / "earlier.pt")], "was written by an earlier version of"),
        (["--resume", checkpoint, "--eval-checkpoint", checkpoint], "exclude each other"),
    ]:
        with pytest.raises(SystemExit) as refused:
            module.main(module.parse_args([*TINY, *flags]))
        assert str(refused.value).startswith("error: ") and message in str(refused.value), str(refused.value)
        assert "\n" not in str(refused.value)


def random_masks(spec, x: torch.Tensor) -> torch.Tensor:
    """(..., n_agents, action_dim) bool: each of an agent's own actions available with probability 1/2, action 0
    always (discrete actions), for x (..., n_agents, features); continuous actions keep their dimensions."""
    draws = (torch.rand(*x.shape[:-1], spec.action_dim) < 0.5) | (torch.arange(spec.action_dim) == 0)
    return all_actions(spec, x) & (spec.continuous or draws)


def assert_no_unavailable_action(buffer):
    """Every discrete action stored in the rollout buffer was available where it was taken."""
    assert buffer.avail[:-1].gather(-1, buffer.actions.unsqueeze(-1)).all()


MASKED_ENV = ["--env-id", "tests.masked_env", "--env-kwargs", "strict", "True", "masks"]


def assert_action_masks_are_obeyed(run_script, cwd):
    """tests/masked_env.py with `strict` raises at an unavailable action: training, evaluation and test mode run
    through with its masks in the info and in a Dict observation, and the two give the same run."""
    for masks in ("info", "observation"):
        (cwd / masks).mkdir()
        run_script(cwd / masks, *MASKED_ENV, masks, *TINY, "--save-model")
    runs = [next((cwd / masks / "runs").iterdir()) for masks in ("info", "observation")]
    assert "eval/episodic_return" in logged_scalars(runs[0]) and logged_scalars(runs[0]) == logged_scalars(runs[1])
    result = run_script(cwd, "--eval-checkpoint", str(runs[1] / "model.pt"), "--n-eval-episodes", "3")
    assert "(trained 200 steps on tests.masked_env): eval episodic_return" in result.stdout


def all_actions(spec, x: torch.Tensor) -> torch.Tensor:
    """(..., n_agents, action_dim) bool: every action of each agent's own space, for x (..., n_agents, features)."""
    return torch.as_tensor(spec.avail_actions).expand(*x.shape[:-1], -1)


def all_alive(x: torch.Tensor) -> torch.Tensor:
    """(B, n_agents) True: every agent of x (B, n_agents, ...) in its episode."""
    return torch.ones(x.shape[:2], dtype=torch.bool)


def full_re_decode(model, obs_rep: torch.Tensor, avail: torch.Tensor, action_distribution):
    """The official MAT's acting, as the reference for the cached decoding: at each agent's turn the whole action
    sequence goes through the decoder again; returns actions and log-probs as decode_autoregressive, and the head
    outputs they were drawn from. `action_distribution` is the script's own."""
    B, n_agents, _ = obs_rep.shape
    shifted = model.start_token.repeat(B, n_agents, 1)
    actions, logprobs, outs = [], [], []
    for i in range(n_agents):
        out = model.decode(shifted, obs_rep)[:, i]
        dist = action_distribution(out, avail[..., i, :], model.std_logit)
        action = dist.sample()
        actions.append(action)
        logprobs.append(dist.log_prob(action))
        outs.append(out)
        if i + 1 < n_agents:
            shifted[:, i + 1] = model.action_tokens(action, torch.ones(B, dtype=torch.bool))
    return torch.stack(actions, dim=1), torch.stack(logprobs, dim=1), torch.stack(outs, dim=1)


# The columns of a sorted spread observation that --nearest-k 3 keeps, written out by hand from mpe2's layout (velocity
# 0-1, position 2-3, then N landmarks, N - 1 other agents and their N - 1 messages, 2 numbers each): the 3 nearest
# landmarks', 2 nearest agents' and their messages' blocks; a team of 2 has fewer, which read the zero column padded
# on at its observation's end (12).
NEAREST_3_COLUMNS = {
    2: [0, 1, 2, 3, 4, 5, 6, 7, 12, 12, 8, 9, 12, 12, 10, 11, 12, 12],
    6: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 18, 19, 26, 27, 28, 29],
    10: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 24, 25, 26, 27, 42, 43, 44, 45],
}


def assert_the_encoder_takes_any_team_size(m, spec):
    """MAT with --nearest-k 3: the encoder reads, per agent, the sorted observation's kept columns (zeros where a
    smaller team has fewer) and no agent id: 18 numbers at every N, so a trained model plays any team size."""
    n_agents = len(spec.agents)
    model = m.MultiAgentTransformer(spec, m.Args(n_agents=n_agents, nearest_k=3))
    assert model.obs_encoder[1].in_features == 18
    obs = torch.randn(4, n_agents, spec.obs_dim)
    x = model.agent_inputs(obs)
    padded = torch.nn.functional.pad(m.sort_entities(obs, spec.entities), (0, 1))
    torch.testing.assert_close(x, padded[..., NEAREST_3_COLUMNS[n_agents]], rtol=0, atol=0)


def assert_the_value_clip_is_centred_on_the_values_acted_with(m, agent, value_norm, optimizer, buffer, args):
    """With the rollout's values computed as training computes them, the first epoch of an update gives the critic's
    values back: the clip's centre, so that the clipped and the plain value losses are equal. ValueNorm takes new
    statistics from the returns first (random ones, far from its initial ones)."""
    buffer.compute_values(agent, value_norm)
    returns, advantages = torch.randn_like(buffer.rewards), torch.randn_like(buffer.rewards)
    losses = []
    for clipped in (True, False):
        copies = copy.deepcopy((agent, optimizer, value_norm))  # the same model and statistics for both
        settings = dataclasses.replace(args, clipped_value_loss=clipped, ppo_epoch=1)
        losses.append(m.ppo_update(*copies, buffer, advantages, returns, settings)["value_loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6, abs=1e-7) and losses[1] > 0.1
