"""Tests for mat_mpe.py: the transformer's decoding, the PPO pieces, then whole runs on a tiny budget."""

import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SCRIPT = "mat_mpe.py"  # run end to end by the run_script fixture (conftest.py)

from conftest import (  # noqa: E402
    GENERIC_ENVS,
    TINY,
    all_actions,
    all_alive,
    assert_a_resume_finishes_the_final_evaluation,
    assert_action_masks_are_obeyed,
    assert_an_env_fault_keeps_the_last_update,
    assert_bad_resumes_are_refused,
    assert_evaluations_of_a_continuing_task_end,
    assert_no_unavailable_action,
    assert_one_line_error,
    assert_resume_is_exact,
    assert_sigterm_checkpoint_resumes,
    assert_stops_cleanly,
    assert_the_encoder_takes_any_team_size,
    assert_the_value_clip_is_centred_on_the_values_acted_with,
    full_re_decode,
    random_masks,
    save_then_test_mode,
)

import mat_mpe as m  # noqa: E402

SCENARIOS = {
    # env_id: (n_agents, padded obs dim, action dim, action dims per agent)
    "simple_spread_v3": (3, 18, 5, [5, 5, 5]),
    "simple_reference_v3": (2, 21, 50, [50, 50]),
    "simple_speaker_listener_v4": (2, 11, 5, [3, 5]),
}


def scenario(env_id: str = "simple_spread_v3", **args) -> dict:
    """The mpe2 keyword arguments the script derives from its Args."""
    return m.scenario_kwargs(m.Args(env_id=env_id, **args))


def env_spec(env_id: str = "simple_spread_v3", **args) -> m.EnvSpec:
    return m.get_env_spec(env_id, scenario(env_id, **args))


def random_model(env_id="simple_spread_v3", n_agents=3, seed=0, **args) -> tuple[m.MultiAgentTransformer, m.EnvSpec]:
    """A model with large random weights, so that logits differ clearly between agents and actions."""
    model_args = m.Args(env_id=env_id, n_agents=n_agents, **args)
    spec = m.get_env_spec(env_id, m.scenario_kwargs(model_args))
    torch.manual_seed(seed)
    model = m.MultiAgentTransformer(spec, model_args)
    randomize(model)
    return model, spec


@torch.no_grad()
def randomize(model: torch.nn.Module):
    """PyTorch's default Linear init (instead of the small output gains) and random LayerNorm affines."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.reset_parameters()
        elif isinstance(module, torch.nn.LayerNorm):
            module.weight.normal_(1.0, 0.3)
            module.bias.normal_(0.0, 0.3)


# ----------------------------------------------------------------------------------------------------
# The transformer
# ----------------------------------------------------------------------------------------------------


def test_shift_actions():
    model, spec = random_model()
    shifted = model.shift_actions(torch.tensor([[2, 0, 4]]), torch.ones(1, 3, dtype=torch.bool))
    expected = torch.zeros(1, 3, 6)
    expected[0, 0, 0] = 1.0  # start token
    expected[0, 1, 3] = 1.0  # agent 0 took action 2
    expected[0, 2, 1] = 1.0  # agent 1 took action 0
    torch.testing.assert_close(shifted, expected, atol=0, rtol=0)
    continuous, _ = random_model(continuous_actions=True)
    actions = torch.rand(1, 3, 5)
    expected = torch.cat([torch.zeros(1, 1, 5), actions[:, :2]], dim=1)  # no start slot: a zero vector first
    torch.testing.assert_close(continuous.shift_actions(actions, all_alive(actions)), expected, atol=0, rtol=0)


@pytest.mark.parametrize("n_block,n_head,continuous", [(1, 1, False), (2, 4, False), (2, 2, True)])
def test_sampled_logprobs_and_entropies_match_teacher_forcing(n_block, n_head, continuous):
    model, spec = random_model(n_block=n_block, n_head=n_head, continuous_actions=continuous)
    obs = torch.randn(256, 3, 18)
    with torch.no_grad():
        x, avail = model.agent_inputs(obs), all_actions(spec, obs)
        obs_rep = model.encode(x)[0]
        torch.manual_seed(0)
        actions, logprobs = model.decode_autoregressive(obs_rep, avail, all_alive(obs), deterministic=False)
        torch.manual_seed(0)  # the same draws again: the head outputs those actions were drawn from
        _, _, outs = full_re_decode(model, obs_rep, avail, m.action_distribution)
        tf_logprobs, tf_entropy, _ = model.evaluate_actions(obs, actions, all_alive(obs), all_actions(spec, obs))
    torch.testing.assert_close(tf_logprobs, logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        tf_entropy, m.action_distribution(outs, avail, model.std_logit).entropy(), atol=1e-5, rtol=0
    )
    assert (tf_entropy if not continuous else tf_logprobs).std() > 0.01  # random enough for the check to mean something


@pytest.mark.parametrize("j", [0, 1, 2, 3])
def test_changing_an_action_changes_no_logits_of_earlier_agents(j):
    model, spec = random_model(n_agents=5, n_block=2, n_head=2)
    obs = torch.randn(64, 5, spec.obs_dim)
    actions = torch.randint(0, 5, (64, 5))
    changed = actions.clone()
    changed[:, j] = (changed[:, j] + 1) % 5
    with torch.no_grad():
        obs_rep, _ = model.encode(model.agent_inputs(obs))
        before = model.decode(model.shift_actions(actions, all_alive(actions)), obs_rep)
        after = model.decode(model.shift_actions(changed, all_alive(changed)), obs_rep)
    torch.testing.assert_close(after[:, : j + 1], before[:, : j + 1], atol=0, rtol=0)
    assert (after[:, j + 1] - before[:, j + 1]).abs().max() > 1e-3  # agent j+1 does see it


@pytest.mark.parametrize("continuous", [False, True])
def test_an_agent_who_died_is_a_zero_token_to_the_next_agents(continuous):
    """Agents 1 and 3 of 5 have left their episodes: whatever action is stored for them, the later agents decode
    the same outputs (their tokens are fixed, unlike any action's), and acting agent by agent still gives the
    teacher-forced log-probs."""
    model, spec = random_model(n_agents=5, n_block=2, n_head=2, continuous_actions=continuous)
    obs, alive = torch.randn(64, 5, spec.obs_dim), torch.tensor([True, False, True, False, True]).expand(64, 5)
    with torch.no_grad():
        actions, logprobs = model.act(obs, alive, all_actions(spec, obs))
        changed = actions.clone()
        changed[:, [1, 3]] = torch.rand_like(changed[:, [1, 3]].float()).to(changed.dtype) + 1
        obs_rep, _ = model.encode(model.agent_inputs(obs))
        before = model.decode(model.shift_actions(actions, alive), obs_rep)
        after = model.decode(model.shift_actions(changed, alive), obs_rep)
        tf_logprobs, _, _ = model.evaluate_actions(obs, actions, alive, all_actions(spec, obs))
        seen = model.decode(model.shift_actions(changed, all_alive(obs)), obs_rep)
    torch.testing.assert_close(after, before, atol=0, rtol=0)
    assert (seen[:, 2] - before[:, 2]).abs().max() > 1e-3  # alive, agent 1's action would have been seen
    torch.testing.assert_close(tf_logprobs, logprobs, atol=1e-5, rtol=0)
    dead = model.shift_actions(actions, alive)[:, [2, 4]]  # the tokens that follow agents 1 and 3
    # no action gives a dead agent's token: actions are one-hots (slots 1..), or vectors in the unit box
    assert (((dead < 0) | (dead > 1)).any(-1) if continuous else dead.sum(-1) == 0).all()


@pytest.mark.parametrize("n_agents", [3, 8])
@pytest.mark.parametrize("n_block,n_head,continuous", [(1, 1, False), (2, 2, False), (2, 2, True)])
def test_cached_decoding_equals_full_re_decode(n_agents, n_block, n_head, continuous):
    model, spec = random_model(n_agents=n_agents, n_block=n_block, n_head=n_head, continuous_actions=continuous)
    obs = torch.randn(128, n_agents, spec.obs_dim)
    with torch.no_grad():  # each agent's turn under its own mask
        x, avail = model.agent_inputs(obs), random_masks(spec, obs)
        obs_rep = model.encode(x)[0]
        results = []
        for decode in (
            lambda: model.decode_autoregressive(obs_rep, avail, all_alive(obs), False),
            lambda: full_re_decode(model, obs_rep, avail, m.action_distribution),
        ):
            torch.manual_seed(7)  # the same random draws, so both paths see the same earlier actions
            results.append(decode())
    (cached_actions, cached_logprobs), (full_actions, full_logprobs, _) = results
    torch.testing.assert_close(cached_actions, full_actions, atol=1e-5 if continuous else 0, rtol=0)
    torch.testing.assert_close(cached_logprobs, full_logprobs, atol=1e-5, rtol=1e-5)
    assert cached_logprobs.shape == (128, n_agents)


def test_sorted_encoder_does_not_see_the_order_of_landmarks_and_agents():
    """With --sort-entities, shuffling the landmark blocks and the other agents' blocks of every observation changes
    neither the values nor the actions; the teacher-forced pass still scores the actions taken agent by agent."""
    model, spec = random_model(n_agents=4, sort_entities=True)
    obs = torch.randn(64, 4, spec.obs_dim)
    shuffled = obs.clone()
    landmark_order, agent_order = torch.randperm(4), torch.randperm(3)
    shuffled[..., 4:12] = obs[..., 4:12].unflatten(-1, (4, 2))[..., landmark_order, :].flatten(-2)
    for start in (12, 18):  # the other agents' positions, then their messages, in the same order
        shuffled[..., start : start + 6] = (
            obs[..., start : start + 6].unflatten(-1, (3, 2))[..., agent_order, :].flatten(-2)
        )
    assert not torch.equal(shuffled, obs)
    with torch.no_grad():
        outputs = []
        for x in (obs, shuffled):
            torch.manual_seed(3)
            actions, logprobs = model.act(x, all_alive(x), all_actions(spec, x))
            outputs.append((actions, logprobs, *model.evaluate_actions(x, actions, all_alive(x), all_actions(spec, x))))
    for a, b in zip(*outputs):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    torch.testing.assert_close(outputs[0][2], outputs[0][1], atol=1e-5, rtol=1e-5)  # teacher-forced log-probs


def test_masked_actions_are_never_sampled_and_deterministic_is_argmax():
    model, spec = random_model("simple_speaker_listener_v4", 2)
    with torch.no_grad():  # make the unavailable speaker actions the most attractive ones
        model.action_head[-1].bias.copy_(torch.tensor([0.0, 0.0, 0.0, 50.0, 50.0]))
        obs = torch.randn(4096, 2, 11)
        actions, logprobs = model.act(obs, all_alive(obs), all_actions(spec, obs))
        x, avail = model.agent_inputs(obs), all_actions(spec, obs)
        obs_rep = model.encode(x)[0]
        greedy, _ = model.decode_autoregressive(obs_rep, avail, all_alive(obs), deterministic=True)
        logits = model.decode(model.shift_actions(greedy, all_alive(obs)), obs_rep)  # each agent's, after the others'
        _, entropy, _ = model.evaluate_actions(obs, actions, all_alive(obs), all_actions(spec, obs))
    assert actions[:, 0].max() <= 2 and greedy[:, 0].max() <= 2
    assert set(actions[:, 0].tolist()) == {0, 1, 2}
    assert {3, 4} <= set(actions[:, 1].tolist())  # the listener does have actions 3 and 4
    assert torch.isfinite(logprobs).all() and torch.isfinite(entropy).all()
    torch.testing.assert_close(greedy, logits.masked_fill(~avail, -torch.inf).argmax(-1), atol=0, rtol=0)
    torch.testing.assert_close(
        model.act(obs, all_alive(obs), all_actions(spec, obs), deterministic=True)[0], greedy, atol=0, rtol=0
    )


def test_continuous_padded_dimensions_are_zero_and_change_no_log_probability():
    """The speaker's 3 dims padded to the listener's 5: its padded dims are zero in samples and in the mode (so the
    listener's decoder input never carries them) and do not enter the speaker's log-probability or entropy."""
    model, spec = random_model("simple_speaker_listener_v4", 2, continuous_actions=True)
    obs = torch.randn(512, 2, 11)
    with torch.no_grad():
        model.std_logit.copy_(torch.randn(5))
        actions, logprobs = model.act(obs, all_alive(obs), all_actions(spec, obs))
        greedy, _ = model.act(obs, all_alive(obs), all_actions(spec, obs), deterministic=True)
        padded = actions.clone()
        padded[:, 0, 3:] = torch.randn(512, 2) * 5
        padded_logprobs, entropy, _ = model.evaluate_actions(obs, padded, all_alive(obs), all_actions(spec, obs))
    assert actions.shape == (512, 2, 5) and torch.all(actions[:, 0, 3:] == 0) and torch.all(greedy[:, 0, 3:] == 0)
    torch.testing.assert_close(padded_logprobs[:, 0], logprobs[:, 0], atol=1e-5, rtol=0)
    own_entropy = torch.distributions.Normal(0.0, torch.sigmoid(model.std_logit[:3])).entropy().sum()
    torch.testing.assert_close(entropy[:, 0], own_entropy.expand(512), atol=1e-5, rtol=0)


@pytest.mark.parametrize("env_id", SCENARIOS)
def test_model_shapes(env_id):
    n_agents, obs_dim, action_dim, _ = SCENARIOS[env_id]
    model, spec = random_model(env_id, n_agents)
    assert (spec.obs_dim, spec.action_dim) == (obs_dim, action_dim)
    obs = torch.randn(7, n_agents, obs_dim)
    actions, logprobs = model.act(obs, all_alive(obs), all_actions(spec, obs))
    assert actions.shape == logprobs.shape == (7, n_agents) and actions.dtype == torch.long
    logprob, entropy, values = model.evaluate_actions(obs, actions, all_alive(obs), all_actions(spec, obs))
    assert logprob.shape == entropy.shape == values.shape == (7, n_agents)
    torch.testing.assert_close(model.get_value(obs), values)


# ----------------------------------------------------------------------------------------------------
# Environments, GAE, ValueNorm and the PPO update
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", SCENARIOS)
def test_batched_env_shapes(env_id):
    n_agents, obs_dim, _, action_dims = SCENARIOS[env_id]
    envs = m.BatchedMPE(m.get_env_spec(env_id, scenario(env_id, max_cycles=2)), 3, seed=0, device=torch.device("cpu"))
    envs.reset()
    obs, *_ = envs.observe()
    assert obs.shape == (3, n_agents, obs_dim)
    for _ in range(2):
        step = envs.step(torch.zeros((3, n_agents), dtype=torch.long))
    assert step.truncated.all() and step.final_obs.shape == (3, n_agents, obs_dim)
    np.testing.assert_array_equal(envs.spec.avail_actions.sum(axis=1), action_dims)


def test_gae_known_answers_with_termination_and_truncation():
    """gamma = lambda = 0.5, two envs of one agent over 3 steps, worked by hand. Env 0 terminates at step 1 (its
    value after that is 0 and no advantage flows back across it); env 1 is truncated at step 0, which bootstraps
    from its final observation's value 2 instead of the next episode's first."""
    rollout = SimpleNamespace(
        rewards=torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]]).unsqueeze(-1),  # (T, n_envs, 1)
        values=torch.tensor([[0.5, 1.0], [0.25, 1.0], [0.125, 1.0], [1.0, 1.0]]).unsqueeze(-1),
        final_values=torch.tensor([[0.0, 2.0], [0.0, 0.0], [0.0, 0.0]]).unsqueeze(-1),
        terminated=torch.tensor([[False, False], [True, False], [False, False]]).unsqueeze(-1),
        truncated=torch.tensor([[False, True], [False, False], [False, False]]).unsqueeze(-1),
    )
    advantages, returns = m.compute_gae(rollout, 0.5, 0.5, team_reward=False)
    expected = torch.tensor([[1.0625, 1.0], [1.75, 0.625], [3.375, 0.5]]).unsqueeze(-1)
    torch.testing.assert_close(advantages, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(returns, expected + rollout.values[:-1], atol=1e-6, rtol=0)


@pytest.mark.parametrize("continuous", [False, True])
def test_first_ppo_epoch_starts_on_policy(continuous):
    """Before any update the new policy is the old one: ratio 1, clipfrac 0; the values are the old ones, the centre
    of the value clip (each agent's outputs depend strongly on the agents before it in the randomized model)."""
    torch.manual_seed(0)
    spec = env_spec(continuous_actions=continuous)
    args = m.Args(ppo_epoch=1, num_mini_batch=1, lr=0.0, continuous_actions=continuous)
    agent, value_norm, optimizer = m.build_agent(spec, args, torch.device("cpu"))
    randomize(agent)
    buffer = m.RolloutBuffer(5, 2, spec, torch.device("cpu"))
    buffer.obs.normal_()
    buffer.avail[:] = random_masks(spec, buffer.obs)  # the update scores each action under the mask it had
    with torch.no_grad():
        for t in range(5):
            buffer.actions[t], buffer.logprobs[t] = agent.act(buffer.obs[t], buffer.alive[t], buffer.avail[t])
    if not continuous:
        assert_no_unavailable_action(buffer)
    stats = m.ppo_update(agent, optimizer, value_norm, buffer, torch.randn(5, 2, 3), torch.randn(5, 2, 3), args)
    assert stats["ratio"] == pytest.approx(1.0, abs=1e-6)
    assert stats["clipfrac"] == 0.0 and stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert_the_value_clip_is_centred_on_the_values_acted_with(m, agent, value_norm, optimizer, buffer, args)
    assert set(stats) == {"policy_loss", "value_loss", "entropy", "grad_norm", "approx_kl", "clipfrac", "ratio"}


# ----------------------------------------------------------------------------------------------------
# Checkpoints and argument checks
# ----------------------------------------------------------------------------------------------------


def test_checkpoint_round_trip_gives_identical_actions(tmp_path):
    spec = env_spec("simple_speaker_listener_v4")
    args = m.Args(env_id="simple_speaker_listener_v4", n_block=2, n_head=2)
    torch.manual_seed(1)
    agent, value_norm, optimizer = m.build_agent(spec, args, torch.device("cpu"))
    value_norm.update(torch.tensor([-3.0, -5.0]))
    path = str(tmp_path / "model.pt")
    m.save_checkpoint(path, agent, value_norm, optimizer, args, global_step=123)

    torch.manual_seed(2)  # different initial weights, overwritten by the checkpoint
    checkpoint = m.load_checkpoint(path, torch.device("cpu"))
    restored, restored_norm, restored_opt = m.build_agent(spec, m.Args(**checkpoint["args"]), torch.device("cpu"))
    m.restore(checkpoint, restored, restored_norm, restored_opt, path)
    obs = torch.randn(64, 2, 11)
    torch.testing.assert_close(
        restored.act(obs, all_alive(obs), all_actions(spec, obs), deterministic=True)[0],
        agent.act(obs, all_alive(obs), all_actions(spec, obs), deterministic=True)[0],
    )
    torch.testing.assert_close(
        restored.evaluate_actions(obs, torch.zeros(64, 2, dtype=torch.long), all_alive(obs), all_actions(spec, obs)),
        agent.evaluate_actions(obs, torch.zeros(64, 2, dtype=torch.long), all_alive(obs), all_actions(spec, obs)),
    )
    torch.testing.assert_close(restored_norm.mean_var()[0], value_norm.mean_var()[0])
    assert checkpoint["global_step"] == 123 and checkpoint["args"]["n_block"] == 2

    other, other_norm, other_opt = m.build_agent(spec, m.Args(n_embd=32), torch.device("cpu"))
    with pytest.raises(SystemExit, match="does not fit this model"):
        m.restore(checkpoint, other, other_norm, other_opt, path)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(num_mini_batch=3), "does not divide the rollout of 100 env steps"),
        (dict(n_head=3), "--n-head 3 does not divide --n-embd 64"),
        (dict(n_block=0), "--n-block must be at least 1, not 0"),
    ],
)
def test_impossible_settings_are_rejected(overrides, message):
    args = m.Args(total_timesteps=200, n_rollout_threads=4, **overrides)
    with pytest.raises(SystemExit, match=message):
        m.check_args(args)


# ----------------------------------------------------------------------------------------------------
# The script end to end
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env_id,continuous",  # spread's discrete actions: test_save_model_then_test_mode_with_video
    [(env_id, False) for env_id in SCENARIOS if env_id != "simple_spread_v3"] + [("simple_speaker_listener_v4", True)],
)
def test_script_end_to_end(tmp_path, run_script, env_id, continuous):
    flags = ["--env-id", env_id, *TINY] + (["--continuous-actions"] if continuous else [])
    result = run_script(tmp_path, *flags)
    assert "step       200/200" in result.stdout
    runs = os.listdir(tmp_path / "runs")
    assert len(runs) == 1 and runs[0].startswith(f"{env_id}__mat_mpe__1__")


@pytest.mark.parametrize("env", ["dying_discrete", "multiwalker", "kaz"])
def test_generic_env_end_to_end(tmp_path, run_script, env):
    result = run_script(tmp_path, *GENERIC_ENVS[env], *TINY)
    assert "step       200/200" in result.stdout


def test_one_agent_trains(tmp_path, run_script):
    """Spread with a single agent: a sequence of one, no teammate to observe or collide with."""
    result = run_script(tmp_path, "--n-agents", "1", "--preset", "tuned", *TINY)
    assert "step       200/200" in result.stdout


def test_the_envs_action_masks_are_obeyed(tmp_path, run_script):
    assert_action_masks_are_obeyed(run_script, tmp_path)


def test_save_model_then_test_mode_with_video(tmp_path, run_script):
    _, result = save_then_test_mode(run_script, tmp_path, "--n-agents", "4")
    assert result.stdout.count("agent_") == 4  # the saved n_agents is used, not the default 3


def test_continuous_actions_save_model_then_test_mode_with_video(tmp_path, run_script):
    save_then_test_mode(run_script, tmp_path, "--continuous-actions")


def test_ctrl_c_ends_the_run_with_one_line(tmp_path, stop_script):
    assert_stops_cleanly(stop_script, tmp_path)


def test_evaluations_of_a_continuing_task_end(tmp_path, stop_script, run_script):
    assert_evaluations_of_a_continuing_task_end(stop_script, run_script, tmp_path)


@pytest.mark.parametrize("flags", [[], ["--continuous-actions", "--episode-length", "10"]])
def test_resume_goes_on_exactly_as_an_uninterrupted_run(tmp_path, run_script, flags):
    assert_resume_is_exact(run_script, tmp_path, *flags)


def test_sigterm_leaves_a_checkpoint_that_resumes(tmp_path, stop_script, run_script):
    assert_sigterm_checkpoint_resumes(stop_script, run_script, tmp_path)


def test_a_fault_of_the_users_env_keeps_the_last_update_and_resumes(tmp_path, run_script):
    assert_an_env_fault_keeps_the_last_update(run_script, tmp_path)


def test_bad_resumes_are_refused_in_one_line(tmp_path, run_script):
    assert_bad_resumes_are_refused(run_script, tmp_path, m)


def test_script_reports_bad_input_in_one_line(tmp_path, run_script):
    (tmp_path / "bad.pt").write_bytes(b"garbage")
    for flags, message in [
        (["--n-head", "5", *TINY], "does not divide --n-embd"),
        (["--eval-checkpoint", str(tmp_path / "bad.pt")], "is a text file"),
    ]:
        assert_one_line_error(run_script(tmp_path, *flags, check=False), message)


@pytest.mark.parametrize("n_agents", [2, 6, 10])
def test_nearest_k_gives_the_encoder_one_input_size_at_any_team_size(n_agents):
    assert_the_encoder_takes_any_team_size(m, env_spec(n_agents=n_agents))


def test_a_resume_after_a_fault_in_the_final_evaluation_finishes_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_a_resume_finishes_the_final_evaluation(m, tmp_path)
