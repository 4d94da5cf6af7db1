"""Tests for mappo_mpe_rnn.py: the GRU's resets, replay of a rollout equal to acting, the sequence minibatches,
then whole runs on a tiny budget. What the script shares with mappo_mpe.py is kept equal by test_shared_code.py."""

import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SCRIPT = "mappo_mpe_rnn.py"  # run end to end by the run_script fixture (conftest.py)

from conftest import (  # noqa: E402
    GENERIC_ENVS,
    NEAREST_3_COLUMNS,
    TINY,
    all_actions,
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
    assert_the_value_clip_is_centred_on_the_values_acted_with,
    random_masks,
    save_then_test_mode,
)

import mappo_mpe_rnn as m  # noqa: E402

SCENARIOS = ["simple_spread_v3", "simple_reference_v3", "simple_speaker_listener_v4"]
CPU = torch.device("cpu")


def scenario(env_id: str = "simple_spread_v3", **args) -> dict:
    """The mpe2 keyword arguments the script derives from its Args."""
    return m.scenario_kwargs(m.Args(env_id=env_id, **args))


def env_spec(env_id: str = "simple_spread_v3", **args) -> m.EnvSpec:
    return m.get_env_spec(env_id, scenario(env_id, **args))


@torch.no_grad()
def randomize(agent: torch.nn.Module):
    """Larger output layers and random LayerNorm affines, so that hidden states change the outputs clearly."""
    for module in agent.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.weight.normal_(1.0, 0.3)
            module.bias.normal_(0.0, 0.3)
    for net in [*agent.actors, agent.critic]:
        net.out.reset_parameters()


def reference_gru(gru: torch.nn.GRU, x, hidden, starts):
    """One GRU step at a time, the hidden state multiplied by "episode continues" before each step (CleanRL's
    get_states, the official RNNLayer's per-step masks)."""
    outputs = []
    for t in range(x.shape[0]):
        hidden = gru(x[t : t + 1], (hidden * ~starts[t].unsqueeze(-1)).unsqueeze(0))[1][0]
        outputs.append(hidden)
    return torch.stack(outputs)


# ----------------------------------------------------------------------------------------------------
# The GRU and its resets
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("start_times", [[], [0], [3], [0, 3, 7], list(range(10))])
def test_gru_over_sequence_equals_stepping_with_resets(start_times):
    torch.manual_seed(0)
    gru = torch.nn.GRU(6, 8)
    x, hidden = torch.randn(10, 5, 6), torch.randn(5, 8)
    starts = torch.zeros(10, 5, dtype=torch.bool)
    for t in start_times:
        starts[t, t % 5] = True  # a different row each time: rows reset at different steps
    starts[4, :] = 4 in start_times  # and once all rows together
    with torch.no_grad():
        ours = m.gru_over_sequence(gru, x, hidden, starts)
        reference = reference_gru(gru, x, hidden, starts)
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-5)


def test_hidden_state_is_zero_at_an_episode_start():
    """Acting at an episode start ignores the carried hidden state: the same as acting from zeros."""
    torch.manual_seed(0)
    spec = env_spec()
    agent = m.Agent(spec, m.Args())
    randomize(agent)
    obs, carried = torch.randn(1, 4, 3, 18), torch.randn(4, 3, 64)
    zeros, avail = torch.zeros_like(carried), all_actions(spec, obs)
    starts = torch.tensor([True, False, True, False])
    with torch.no_grad():
        dist, hidden = agent.get_dist(agent.actor_input(obs), avail, carried, starts.unsqueeze(0))
        from_zero, hidden_from_zero = agent.get_dist(
            agent.actor_input(obs), avail, zeros, torch.zeros(1, 4, dtype=torch.bool)
        )
    torch.testing.assert_close(dist.logits[0, starts], from_zero.logits[0, starts], atol=0, rtol=0)
    torch.testing.assert_close(hidden[0, starts], hidden_from_zero[0, starts], atol=0, rtol=0)
    assert (dist.logits[0, ~starts] - from_zero.logits[0, ~starts]).abs().max() > 1e-3  # carried where no start


def test_gru_init_is_orthogonal_with_zero_biases():
    net = m.RecurrentNet(18, 5, 0.01, m.Args())
    for name, param in net.gru.named_parameters():
        if "bias" in name:
            assert torch.all(param == 0)
        else:  # (3H, H): orthonormal columns
            torch.testing.assert_close(param.T @ param, torch.eye(64), atol=1e-5, rtol=0)
    assert [type(layer) for layer in net.trunk][-1] is torch.nn.LayerNorm and isinstance(net.norm, torch.nn.LayerNorm)


@pytest.mark.parametrize("env_id", SCENARIOS)
def test_shapes(env_id):
    spec = env_spec(env_id)
    n_agents = len(spec.agents)
    for state_type, critic_rows in [("EP", 1), ("AS", n_agents), ("local", n_agents)]:
        agent = m.Agent(spec, m.Args(env_id=env_id, state_type=state_type, separate_actors=state_type == "AS"))
        actor_hidden, critic_hidden = agent.initial_hidden(4)
        assert actor_hidden.shape == (4, n_agents, 64) and critic_hidden.shape == (4, critic_rows, 64)
        obs, state = torch.randn(6, 4, n_agents, spec.obs_dim), torch.randn(6, 4, spec.state_dim)
        starts = torch.zeros(6, 4, dtype=torch.bool)
        dist, hiddens = agent.get_dist(agent.actor_input(obs), all_actions(spec, obs), actor_hidden, starts)
        assert dist.logits.shape == (6, 4, n_agents, spec.action_dim) and hiddens.shape == (6, 4, n_agents, 64)
        values, critic_hiddens = agent.get_value(agent.critic_input(obs, state), critic_hidden, starts)
        assert values.shape == (6, 4, n_agents) and critic_hiddens.shape == (6, 4, critic_rows, 64)
        actions, logprobs, next_hidden = agent.act(obs[0], all_actions(spec, obs[0]), actor_hidden, starts[0])
        assert actions.shape == logprobs.shape == (4, n_agents) and next_hidden.shape == actor_hidden.shape


# ----------------------------------------------------------------------------------------------------
# Replaying a rollout reproduces acting
# ----------------------------------------------------------------------------------------------------


@torch.no_grad()
def collect(agent, envs, buffer, T: int, first_rollout: bool):
    """Acts for T steps as main() does; alongside, steps the critic one step at a time from its hidden state,
    which gives the reference values and final values (the values "computed while acting")."""
    if first_rollout:
        envs.reset()
    buffer.obs[0], buffer.state[0], buffer.alive[0], buffer.avail[0] = envs.observe()  # as main(): where the envs are
    actor_hidden, critic_hidden = buffer.actor_hidden, buffer.critic_hidden
    values, final_values, actor_hiddens = [], [], []
    one_step = lambda x: x.unsqueeze(0)
    for t in range(T):
        value, critic_next = agent.get_value(
            agent.critic_input(one_step(buffer.obs[t]), one_step(buffer.state[t])),
            critic_hidden,
            one_step(buffer.starts[t]),
        )
        critic_hidden = critic_next[0]
        values.append(value[0])
        actions, logprobs, actor_hidden = agent.act(buffer.obs[t], buffer.avail[t], actor_hidden, buffer.starts[t])
        actor_hiddens.append(actor_hidden)
        step = envs.step(actions)
        buffer.insert(t, actions, logprobs, step)
        no_start = torch.zeros(1, envs.n_envs, dtype=torch.bool)
        final = agent.get_value(
            agent.critic_input(one_step(buffer.final_obs[t]), one_step(buffer.final_state[t])), critic_hidden, no_start
        )
        final_values.append(final[0][0])
    value, _ = agent.get_value(
        agent.critic_input(one_step(buffer.obs[T]), one_step(buffer.state[T])),
        critic_hidden,
        one_step(buffer.starts[T]),
    )
    values.append(value[0])
    return torch.stack(values), torch.stack(final_values), actor_hidden


@pytest.mark.parametrize(
    "state_type,separate_actors,continuous", [("EP", False, False), ("AS", True, False), ("EP", True, True)]
)
def test_replay_reproduces_acting_across_episode_starts(state_type, separate_actors, continuous):
    """Episodes of 7 steps in rollouts of 20: episode starts fall inside the sequences, and the second rollout
    starts mid-episode from the hidden states the first one left."""
    torch.manual_seed(0)
    args = m.Args(
        max_cycles=7,
        state_type=state_type,
        separate_actors=separate_actors,
        continuous_actions=continuous,
        use_valuenorm=False,
    )
    T, n_envs = 20, 4
    env_scenario = scenario(max_cycles=7, continuous_actions=continuous)
    envs = m.BatchedMPE(m.get_env_spec("simple_spread_v3", env_scenario), n_envs, seed=0, device=CPU)
    agent, value_norm, _ = m.build_agent(envs.spec, args, CPU)
    randomize(agent)
    buffer = m.RolloutBuffer(T, n_envs, envs.spec, CPU, agent.initial_hidden(n_envs))
    for rollout in range(2):
        if rollout == 1:
            assert buffer.actor_hidden.abs().sum() > 0 and buffer.critic_hidden.abs().sum() > 0
            assert not buffer.starts[0].any()  # 20 is not a multiple of 7: mid-episode
        values, final_values, actor_hidden = collect(agent, envs, buffer, T, first_rollout=rollout == 0)
        start_times = [7, 14] if rollout == 0 else [1, 8, 15]  # global steps 7, 14, 21, 28, 35
        assert torch.nonzero(buffer.starts[1:].all(dim=1)).flatten().add(1).tolist() == start_times
        with torch.no_grad():
            dist, _ = agent.get_dist(
                agent.actor_input(buffer.obs[:-1]), buffer.avail[:-1], buffer.actor_hidden, buffer.starts[:-1]
            )
            torch.testing.assert_close(dist.log_prob(buffer.actions), buffer.logprobs, atol=1e-5, rtol=0)
            replayed, _ = agent.get_value(
                agent.critic_input(buffer.obs[:-1], buffer.state[:-1]), buffer.critic_hidden, buffer.starts[:-1]
            )
            torch.testing.assert_close(replayed, values[:-1], atol=1e-5, rtol=0)
        buffer.compute_values(agent, value_norm)
        torch.testing.assert_close(buffer.values, values, atol=1e-5, rtol=0)
        ended = buffer.truncated.all(dim=2)
        torch.testing.assert_close(buffer.final_values[ended], final_values[ended], atol=1e-5, rtol=0)
        buffer.start_next_rollout(actor_hidden)


def test_evaluation_and_video_reset_the_hidden_state_at_the_episode_start(monkeypatch):
    """Evaluation (its first env recording the video) acts from zero hidden states with `starts` set at the first
    step only (one episode per env), and carries the hidden state it is given back from one step to the next."""
    torch.manual_seed(0)
    spec = env_spec(max_cycles=4)
    agent = m.Agent(spec, m.Args(max_cycles=4))
    calls = []
    act = agent.act

    def spy(obs, avail, hidden, starts, deterministic=False):
        actions, logprobs, next_hidden = act(obs, avail, hidden, starts, deterministic)
        calls.append((hidden.clone(), starts.clone(), next_hidden.clone()))
        return actions, logprobs, next_hidden

    monkeypatch.setattr(agent, "act", spy)
    envs = m.PettingZooVecEnv(env_spec(max_cycles=4), 3, 0, CPU, render_first=True)
    returns, frames = m.evaluate(agent, envs, 0, m.Args(eval_max_steps=1000), None)
    assert len(calls) == 4 and returns.shape == (3, 3) and frames.shape[0] == 5  # 4 steps, and the first frame
    assert torch.all(calls[0][0] == 0) and calls[0][1].all() and calls[0][1].shape == (3,)
    for (_, _, given), (hidden, starts, _) in zip(calls[:-1], calls[1:]):
        assert not starts.any()
        torch.testing.assert_close(hidden, given, atol=0, rtol=0)


# ----------------------------------------------------------------------------------------------------
# Sequence minibatches
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_mini_batch", [1, 2, 4])
def test_every_stored_step_is_trained_once_per_epoch_in_whole_sequences(num_mini_batch, monkeypatch):
    torch.manual_seed(0)
    T, n_envs = 5, 4
    spec = env_spec()
    args = m.Args(ppo_epoch=2, num_mini_batch=num_mini_batch, n_rollout_threads=n_envs)
    agent, value_norm, optimizer = m.build_agent(spec, args, CPU)
    buffer = m.RolloutBuffer(T, n_envs, spec, CPU, agent.initial_hidden(n_envs))
    step_ids = torch.arange((T + 1) * n_envs, dtype=torch.float32).view(T + 1, n_envs)
    buffer.obs[..., 0] = step_ids.unsqueeze(-1)  # each stored step carries its id in its first feature
    buffer.actor_hidden = torch.randn(n_envs, 3, 64)
    seen = []
    get_dist = agent.get_dist

    def spy(x, avail, hidden, starts):  # x: the actors' input, the observation first
        seen.append((x[..., 0, 0].clone(), hidden.clone()))
        return get_dist(x, avail, hidden, starts)

    monkeypatch.setattr(agent, "get_dist", spy)
    m.ppo_update(agent, optimizer, value_norm, buffer, torch.randn(T, n_envs, 3), torch.randn(T, n_envs, 3), args)
    assert len(seen) == 2 * num_mini_batch
    for epoch in range(2):
        minibatches = seen[epoch * num_mini_batch : (epoch + 1) * num_mini_batch]
        ids = torch.cat([ids.flatten() for ids, _ in minibatches])
        assert sorted(ids.tolist()) == step_ids[:-1].flatten().tolist()  # every stored step once
        for ids, hidden in minibatches:
            assert ids.shape == (T, n_envs // num_mini_batch)  # whole sequences of whole envs
            envs_of_mb = (ids[0] % n_envs).long()
            torch.testing.assert_close(ids, step_ids[:-1, envs_of_mb])  # time order kept
            torch.testing.assert_close(hidden, buffer.actor_hidden[envs_of_mb])  # each from its own hidden state


def test_first_ppo_epoch_starts_on_policy():
    torch.manual_seed(0)
    T, n_envs = 6, 2
    spec = env_spec()
    args = m.Args(ppo_epoch=1, lr=0.0)
    agent, value_norm, optimizer = m.build_agent(spec, args, CPU)
    randomize(agent)
    buffer = m.RolloutBuffer(T, n_envs, spec, CPU, (torch.randn(n_envs, 3, 64), torch.randn(n_envs, 1, 64)))
    buffer.obs.normal_()
    buffer.avail[:] = random_masks(spec, buffer.obs)  # the update scores each action under the mask it had
    buffer.starts[3] = True
    with torch.no_grad():
        hidden = buffer.actor_hidden
        for t in range(T):
            buffer.actions[t], buffer.logprobs[t], hidden = agent.act(
                buffer.obs[t], buffer.avail[t], hidden, buffer.starts[t]
            )
    assert_no_unavailable_action(buffer)
    stats = m.ppo_update(
        agent, optimizer, value_norm, buffer, torch.randn(T, n_envs, 3), torch.randn(T, n_envs, 3), args
    )
    assert stats["ratio"] == pytest.approx(1.0, abs=1e-6)
    assert stats["clipfrac"] == 0.0 and stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert_the_value_clip_is_centred_on_the_values_acted_with(m, agent, value_norm, optimizer, buffer, args)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(num_mini_batch=3), "--num-mini-batch 3 does not divide --n-rollout-threads 4"),
        (dict(env_id="simple_reference_v3", sort_entities=True), "applies to simple_spread_v3 only"),
    ],
)
def test_impossible_settings_are_rejected(overrides, message):
    args = m.Args(total_timesteps=200, n_rollout_threads=4, **overrides)
    with pytest.raises(SystemExit, match=message):
        m.check_args(args)


def test_partial_observability_gives_smaller_observations():
    spec = m.get_env_spec("mpe2.simple_spread_v3", {"num_agent_neighbors": 1, "num_landmark_neighbors": 1})
    assert (spec.obs_dim, spec.state_dim) == (10, 30)
    agent = m.Agent(spec, m.Args(env_id="mpe2.simple_spread_v3"))
    obs = torch.randn(2, 3, 10)
    actions, _, _ = agent.act(obs, all_actions(spec, obs), agent.initial_hidden(2)[0], torch.ones(2, dtype=torch.bool))
    assert actions.shape == (2, 3)


# ----------------------------------------------------------------------------------------------------
# The script end to end
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env_id,continuous", [(env_id, False) for env_id in SCENARIOS] + [("simple_speaker_listener_v4", True)]
)
def test_script_end_to_end(tmp_path, run_script, env_id, continuous):
    flags = ["--env-id", env_id, *TINY] + (["--continuous-actions"] if continuous else [])
    if env_id == "simple_speaker_listener_v4":
        flags += ["--separate-actors", "--state-type", "AS", "--num-mini-batch", "2", "--episode-length", "10"]
    result = run_script(tmp_path, *flags)
    assert "step       200/200" in result.stdout
    runs = os.listdir(tmp_path / "runs")
    assert len(runs) == 1 and runs[0].startswith(f"{env_id}__mappo_mpe_rnn__1__")


@pytest.mark.parametrize("env", ["dying_discrete", "multiwalker", "kaz"])
def test_generic_env_end_to_end(tmp_path, run_script, env):
    result = run_script(tmp_path, *GENERIC_ENVS[env], *TINY)
    assert "step       200/200" in result.stdout


def test_one_agent_trains(tmp_path, run_script):
    """Spread with a single agent: no teammate to observe or collide with."""
    result = run_script(tmp_path, "--n-agents", "1", "--preset", "tuned", *TINY)
    assert "step       200/200" in result.stdout


def test_the_envs_action_masks_are_obeyed(tmp_path, run_script):
    assert_action_masks_are_obeyed(run_script, tmp_path)


def test_save_model_then_test_mode_with_video(tmp_path, run_script):
    partial = ["--env-kwargs", "num_agent_neighbors", "1", "num_landmark_neighbors", "2"]
    save_then_test_mode(run_script, tmp_path, "--env-id", "mpe2.simple_spread_v3", *partial)


def test_continuous_actions_save_model_then_test_mode_with_video(tmp_path, run_script):
    save_then_test_mode(run_script, tmp_path, "--continuous-actions")


def test_ctrl_c_ends_the_run_with_one_line(tmp_path, stop_script):
    assert_stops_cleanly(stop_script, tmp_path)


def test_evaluations_of_a_continuing_task_end(tmp_path, stop_script, run_script):
    assert_evaluations_of_a_continuing_task_end(stop_script, run_script, tmp_path)


def test_resume_goes_on_exactly_as_an_uninterrupted_run(tmp_path, run_script):
    assert_resume_is_exact(run_script, tmp_path)


def test_sigterm_leaves_a_checkpoint_that_resumes(tmp_path, stop_script, run_script):
    assert_sigterm_checkpoint_resumes(stop_script, run_script, tmp_path)


def test_a_fault_of_the_users_env_keeps_the_last_update_and_resumes(tmp_path, run_script):
    assert_an_env_fault_keeps_the_last_update(run_script, tmp_path)


def test_bad_resumes_are_refused_in_one_line(tmp_path, run_script):
    assert_bad_resumes_are_refused(run_script, tmp_path, m)


def test_script_reports_bad_input_in_one_line(tmp_path, run_script):
    for flags, message in [
        (["--num-mini-batch", "3", *TINY], "does not divide --n-rollout-threads 4"),
        (["--env-id", "simple_reference_v3", "--sort-entities", *TINY], "simple_spread_v3 only"),
    ]:
        assert_one_line_error(run_script(tmp_path, *flags, check=False), message)


@pytest.mark.parametrize("n_agents", [2, 6, 10])
def test_nearest_k_gives_the_actor_one_input_size_at_any_team_size(n_agents):
    """With --nearest-k 3 (and no agent id) the recurrent actor reads 18 numbers per agent at every N: the sorted
    observation's kept columns, zeros where a team of 2 has fewer."""
    spec = env_spec(n_agents=n_agents)
    agent = m.Agent(spec, m.Args(n_agents=n_agents, nearest_k=3, use_agent_id=False))
    obs = torch.randn(4, n_agents, spec.obs_dim)
    padded = torch.nn.functional.pad(m.sort_entities(obs, spec.entities), (0, 1))
    torch.testing.assert_close(agent.actor_input(obs), padded[..., NEAREST_3_COLUMNS[n_agents]], rtol=0, atol=0)
    assert agent.actor_input(obs).shape[-1] == 18


def test_a_resume_after_a_fault_in_the_final_evaluation_finishes_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_a_resume_finishes_the_final_evaluation(m, tmp_path)
