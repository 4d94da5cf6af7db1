"""Tests for mappo_mpe.py: pieces imported from the script, then whole runs of it on a tiny budget."""

import dataclasses
import importlib
import os
import sys
import time
import typing
from types import SimpleNamespace

import gymnasium
import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SCRIPT = "mappo_mpe.py"  # run end to end by the run_script fixture (conftest.py)

from conftest import (  # noqa: E402
    FAULT_FLAGS,
    GENERIC_ENVS,
    KAZ,
    MASKED_ENV,
    STOP_FLAGS,
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
    logged_scalars,
    random_masks,
    save_then_test_mode,
)

import mappo_mpe as m  # noqa: E402

CPU = torch.device("cpu")

SCENARIOS = {
    # env_id: (agents, obs dims, action dims, state dim)
    "simple_spread_v3": (["agent_0", "agent_1", "agent_2"], [18, 18, 18], [5, 5, 5], 54),
    "simple_reference_v3": (["agent_0", "agent_1"], [21, 21], [50, 50], 42),
    "simple_speaker_listener_v4": (["speaker_0", "listener_0"], [3, 11], [3, 5], 14),
}
CONTINUOUS_ACTION_DIMS = {  # Box(0, 1) sizes: 5 for moving (no-op, -x, +x, -y, +y), plus one per message slot
    "simple_spread_v3": [5, 5, 5],
    "simple_reference_v3": [15, 15],
    "simple_speaker_listener_v4": [3, 5],
}


def scenario(env_id: str = "simple_spread_v3", **args) -> dict:
    """The mpe2 keyword arguments the script derives from its Args."""
    return m.scenario_kwargs(m.Args(env_id=env_id, **args))


def env_spec(env_id: str = "simple_spread_v3", **args) -> m.EnvSpec:
    return m.get_env_spec(env_id, scenario(env_id, **args))


def tiny_args(**overrides) -> m.Args:
    defaults = dict(
        total_timesteps=200,
        n_rollout_threads=4,
        n_eval_episodes=2,
        eval_interval=100,
        log_interval=100,
        ppo_epoch=2,
    )
    return m.Args(**{**defaults, **overrides})


# ----------------------------------------------------------------------------------------------------
# Vectorized environments
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("env_id", SCENARIOS)
def test_env_spec(env_id, continuous):
    agents, obs_dims, action_dims, state_dim = SCENARIOS[env_id]
    if continuous:
        action_dims = CONTINUOUS_ACTION_DIMS[env_id]
    spec = env_spec(env_id, continuous_actions=continuous)
    assert spec.agents == agents and spec.continuous == continuous
    assert spec.obs_dim == max(obs_dims) and spec.action_dim == max(action_dims) and spec.state_dim == state_dim
    expected_mask = np.array([[a < n for a in range(max(action_dims))] for n in action_dims])
    np.testing.assert_array_equal(spec.avail_actions, expected_mask)


@pytest.mark.parametrize("agent_neighbors,landmark_neighbors,obs_dim", [(1, 1, 10), (2, 1, 14), (1, 3, 14)])
def test_partial_observability_sizes(agent_neighbors, landmark_neighbors, obs_dim):
    """mpe2's partially observed spread, on mpe2 itself through the generic path: velocity and position (4), 2 per
    observed landmark, 2 + 2 (position, message) per observed agent; the state joins the agents' observations."""
    partial = dict(num_agent_neighbors=agent_neighbors, num_landmark_neighbors=landmark_neighbors)
    envs = m.PettingZooVecEnv(m.get_env_spec("mpe2.simple_spread_v3", partial), 2, 0, CPU)
    assert envs.spec.obs_dim == 4 + 2 * landmark_neighbors + 4 * agent_neighbors == obs_dim
    assert envs.spec.state_dim == 3 * obs_dim and envs.spec.has_state
    envs.reset()
    obs, state, *_ = envs.observe()
    assert obs.shape == (2, 3, obs_dim) and state.shape == (2, 3 * obs_dim)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(env_id="simple_reference_v3", sort_entities=True), "applies to simple_spread_v3 only"),
        (dict(env_id="simple_speaker_listener_v4", sort_entities=True), "applies to simple_spread_v3 only"),
        (dict(env_id="mpe2.simple_spread_v3", sort_entities=True), "applies to simple_spread_v3 only"),
    ],
)
def test_spread_only_flags_are_checked(overrides, message):
    with pytest.raises(SystemExit, match=message):
        m.check_args(tiny_args(**overrides))


@pytest.mark.parametrize("n_agents", [1, 3, 6])
def test_sorted_entities_are_mpe2_nearest_first_observation(n_agents):
    """mpe2 itself lists the nearest K landmarks and agents nearest first when asked for K neighbours: with K = all,
    its observation is exactly `sort_entities` of its standard one, in the same worlds, step after step."""
    spec = env_spec(n_agents=n_agents)
    everyone = dict(num_landmark_neighbors=n_agents, num_agent_neighbors=(n_agents - 1) or None)
    plain = m.make_env("simple_spread_v3", scenario(n_agents=n_agents))
    nearest_first = m.make_env("simple_spread_v3", scenario(n_agents=n_agents) | everyone)
    observations = [plain.reset(seed=7)[0], nearest_first.reset(seed=7)[0]]
    rng = np.random.default_rng(0)
    for _ in range(10):
        for agent in spec.agents:
            torch.testing.assert_close(
                m.sort_entities(torch.as_tensor(observations[0][agent]), spec.entities),
                torch.as_tensor(observations[1][agent]),
                rtol=0,
                atol=0,
            )
        actions = {agent: int(rng.integers(5)) for agent in spec.agents}
        observations = [plain.step(actions)[0], nearest_first.step(actions)[0]]


@pytest.mark.parametrize("state_type", ["EP", "AS"])
def test_sorted_networks_do_not_see_the_order_of_landmarks_and_agents(state_type):
    """With --sort-entities, shuffling the landmark blocks, or the other agents' blocks (position and message
    together), of the observations leaves the actor's output exactly as it was, and the critic's too when the
    state (mpe2's: the observations joined) is shuffled with them."""
    spec = env_spec(n_agents=5)
    agent = m.Agent(spec, m.Args(n_agents=5, sort_entities=True, state_type=state_type))
    obs = torch.randn(16, 5, spec.obs_dim)
    avail = all_actions(spec, obs)
    landmarks = obs[..., 4:14].unflatten(-1, (5, 2))
    others, messages = obs[..., 14:22].unflatten(-1, (4, 2)), obs[..., 22:30].unflatten(-1, (4, 2))
    landmark_order, agent_order = torch.randperm(5), torch.randperm(4)
    shuffled = obs.clone()
    shuffled[..., 4:14] = landmarks[..., landmark_order, :].flatten(-2)
    shuffled[..., 14:22] = others[..., agent_order, :].flatten(-2)
    shuffled[..., 22:30] = messages[..., agent_order, :].flatten(-2)
    assert not torch.equal(shuffled, obs)
    torch.testing.assert_close(
        agent.get_dist(agent.actor_input(shuffled), avail).logits,
        agent.get_dist(agent.actor_input(obs), avail).logits,
        rtol=0,
        atol=0,
    )
    values = agent.get_value(agent.critic_input(shuffled, shuffled.flatten(1)))
    torch.testing.assert_close(values, agent.get_value(agent.critic_input(obs, obs.flatten(1))), rtol=0, atol=0)
    unsorted = m.Agent(spec, m.Args(n_agents=5))
    assert not torch.allclose(
        unsorted.get_dist(unsorted.actor_input(shuffled), avail).logits,
        unsorted.get_dist(unsorted.actor_input(obs), avail).logits,
    )


def test_nearest_k_keeps_the_nearest_of_each_kind_and_pads_a_smaller_team():
    """N = 6 (obs: velocity, position 0-3, landmarks 4-15, other agents 16-25, their messages 26-35), K = 3: the 3
    nearest landmarks' and the 2 nearest agents' blocks; at N = 2 the missing landmark and agent blocks point at the
    zero column padded on (12), and read zeros; K = N keeps every column in order. An actor of K = 3 has one input
    size at N = 2, 6 and 10."""
    six = m.nearest_columns(env_spec(n_agents=6), 3).tolist()
    assert six == [0, 1, 2, 3, *range(4, 10), *range(16, 20), *range(26, 30)]
    two = [0, 1, 2, 3, 4, 5, 6, 7, 12, 12, 8, 9, 12, 12, 10, 11, 12, 12]
    assert m.nearest_columns(env_spec(n_agents=2), 3).tolist() == two
    assert m.nearest_columns(env_spec(n_agents=6), 6).tolist() == list(range(36))
    args = dict(nearest_k=3, use_agent_id=False, sort_entities=True)
    sizes = {
        n: m.Agent(env_spec(n_agents=n), m.Args(n_agents=n, **args)).actors[0][0][1].in_features for n in (2, 6, 10)
    }
    assert sizes == {2: 4 + 6 * 3 - 4, 6: 18, 10: 18}
    padded = m.Agent(env_spec(n_agents=2), m.Args(n_agents=2, **args)).actor_input(torch.ones(1, 2, 12))
    assert padded[0, 0].tolist() == [1.0] * 8 + [0.0] * 2 + [1.0] * 2 + [0.0] * 2 + [1.0] * 2 + [0.0] * 2
    obs = torch.randn(8, 6, 36)
    agent = m.Agent(env_spec(n_agents=6), m.Args(n_agents=6, **args))
    sorted_obs = m.sort_entities(obs, agent.entities)
    torch.testing.assert_close(agent.actor_input(obs), sorted_obs[..., six], rtol=0, atol=0)


def test_a_nearest_k_policy_plays_another_team_size_in_test_mode(tmp_path, run_script):
    """Trained at N = 4 with --nearest-k 2, evaluated at N = 6 on mpe2: six agents' returns; a checkpoint without
    --nearest-k, and --eval-n-agents outside test mode, are one error line each."""
    flags = [*TINY, "--n-agents", "4", "--nearest-k", "2", "--no-use-agent-id", "--sort-entities", "--save-model"]
    run_script(tmp_path, *flags)
    (run_name,) = os.listdir(tmp_path / "runs")
    model = f"runs/{run_name}/model.pt"
    result = run_script(tmp_path, "--eval-checkpoint", model, "--eval-n-agents", "6", "--n-eval-episodes", "2")
    assert "over 2 episodes; agent_0 " in result.stdout and "agent_5 " in result.stdout
    unloaded = eval(result.stdout.split("loaded all but ")[1].split(" (their size")[0])  # a list of names
    assert unloaded and all(name.startswith("critic.") or name == "agent_ids" for name in unloaded)  # N's state, ids
    at_four = run_script(tmp_path, "--eval-checkpoint", model, "--eval-n-agents", "4", "--n-eval-episodes", "2")
    played = run_script(tmp_path, "--eval-checkpoint", model, "--n-eval-episodes", "2")  # the trained model, whole
    assert "loaded all but []" in at_four.stdout and at_four.stdout.splitlines()[-1] == played.stdout.splitlines()[-1]
    assert_one_line_error(run_script(tmp_path, *TINY, "--eval-n-agents", "6", check=False), "is for test mode")
    assert_one_line_error(run_script(tmp_path, *TINY, "--nearest-k", "2", check=False), "--no-use-agent-id")


# ----------------------------------------------------------------------------------------------------
# Networks and masking
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state_type,critic_features", [("EP", 54), ("FP", 54 + 3), ("AS", 54 + 18 + 3), ("local", 18 + 3)]
)
def test_critic_input_and_value_shapes(state_type, critic_features):
    spec = env_spec()
    agent = m.Agent(spec, m.Args(state_type=state_type))
    obs, state = torch.randn(5, 3, 18), torch.randn(5, 54)
    x = agent.critic_input(obs, state)
    assert x.shape == ((5, 1, critic_features) if state_type == "EP" else (5, 3, critic_features))
    if state_type in ("AS", "local"):  # AS: the state, then what local takes: the agent's own observation and id
        torch.testing.assert_close(x[:, 1, -21:-3], obs[:, 1])
        torch.testing.assert_close(x[:, 1, -3:], torch.tensor([0.0, 1.0, 0.0]).expand(5, 3))
    assert agent.get_value(agent.critic_input(obs, state)).shape == (5, 3)


def test_without_a_state_the_critic_and_the_memory_estimate_take_each_agents_observation_whatever_the_flag():
    spec = env_spec()._replace(state_dim=0, has_state=False)  # as probe_env leaves an env whose joined obs do not fit
    assert len({m.memory_estimate(spec, m.Args(state_type=t)) for t in ("EP", "FP", "AS", "local")}) == 1
    agent = m.Agent(spec, m.Args(state_type="EP"))
    obs = torch.randn(5, 3, 18)
    assert agent.state_type == "local" and agent.critic_input(obs, torch.zeros(5, 0)).shape == (5, 3, 18 + 3)
    assert agent.get_value(agent.critic_input(obs, torch.zeros(5, 0))).shape == (5, 3)


@pytest.mark.parametrize(
    "activation, act_type, gain", [("tanh", torch.nn.Tanh, 5 / 3), ("relu", torch.nn.ReLU, 2**0.5)]
)
def test_mlp_activation_and_orthogonal_init_gains(activation, act_type, gain):
    trunk, out_layer = m.mlp_net(18, 5, 0.01, m.Args(activation=activation))
    nn = torch.nn
    layers = [*trunk, out_layer]
    assert [type(layer) for layer in layers] == [
        nn.LayerNorm,
        nn.Linear,
        act_type,
        nn.LayerNorm,
        nn.Linear,
        act_type,
        nn.LayerNorm,
        nn.Linear,
    ]
    # weights (64, 18), (64, 64), (5, 64): orthogonal rows or columns, scaled by the layer's gain
    first, hidden, out = (layer.weight.detach() for layer in layers if isinstance(layer, nn.Linear))
    torch.testing.assert_close(first.T @ first, gain**2 * torch.eye(18), atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden @ hidden.T, gain**2 * torch.eye(64), atol=1e-5, rtol=0)
    torch.testing.assert_close(out @ out.T, 0.01**2 * torch.eye(5), atol=1e-7, rtol=0)


def test_separate_actors_have_their_own_parameters():
    spec = env_spec("simple_speaker_listener_v4")
    shared, separate = m.Agent(spec, m.Args(separate_actors=False)), m.Agent(spec, m.Args(separate_actors=True))
    assert len(shared.actors) == 1 and len(separate.actors) == 2
    obs = torch.randn(4, 2, 11)
    avail = all_actions(spec, obs)
    assert separate.get_dist(separate.actor_input(obs), avail).logits.shape == (4, 2, 5)
    with torch.no_grad():  # changing the listener's actor leaves the speaker's logits alone
        before = separate.get_dist(separate.actor_input(obs), avail).logits.clone()
        separate.actors[1][-1].bias[0] += 1.0
        after = separate.get_dist(separate.actor_input(obs), avail).logits
    torch.testing.assert_close(after[:, 0], before[:, 0])
    assert not torch.allclose(after[:, 1, :5], before[:, 1, :5])


def test_masked_actions_are_never_sampled():
    spec = env_spec("simple_speaker_listener_v4")
    torch.manual_seed(0)
    agent = m.Agent(spec, m.Args(separate_actors=True))
    with torch.no_grad():  # make the unavailable speaker actions the most attractive ones
        agent.actors[0][-1].bias.copy_(torch.tensor([0.0, 0.0, 0.0, 50.0, 50.0]))
        obs = torch.randn(4096, 2, 11)
        avail = all_actions(spec, obs)
        actions, logprobs = agent.act(obs, avail)
        greedy, _ = agent.act(obs, avail, deterministic=True)
        dist = agent.get_dist(agent.actor_input(obs), avail)
    assert actions[:, 0].max() <= 2 and greedy[:, 0].max() <= 2
    assert set(actions[:, 1].tolist()) == {0, 1, 2, 3, 4}  # the listener keeps all of its actions
    assert torch.isfinite(logprobs).all() and torch.isfinite(dist.entropy()).all()
    assert torch.all(dist.probs[:, 0, 3:] == 0)
    torch.testing.assert_close(greedy, dist.probs.argmax(-1))


def test_discrete_actions_are_a_softmax_over_the_available_ones():
    """Agent 0 has 3 of 5 actions: its probabilities are the softmax of those 3 logits alone (the other two get
    none, even with the largest logits), its entropy is theirs and its greedy action the best available one;
    agent 1, with all 5, gets the plain softmax."""
    avail = torch.tensor([[True, True, True, False, False], [True] * 5])
    logits = torch.randn(64, 2, 5)
    logits[:, 0, 3:] += 10.0  # unavailable actions with the largest logits
    dist = m.action_distribution(logits, avail, None)
    own = torch.softmax(logits[:, 0, :3], dim=-1)
    torch.testing.assert_close(dist.probs[:, 0, :3], own, atol=1e-6, rtol=0)
    assert (dist.probs[:, 0, 3:] == 0).all() and (dist.mode[:, 0] == own.argmax(-1)).all()
    torch.testing.assert_close(dist.entropy()[:, 0], -(own * own.log()).sum(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(dist.probs[:, 1], torch.softmax(logits[:, 1], dim=-1), atol=1e-6, rtol=0)


def censored_log_prob(mean: torch.Tensor, std: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Reference, per dimension in float64: the Gaussian's density inside (0, 1), its mass below 0 for an action at
    0 and its mass above 1 for an action at 1."""
    normal = torch.distributions.Normal(mean.double(), std.double())
    at_0, at_1 = normal.cdf(torch.zeros(())).log(), (1 - normal.cdf(torch.ones(()))).log()
    return torch.where(actions == 0, at_0, torch.where(actions == 1, at_1, normal.log_prob(actions.double())))


def test_gaussian_padded_dimensions_change_nothing():
    """Speaker (3 dims) and listener (5): the speaker's 2 padded dims are zero in samples and in the mode, and add
    nothing to log-probabilities or entropies, which equal per-agent clipped Gaussians over the real dims alone."""
    spec = env_spec("simple_speaker_listener_v4", continuous_actions=True)
    torch.manual_seed(0)
    agent = m.Agent(spec, m.Args(separate_actors=True))
    with torch.no_grad():
        agent.actor_std_logit.copy_(torch.randn(2, 5))
        obs = torch.randn(512, 2, 11)
        avail = all_actions(spec, obs)
        dist = agent.get_dist(agent.actor_input(obs), avail)
        actions, logprobs = agent.act(obs, avail)
        greedy, _ = agent.act(obs, avail, deterministic=True)
        padded = actions.clone()
        padded[:, 0, 3:] = torch.randn(512, 2) * 5
        entropy = dist.entropy()
    assert actions.shape == (512, 2, 5) and torch.all(actions[:, 0, 3:] == 0) and torch.all(greedy[:, 0, 3:] == 0)
    torch.testing.assert_close(dist.log_prob(padded), logprobs, atol=0, rtol=0)
    std = torch.sigmoid(agent.actor_std_logit)
    for i, d in enumerate([3, 5]):
        reference = censored_log_prob(dist.mean[:, i, :d], std[i, :d], actions[:, i, :d]).sum(-1).float()
        torch.testing.assert_close(logprobs[:, i], reference, atol=1e-5, rtol=0)
        own_entropy = torch.distributions.Normal(dist.mean[:, i, :d], std[i, :d]).entropy().sum(-1)
        torch.testing.assert_close(entropy[:, i], own_entropy, atol=1e-5, rtol=0)


def test_continuous_policy_starts_in_the_middle_of_the_box():
    spec = env_spec(continuous_actions=True)
    agent = m.Agent(spec, m.Args())
    with torch.no_grad():
        obs = torch.randn(256, 3, 18)
        dist = agent.get_dist(agent.actor_input(obs), all_actions(spec, obs))
    assert (dist.mean - 0.5).abs().max() < 0.1 and torch.all(dist.stddev == torch.sigmoid(torch.tensor(2.0)))
    assert agent.actor_std_logit.shape == (1, 5)  # shared actor: one std per action dimension


def test_gaussian_is_clipped_into_the_box_and_scored_as_censored():
    """Samples and the greedy action lie in [0, 1]; an action on a face has the log of the Gaussian's mass beyond
    it, and samples land on each face as often as that mass says. A mean far beyond a face acts there without
    noise and gets (almost) no gradient, so nothing pushes it further out."""
    out = torch.tensor([[-3.0, -0.4, 0.0, 0.3, 3.0]], requires_grad=True)
    std_logit = torch.tensor([0.0, 1.0, 2.0, -1.0, 0.5])
    dist = m.action_distribution(out, torch.ones(1, 5, dtype=torch.bool), std_logit)
    torch.testing.assert_close(dist.mean, out + 0.5, atol=0, rtol=0)
    torch.testing.assert_close(dist.mode, torch.tensor([[0.0, 0.1, 0.5, 0.8, 1.0]]), atol=1e-6, rtol=0)
    torch.manual_seed(0)
    samples = m.action_distribution(out.expand(200_000, 5), torch.ones(1, 5, dtype=torch.bool), std_logit).sample()
    assert samples.min() == 0 and samples.max() == 1
    for actions in (torch.tensor([[0.0, 0.0, 0.3, 1.0, 1.0]]), torch.tensor([[0.2, 1.0, 0.0, 0.9, 0.5]])):
        reference = censored_log_prob(dist.mean, torch.sigmoid(std_logit), actions).sum(-1).float()
        torch.testing.assert_close(dist.log_prob(actions), reference, atol=1e-5, rtol=0)
    at_face = torch.where(dist.mean < 0.5, samples == 0, samples == 1).float().mean(0)
    face_mass = censored_log_prob(dist.mean, torch.sigmoid(std_logit), (dist.mean >= 0.5).float()).exp().float()
    torch.testing.assert_close(at_face, face_mass[0].detach(), atol=3e-3, rtol=0)
    dist.log_prob(torch.tensor([[0.0, 0.0, 0.0, 1.0, 1.0]])).backward()
    assert abs(out.grad[0, 0]) < 1e-3 and abs(out.grad[0, 4]) < 1e-3 and abs(out.grad[0, 1]) > 0.1


# ----------------------------------------------------------------------------------------------------
# ValueNorm, GAE and the PPO losses
# ----------------------------------------------------------------------------------------------------


def test_value_norm_round_trip_and_debiasing():
    norm = m.ValueNorm()
    x = torch.tensor([[-30.0, -10.0], [-20.0, 0.0]])
    norm.update(x)
    mean, var = norm.mean_var()
    # after one update the debiased statistics are exactly the batch's (despite beta = 0.99999)
    torch.testing.assert_close(mean, x.mean())
    torch.testing.assert_close(var, x.var(unbiased=False))
    torch.testing.assert_close(norm.normalize(x).mean(), torch.tensor(0.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(norm.denormalize(norm.normalize(x)), x)
    norm.update(torch.full((2, 2), 5.0))  # equal weight for the second batch, since beta ~ 1
    torch.testing.assert_close(norm.mean_var()[0], torch.tensor((-15.0 + 5.0) / 2), rtol=1e-4, atol=1e-4)
    small = m.ValueNorm()
    small.update(torch.ones(3))
    torch.testing.assert_close(small.mean_var()[1], torch.tensor(1e-2))  # variance floor


def test_value_norm_ends_each_update_where_the_official_per_minibatch_schedule_ends():
    """The official codes update ValueNorm before every minibatch of every epoch with that minibatch's returns (10
    epochs of 4 minibatches here); one update with the decay to the power 40 ends each of 50 updates where they end, to
    float32's rounding, though the returns drift far from where they began. One plain update would not."""
    torch.manual_seed(0)
    ours, official, once = m.ValueNorm(), m.ValueNorm(), m.ValueNorm()
    for update in range(50):
        returns = torch.randn(800) * (1 + update) - 3 * update
        ours.update(returns, steps=40)
        once.update(returns)
        for _ in range(10):
            for minibatch in torch.randperm(800).split(200):
                official.update(returns[minibatch])
        for statistic, expected in zip(ours.mean_var(), official.mean_var()):
            torch.testing.assert_close(statistic, expected, rtol=1e-4, atol=0)
    assert not torch.allclose(once.mean_var()[0], official.mean_var()[0], rtol=1e-3)  # its old returns weigh more


def reference_gae(rewards, values, final_values, terminated, truncated, gamma, lam):
    """Plain per-element loop, written independently of the vectorized version."""
    T, n = rewards.shape
    advantages = np.zeros((T, n))
    for i in range(n):
        gae = 0.0
        for t in reversed(range(T)):
            if terminated[t, i]:
                delta, gae = rewards[t, i] - values[t, i], 0.0
            elif truncated[t, i]:
                delta, gae = rewards[t, i] + gamma * final_values[t, i] - values[t, i], 0.0
            else:
                delta = rewards[t, i] + gamma * values[t + 1, i] - values[t, i]
            gae = delta + gamma * lam * gae
            advantages[t, i] = gae
    return advantages, advantages + values[:-1]


def test_gae_matches_reference_loop_with_truncation_and_termination():
    rng = np.random.default_rng(0)
    T, n = 12, 4
    rewards, values, final_values = rng.normal(size=(T, n)), rng.normal(size=(T + 1, n)), rng.normal(size=(T, n))
    terminated, truncated = np.zeros((T, n), bool), np.zeros((T, n), bool)
    truncated[4, 0] = truncated[11, 1] = truncated[2, 2] = True
    terminated[6, 0] = terminated[11, 2] = terminated[8, 3] = True
    rollout = dict(
        rewards=rewards, values=values, final_values=final_values, terminated=terminated, truncated=truncated
    )
    buffer = SimpleNamespace(**{k: torch.as_tensor(x) for k, x in rollout.items()})
    adv, ret = m.compute_gae(buffer, 0.99, 0.95, team_reward=False)  # each column an agent of its own
    ref_adv, ref_ret = reference_gae(rewards, values, final_values, terminated, truncated, 0.99, 0.95)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-12)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=1e-12)
    # a truncated step bootstraps from its final observation's value, a terminated one from nothing
    np.testing.assert_allclose(adv[4, 0].item(), rewards[4, 0] + 0.99 * final_values[4, 0] - values[4, 0])
    np.testing.assert_allclose(adv[8, 3].item(), rewards[8, 3] - values[8, 3])


@pytest.mark.parametrize("team_reward", [True, False])
def test_gae_credits_an_agent_with_the_teams_rewards_after_its_death(team_reward):
    """gamma 0.5, lambda 1 (returns are discounted sums), two envs of two agents sharing the team's rewards 1, 2, 3, 4.
    Env 0: agent 0 dies at step 1, agent 1 is truncated at step 3 (final values 2 and 4). Env 1: agent 0 dies at
    step 0, agent 1 at step 2, which ends the episode (no bootstrap); the next one is truncated at step 3. With the team
    reward a dead agent's returns run on with the team's to the episode's end; without, they end where it died. An
    agent both terminated and truncated is terminated."""
    T, n_envs, n_agents = 4, 2, 2
    terminated, truncated = (
        torch.zeros(T, n_envs, n_agents, dtype=torch.bool),
        torch.zeros(T, n_envs, n_agents, dtype=torch.bool),
    )
    terminated[1:, 0, 0] = terminated[0:3, 1, 0] = terminated[2, 1, 1] = True  # a dead agent stays terminated
    truncated[3, 0, 1] = truncated[3, 1] = True
    rollout = SimpleNamespace(
        rewards=torch.tensor([1.0, 2.0, 3.0, 4.0])[:, None, None].expand(T, n_envs, n_agents),
        values=torch.rand(T + 1, n_envs, n_agents),
        final_values=torch.zeros(T, n_envs, n_agents).index_put_((torch.tensor([3]),), torch.tensor([2.0, 4.0])),
        terminated=terminated,
        truncated=truncated,
    )
    _, returns = m.compute_gae(rollout, 0.5, 1.0, team_reward)
    if team_reward:
        expected = [  # (T, n_envs, n_agents): each agent's discounted team return to its env's episode end
            [[3.375, 3.5], [2.75, 2.75]],
            [[4.75, 5.0], [3.5, 3.5]],
            [[5.5, 6.0], [3.0, 3.0]],
            [[5.0, 6.0], [5.0, 6.0]],
        ]
    else:  # agent 0 ends at its death: env 0 at step 1, env 1 at step 0, then every step ends (it stays dead)
        expected = [
            [[2.0, 3.5], [1.0, 2.75]],
            [[2.0, 5.0], [2.0, 3.5]],
            [[3.0, 6.0], [3.0, 3.0]],
            [[4.0, 6.0], [5.0, 6.0]],
        ]
    torch.testing.assert_close(returns, torch.tensor(expected), atol=1e-6, rtol=0)
    # every agent terminated and truncated at once: terminated wins, as in gymnasium (no bootstrap from 50)
    both = torch.ones(1, 1, 2, dtype=torch.bool)
    rollout = SimpleNamespace(rewards=torch.ones(1, 1, 2), values=torch.zeros(2, 1, 2), terminated=both, truncated=both)
    rollout.final_values = torch.full((1, 1, 2), 50.0)
    assert torch.equal(m.compute_gae(rollout, 0.5, 1.0, team_reward)[1], torch.ones(1, 1, 2))


def test_policy_loss_on_hand_made_batch():
    logprob = torch.log(torch.tensor([[0.2, 0.5], [0.9, 0.1]]))
    advantages = torch.tensor([[1.0, -2.0], [0.5, 3.0]])
    alive = torch.ones(2, 2, dtype=torch.bool)
    loss, stats = m.policy_loss_fn(logprob, logprob.clone(), advantages, alive, clip=0.2)
    assert stats["ratio"].item() == 1.0 and stats["clipfrac"].item() == 0.0 and stats["approx_kl"].item() == 0.0
    torch.testing.assert_close(loss, -advantages.mean())
    # ratio 2 with a positive advantage is clipped at 1.2; ratio 0.5 with a negative one at 0.8
    new = logprob + torch.log(torch.tensor([[2.0, 0.5], [1.0, 1.0]]))
    loss, stats = m.policy_loss_fn(new, logprob, advantages, alive, clip=0.2)
    torch.testing.assert_close(loss, -torch.tensor([1.2 * 1.0, 0.8 * -2.0, 0.5, 3.0]).mean())
    assert stats["clipfrac"].item() == 0.5
    # an agent who has left the episode adds nothing: the loss and stats are those of the others alone
    alive[0, 0] = False
    loss, stats = m.policy_loss_fn(new, logprob, advantages, alive, clip=0.2)
    torch.testing.assert_close(loss, -torch.tensor([0.8 * -2.0, 0.5, 3.0]).mean())
    assert stats["clipfrac"].item() == pytest.approx(1 / 3) and stats["ratio"].item() == pytest.approx(2.5 / 3)


def test_value_loss_huber_and_clipping():
    returns = torch.tensor([0.0, 0.0, 0.0])
    old = torch.tensor([0.0, 0.0, 1.0])
    values = torch.tensor([0.1, 20.0, 0.5])
    alive = torch.ones(3, dtype=torch.bool)
    plain = m.value_loss_fn(values, old, returns, alive, m.Args(clipped_value_loss=False))
    expected = [0.5 * 0.1**2, 10.0 * (20.0 - 5.0), 0.5 * 0.5**2]  # quadratic below delta, linear above
    torch.testing.assert_close(plain, torch.tensor(expected).mean())
    clipped = m.value_loss_fn(values, old, returns, alive, m.Args())  # clip 0.2, huber_delta 10
    # clipped predictions 0.1, 0.2, 0.8: the max keeps the larger loss of each element
    expected_clipped = [0.5 * 0.1**2, 10.0 * (20.0 - 5.0), 0.5 * 0.8**2]
    torch.testing.assert_close(clipped, torch.tensor(expected_clipped).mean())
    alive[1] = False  # left the episode: its return is the team's until the end, and only with the team reward
    clipped = m.value_loss_fn(values, old, returns, alive, m.Args(team_reward=False))
    torch.testing.assert_close(clipped, torch.tensor([expected_clipped[0], expected_clipped[2]]).mean())
    torch.testing.assert_close(
        m.value_loss_fn(values, old, returns, alive, m.Args()), torch.tensor(expected_clipped).mean()
    )


@pytest.mark.parametrize("continuous", [False, True])
def test_first_ppo_epoch_starts_on_policy(continuous):
    """Before any update the new policy is the old one: ratio 1, clipfrac 0 in the first minibatch (for continuous
    actions: the censored log-probability of the stored, clipped sample is recomputed exactly); the values are the
    old ones, the centre of the value clip."""
    torch.manual_seed(0)
    spec = env_spec(continuous_actions=continuous)
    args = m.Args(ppo_epoch=1, num_mini_batch=1, lr=0.0, continuous_actions=continuous)
    agent, value_norm, optimizer = m.build_agent(spec, args, torch.device("cpu"))
    buffer = m.RolloutBuffer(5, 2, spec, torch.device("cpu"))
    buffer.obs.normal_()
    buffer.state.normal_()
    buffer.avail[:] = random_masks(spec, buffer.obs)  # the update scores each action under the mask it had
    with torch.no_grad():
        for t in range(5):
            buffer.actions[t], buffer.logprobs[t] = agent.act(buffer.obs[t], buffer.avail[t])
    if not continuous:
        assert_no_unavailable_action(buffer)
    stats = m.ppo_update(agent, optimizer, value_norm, buffer, torch.randn(5, 2, 3), torch.randn(5, 2, 3), args)
    assert stats["ratio"] == pytest.approx(1.0, abs=1e-6)
    assert stats["clipfrac"] == 0.0 and stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert_the_value_clip_is_centred_on_the_values_acted_with(m, agent, value_norm, optimizer, buffer, args)


def test_std_is_trained_as_part_of_the_actor():
    torch.manual_seed(0)
    spec = env_spec(continuous_actions=True)
    args = m.Args(ppo_epoch=1, lr=1e-2, continuous_actions=True, max_grad_norm=1e-6)
    agent, value_norm, optimizer = m.build_agent(spec, args, torch.device("cpu"))
    buffer = m.RolloutBuffer(5, 2, spec, torch.device("cpu"))
    buffer.obs.normal_()
    with torch.no_grad():
        for t in range(5):
            buffer.actions[t], buffer.logprobs[t] = agent.act(buffer.obs[t], buffer.avail[t])
    before = agent.actor_std_logit.detach().clone()
    stats = m.ppo_update(agent, optimizer, value_norm, buffer, torch.randn(5, 2, 3), torch.randn(5, 2, 3), args)
    assert not torch.equal(agent.actor_std_logit, before)
    # the std's gradient is clipped with the actor's: together they have the clipped norm
    grads = [p.grad for name, p in agent.named_parameters() if not name.startswith("critic.")]
    assert stats["actor_grad_norm"] > 1e-3 and agent.actor_std_logit.grad.abs().sum() > 0  # 1,000x the clip
    assert torch.cat([g.flatten() for g in grads]).norm().item() == pytest.approx(1e-6, rel=1e-3)


@pytest.mark.parametrize("num_mini_batch", [1, 4])
def test_minibatch_indices_partition_the_batch(num_mini_batch):
    torch.manual_seed(0)
    batch = torch.arange(24)
    minibatches = m.minibatch_indices(24, num_mini_batch, torch.device("cpu"))
    assert len(minibatches) == num_mini_batch
    assert all(batch[mb].shape == (24 // num_mini_batch,) for mb in minibatches)
    order = torch.cat([batch[mb] for mb in minibatches]).tolist()
    assert sorted(order) == list(range(24))  # every sample exactly once
    if num_mini_batch == 1:
        assert minibatches == [slice(None)]  # the whole batch as a view: no shuffle, no copy
    else:
        assert order != list(range(24))  # shuffled


# ----------------------------------------------------------------------------------------------------
# Checkpoints, determinism and argument checks
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("continuous", [False, True])
def test_checkpoint_round_trip_gives_identical_actions(tmp_path, continuous):
    spec = env_spec("simple_speaker_listener_v4", continuous_actions=continuous)
    args = m.Args(env_id="simple_speaker_listener_v4", separate_actors=True, continuous_actions=continuous)
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
    avail = all_actions(spec, obs)
    actions = agent.act(obs, avail)[0]
    greedy = agent.act(obs, avail, deterministic=True)[0]
    torch.testing.assert_close(restored.act(obs, avail, deterministic=True)[0], greedy)
    torch.testing.assert_close(
        restored.get_dist(restored.actor_input(obs), avail).log_prob(actions),
        agent.get_dist(agent.actor_input(obs), avail).log_prob(actions),
    )
    torch.testing.assert_close(restored_norm.mean_var()[0], value_norm.mean_var()[0])
    assert checkpoint["global_step"] == 123 and checkpoint["args"]["separate_actors"] is True
    assert checkpoint["args"]["continuous_actions"] is continuous


def test_evaluation_plays_mpe2_itself():
    """Every evaluation number comes from mpe2: each episode's per-agent returns are those of mpe2's own parallel
    env reset with seed + k and stepped with the greedy actions."""
    torch.manual_seed(0)
    env_id, agents = "simple_speaker_listener_v4", ["speaker_0", "listener_0"]
    spec = env_spec(env_id)
    agent = m.Agent(spec, m.Args(env_id=env_id, separate_actors=True))
    for actor in agent.actors:  # logits far from uniform, so that the greedy actions vary
        torch.nn.init.normal_(actor[-1].weight, std=1.0)
    envs = m.PettingZooVecEnv(m.get_env_spec(env_id, scenario(env_id)), 3, 0, CPU)
    returns, frames = m.evaluate(agent, envs, 10, m.Args(eval_max_steps=1000), None)
    assert returns.shape == (3, 2) and frames is None
    for k in range(3):
        env = importlib.import_module(f"mpe2.{env_id}").parallel_env(max_cycles=25)
        observations, _ = env.reset(seed=10 + k)
        expected = np.zeros(2)
        while env.agents:
            obs = torch.zeros(1, 2, spec.obs_dim)
            for i, a in enumerate(agents):
                obs[0, i, : len(observations[a])] = torch.from_numpy(observations[a])
            actions, _ = agent.act(obs, all_actions(spec, obs), deterministic=True)
            observations, rewards, *_ = env.step({a: int(actions[0, i]) for i, a in enumerate(agents)})
            expected += [rewards[a] for a in agents]
        np.testing.assert_allclose(returns[k], expected, rtol=1e-5)
    assert len(set(returns[:, 0])) == 3  # three different episodes


def test_mpe2_envs_do_not_hold_a_drawing_surface_unless_they_render():
    assert m.make_env("simple_spread_v3", scenario()).unwrapped.screen is None
    assert m.make_env("simple_spread_v3", scenario(), render_mode="rgb_array").unwrapped.screen is not None


def test_a_training_state_survives_a_weights_only_checkpoint(tmp_path):
    """torch's generator (actions, minibatches), the envs' world and generator, the running returns and the
    progress come back from `torch.load(weights_only=True)` as they were saved."""
    envs = m.BatchedMPE(m.get_env_spec("simple_spread_v3", scenario()), 4, seed=3, device=CPU)
    envs.reset()
    progress = m.Progress(7, 700, best_eval=-9.5, eval_return=-10.0, train_return=-11.0)
    run = SimpleNamespace(progress=progress, envs=envs, running_returns=torch.randn(4, 3))
    torch.manual_seed(5)
    torch.save(m.training_state(run), tmp_path / "state.pt")
    expected = (torch.rand(3), torch.randperm(10), envs.step(torch.zeros(4, 3, dtype=torch.long)).obs)
    torch.manual_seed(6)
    other_envs = m.BatchedMPE(m.get_env_spec("simple_spread_v3", scenario()), 4, 9, CPU)
    other = SimpleNamespace(envs=other_envs, running_returns=torch.zeros(4, 3))
    checkpoint = torch.load(tmp_path / "state.pt", weights_only=True)
    m.resume_training(other, checkpoint)
    restored = m.Progress(**checkpoint["progress"])
    again = (torch.rand(3), torch.randperm(10), other_envs.step(torch.zeros(4, 3, dtype=torch.long)).obs)
    assert all(torch.equal(a, b) for a, b in zip(again, expected))
    assert restored == progress and torch.equal(other.running_returns, run.running_returns)


def test_a_checkpoint_write_that_fails_leaves_the_previous_one_intact(tmp_path, monkeypatch):
    spec = env_spec()
    agent, value_norm, optimizer = m.build_agent(spec, m.Args(), torch.device("cpu"))
    path = str(tmp_path / "model.pt")
    m.save_checkpoint(path, agent, value_norm, optimizer, m.Args(), 100)
    assert os.listdir(tmp_path) == ["model.pt"]

    def killed_while_writing(written, path):  # before the rename, the new file half written
        with open(written, "r+b") as file:
            file.truncate(100)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed_while_writing)
    with pytest.raises(KeyboardInterrupt):
        m.save_checkpoint(path, agent, value_norm, optimizer, m.Args(), 200)
    assert m.load_checkpoint(path, torch.device("cpu"))["global_step"] == 100


def test_unreadable_or_foreign_checkpoints_are_one_line_errors(tmp_path):
    """Each says what the file is and what was expected."""
    spec = env_spec()
    agent, value_norm, optimizer = m.build_agent(spec, m.Args(), torch.device("cpu"))
    good = tmp_path / "model.pt"
    m.save_checkpoint(str(good), agent, value_norm, optimizer, m.Args(), 0)
    data = good.read_bytes()
    cases = {"no.pt": (None, "checkpoint not found")}
    cases["empty.pt"] = (b"", "is empty; expected a mappo_mpe.py checkpoint")
    cases["text.pt"] = (b"hello\n", "is a text file; expected a mappo_mpe.py checkpoint")
    cases["binary.pt"] = (bytes(range(256)), "is a binary file that torch.save did not write")
    for cut in (10, len(data) // 2, len(data) - 10):
        cases[f"cut{cut}.pt"] = (data[:cut], "starts like a torch checkpoint but is truncated or damaged")
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(1)}, foreign)
    cases["foreign.pt"] = (foreign.read_bytes(), "is a torch file but not a checkpoint of these scripts")
    import mat_mpe

    mat_agent, mat_norm, mat_optimizer = mat_mpe.build_agent(spec, mat_mpe.Args(), torch.device("cpu"))
    mat_mpe.save_checkpoint(str(tmp_path / "mat.pt"), mat_agent, mat_norm, mat_optimizer, mat_mpe.Args(), 0)
    cases["mat.pt"] = ((tmp_path / "mat.pt").read_bytes(), "is a mat_mpe.py checkpoint, this is mappo_mpe.py")
    for name, (content, message) in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
        with pytest.raises(SystemExit, match=message) as e:
            m.load_checkpoint(str(tmp_path / name), torch.device("cpu"))
        assert str(e.value).startswith("error: ") and "\n" not in str(e.value)


def test_checkpoint_from_another_model_is_a_one_line_error(tmp_path):
    spec = env_spec()
    agent, value_norm, optimizer = m.build_agent(spec, m.Args(), torch.device("cpu"))
    path = str(tmp_path / "model.pt")
    m.save_checkpoint(path, agent, value_norm, optimizer, m.Args(), 0)
    other, other_norm, other_opt = m.build_agent(spec, m.Args(hidden_size=32), torch.device("cpu"))
    with pytest.raises(SystemExit, match="does not fit this model"):
        m.restore(m.load_checkpoint(path, torch.device("cpu")), other, other_norm, other_opt, path)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(num_mini_batch=3), "does not divide the rollout of 100 env steps"),
        (dict(total_timesteps=50), "less than one rollout"),
        (dict(n_rollout_threads=0), "at least 1"),
    ],
)
def test_impossible_settings_are_rejected(overrides, message):
    with pytest.raises(SystemExit, match=message):
        m.check_args(tiny_args(**overrides))


@pytest.mark.parametrize("script", ["mappo_mpe", "mappo_mpe_rnn", "mat_mpe", "mat_mpe_ep_critic"])
def test_presets_apply_under_the_flags_given(script):
    """`--preset` with `--env-id` starts from that preset's settings for that scenario (in either order and flag
    form), with `--continuous-actions` also from CONTINUOUS_PRESETS; flags given win over them, no flags give
    the tuned spread settings, `--preset official` the official ones (Args' defaults, gamma 0.99 and MAT's 10
    epochs), and every preset covers every scenario, sets its discount, and passes check_args."""
    module = importlib.import_module(script)
    tuned = dataclasses.replace(module.Args(), **module.PRESETS["tuned"]["simple_spread_v3"])
    assert module.parse_args([]) == tuned and tuned.gamma == 0.9 and module.Args().preset == "tuned"
    official = module.PRESETS["official"]["simple_spread_v3"]
    assert official["gamma"] == 0.99 and official.get("ppo_epoch", 10) == 10
    assert module.parse_args(["--preset", "official"]) == dataclasses.replace(
        module.Args(), preset="official", **official
    )
    for preset, scenarios in module.PRESETS.items():
        assert scenarios.keys() == set(module.MPE_SCENARIOS), preset
        assert all(changes["gamma"] in (0.9, 0.99) for changes in scenarios.values()), preset
        for env_id, changes in scenarios.items():
            for argv in (["--preset", preset, "--env-id", env_id], [f"--env-id={env_id}", f"--preset={preset}"]):
                args = module.parse_args(argv)
                assert args == dataclasses.replace(module.Args(), preset=preset, env_id=env_id, **changes), argv
                module.check_args(args)
            given = module.parse_args(["--preset", preset, "--env-id", env_id, "--ppo-epoch", "3", "--gamma", "0.5"])
            assert (given.ppo_epoch, given.gamma, given.preset, given.env_id) == (3, 0.5, preset, env_id)
            continuous = changes | module.CONTINUOUS_PRESETS[preset].get(env_id, {})
            args = module.parse_args(["--continuous-actions", "--env-id", env_id, "--preset", preset])
            assert args == dataclasses.replace(
                module.Args(), preset=preset, env_id=env_id, continuous_actions=True, **continuous
            )
            module.check_args(args)
    assert module.CONTINUOUS_PRESETS.keys() == module.PRESETS.keys()
    given = module.parse_args(["--preset", "tuned", "--continuous-actions", "--ent-coef", "0.02"])
    assert given.ent_coef == 0.02


@pytest.mark.parametrize("script", ["mappo_mpe", "mappo_mpe_rnn", "mat_mpe", "mat_mpe_ep_critic"])
def test_every_numeric_flag_out_of_range_is_a_one_line_error(script):
    """-1 is invalid for every numeric flag of every script; so are gamma and lambda above 1, and NaN."""
    module = importlib.import_module(script)
    hints = typing.get_type_hints(module.Args)  # the annotations are strings under `from __future__ import annotations`
    numeric = [name for name, hint in hints.items() if hint in (int, float, int | None)]
    assert {"lr", "gamma", "clip", "ppo_epoch", "seed", "total_timesteps"} <= set(numeric)
    invalid = [(name, -1) for name in numeric] + [("gamma", 1.5), ("gae_lambda", 1.01), ("lr", float("nan"))]
    for name, value in invalid:
        with pytest.raises(SystemExit) as e:
            module.check_args(module.Args(**{name: value}))
        assert str(e.value).startswith("error: --") and "\n" not in str(e.value), (name, value)
    module.check_args(module.Args())  # the defaults pass


def test_cuda_request_without_gpu_falls_back_to_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    m.main(tiny_args(cuda=True, total_timesteps=100))
    out = capsys.readouterr().out
    if torch.cuda.is_available():
        assert "training on cuda" in out and "no GPU" not in out
    else:
        assert "warning: --cuda was given but no GPU is available; running on CPU\ntraining on cpu" in out


def test_same_seed_gives_identical_first_update(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = tiny_args(total_timesteps=100)  # exactly one rollout and one update
    first = m.main(args)
    second = m.main(args)
    assert first["global_step"] == second["global_step"] == 100
    assert first["losses"] == second["losses"]
    third = m.main(dataclasses.replace(args, seed=2))
    assert third["losses"]["policy_loss"] != first["losses"]["policy_loss"]


def test_log_iteration_writes_the_rollout_and_update_times_in_ms():
    scalars = {}

    class Writer:
        def add_scalar(self, tag, value, step):
            scalars[tag] = (step, value)

    returns = np.array([-2.0, -4.0])  # (n_agents,) mean returns of the episodes that ended
    seconds = {"rollout": 0.25, "update": 0.125}
    m.log_iteration(Writer(), 800, 3200, seconds, 7e-4, {"value_loss": 0.5}, returns, ["agent_0", "agent_1"])
    assert scalars["perf/rollout_ms"] == (800, 250.0) and scalars["perf/update_ms"] == (800, 125.0)
    assert scalars["charts/episodic_return"] == (800, -3.0) and scalars["charts/team_return"] == (800, -6.0)
    assert scalars["charts/episodic_return_agent_1"] == (800, -4.0) and scalars["losses/value_loss"] == (800, 0.5)


# ----------------------------------------------------------------------------------------------------
# The script end to end
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env_id,continuous",  # spread's discrete actions: test_save_model_then_test_mode_with_video
    [(env_id, False) for env_id in SCENARIOS if env_id != "simple_spread_v3"] + [("simple_speaker_listener_v4", True)],
)
def test_script_end_to_end(tmp_path, run_script, env_id, continuous):
    flags = ["--env-id", env_id, *TINY] + (["--continuous-actions"] if continuous else [])
    if env_id == "simple_speaker_listener_v4":
        flags += ["--separate-actors", "--state-type", "AS"]
    result = run_script(tmp_path, *flags)
    assert "step       200/200" in result.stdout
    runs = os.listdir(tmp_path / "runs")
    assert len(runs) == 1 and runs[0].startswith(f"{env_id}__mappo_mpe__1__")
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "runs" / runs[0]))


@pytest.mark.parametrize("env", GENERIC_ENVS)
def test_generic_env_end_to_end(tmp_path, run_script, env):
    result = run_script(tmp_path, *GENERIC_ENVS[env], *TINY)
    assert "step       200/200" in result.stdout


def test_generic_env_save_model_then_test_mode_with_video(tmp_path, run_script):
    save_then_test_mode(run_script, tmp_path, *GENERIC_ENVS["kaz"])


def test_generic_env_resumes_alike_from_one_checkpoint(tmp_path, run_script):
    """Episodes under way on a generic env are not saved: a resumed run begins new ones, seeded from the step (their
    first action masks from the env's reset, which raises at any action they do not allow), so two runs resumed from
    the same checkpoint end with identical parameters."""
    flags = [*MASKED_ENV, "observation", "--n-rollout-threads", "4", "--n-eval-episodes", "2"]
    run_script(tmp_path, *flags, "--total-timesteps", "400")
    (run_name,) = os.listdir(tmp_path / "runs")
    checkpoint = tmp_path / "runs" / run_name / "checkpoint.pt"
    (tmp_path / "first.pt").write_bytes(checkpoint.read_bytes())
    ends = []
    for _ in range(2):
        checkpoint.write_bytes((tmp_path / "first.pt").read_bytes())
        run_script(tmp_path, *flags, "--total-timesteps", "800", "--resume", str(checkpoint))
        ends.append(torch.load(checkpoint, weights_only=True)["agent"])
    assert ends[0].keys() == ends[1].keys() and all(torch.equal(ends[0][k], ends[1][k]) for k in ends[0])


def test_the_envs_action_masks_are_obeyed(tmp_path, run_script):
    assert_action_masks_are_obeyed(run_script, tmp_path)


def test_masked_entropy_and_log_probs_count_the_available_actions_only():
    """Under a mask the categorical is the softmax over the available actions alone: entropy and log-probs as if
    the others did not exist, finite, with zero gradient through the masked logits."""
    torch.manual_seed(0)
    logits = torch.randn(64, 3, 5, requires_grad=True)
    avail = random_masks(env_spec(), logits)
    dist = m.action_distribution(logits, avail, None)
    probs = torch.softmax(logits.masked_fill(~avail, -torch.inf), dim=-1)
    expected = -torch.where(avail, probs * probs.log(), 0.0).sum(-1)
    torch.testing.assert_close(dist.entropy(), expected, atol=1e-6, rtol=0)
    actions = dist.sample()
    assert avail.gather(-1, actions.unsqueeze(-1)).all() and (avail.sum(-1) < 5).any()
    torch.testing.assert_close(dist.log_prob(actions), probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1).log())
    (dist.entropy().sum() + dist.log_prob(actions).sum()).backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[~avail] == 0).all()


def test_bad_action_masks_are_one_line(tmp_path, run_script):
    """Masks of the wrong size, and masks with continuous actions, are refused at the start (the probe reads the
    env's first masks); an agent in its episode allowed no action ends the run at that step, keeping the last
    update."""
    with pytest.raises(m.EnvError, match=r"the action_mask of a \(in its info\) has 4 values for its 5 actions$"):
        m.get_env_spec("tests.masked_env", {"bad_mask": "size"})
    with pytest.raises(SystemExit, match="unsupported action masks with actions {'Box"):
        m.get_env_spec("tests.masked_env:ContinuousMaskedEnv", {})
    flags = [*FAULT_FLAGS[2:], "--env-id", "tests.masked_env", "--env-kwargs", "bad_mask", "empty", "at_step", "30"]
    result = run_script(tmp_path, *flags, check=False)
    assert_one_line_error(result, "the action_mask of a (in its info) allows no action at env step 56; the run up to")
    assert "step 40 is kept" in result.stderr


def test_one_agent_trains(tmp_path, run_script):
    """Spread with a single agent: no teammate to observe or collide with (mpe2 runs it too)."""
    result = run_script(tmp_path, "--n-agents", "1", "--preset", "tuned", *TINY)
    assert "step       200/200" in result.stdout


def test_save_model_then_test_mode_with_video(tmp_path, run_script):
    save_then_test_mode(run_script, tmp_path, "--state-type", "FP", "--no-team-reward")


def test_continuous_actions_save_model_then_test_mode_with_video(tmp_path, run_script):
    save_then_test_mode(run_script, tmp_path, "--continuous-actions")


def test_sigterm_stops_like_ctrl_c(tmp_path, stop_script):
    code, out, err = stop_script(tmp_path, "SIGTERM", *STOP_FLAGS)
    assert code == 143 and err == "" and out.splitlines()[-1].startswith("stopped by SIGTERM at step ")


def test_ctrl_c_ends_the_run_with_one_line(tmp_path, stop_script):
    assert_stops_cleanly(stop_script, tmp_path)


def test_evaluations_of_a_continuing_task_end(tmp_path, stop_script, run_script):
    assert_evaluations_of_a_continuing_task_end(stop_script, run_script, tmp_path)


def test_a_run_never_writes_into_another_runs_folder(tmp_path, monkeypatch):
    """Runs of one script, env and seed started in the same second (a sweep launched at once) each get a folder:
    `new_run_dir` takes the next free suffix; main, finding its name taken, writes to the `_2` folder."""
    base = str(tmp_path / "runs" / "simple_spread_v3__mappo_mpe__1__1800000000")
    assert [m.new_run_dir(base) for _ in range(3)] == [base, f"{base}_2", f"{base}_3"]
    monkeypatch.chdir(tmp_path)
    now = int(time.time())
    taken = [f"runs/simple_spread_v3__taken__1__{t}" for t in range(now, now + 60)]  # whatever second main starts in
    for folder in taken:
        os.makedirs(folder)
    run_name = m.main(m.parse_args([*TINY, "--exp-name", "taken"]))["run_name"]
    assert run_name.endswith("_2") and f"runs/{run_name[:-2]}" in taken and not os.listdir(f"runs/{run_name[:-2]}")
    assert "checkpoint.pt" in os.listdir(f"runs/{run_name}")


@pytest.mark.parametrize("flags", [[], ["--continuous-actions", "--episode-length", "10"]])
def test_resume_goes_on_exactly_as_an_uninterrupted_run(tmp_path, run_script, flags):
    assert_resume_is_exact(run_script, tmp_path, *flags)


def test_sigterm_leaves_a_checkpoint_that_resumes(tmp_path, stop_script, run_script):
    assert_sigterm_checkpoint_resumes(stop_script, run_script, tmp_path)


FAULTS = {  # tests/faulty_env.py's `fail` and `at_call`, other flags, and what the error line says
    "constructor": (["fail", "construct"], [], "cannot make an env of tests.faulty_env: ValueError('n_agents must"),
    "keyword of the wrong type": (["n_agents", "abc"], [], "TypeError(\"'str' object cannot be interpreted as an"),
    "first reset": (["fail", "reset"], [], "its reset() raised RuntimeError('reset failed on purpose')"),
    "reset after an update": (
        ["fail", "reset", "at_call", "6"],
        [],
        "its reset() raised RuntimeError('reset failed on purpose') at env step 48",
    ),
    "state": (
        ["fail", "state", "at_call", "40"],
        [],
        "its state() raised RuntimeError('state failed on purpose') at env step 64",
    ),
    "NaN": (["fail", "nonfinite", "at_call", "30"], [], "its step() returned a NaN or infinity at env step 58"),
    "an observation of the wrong size": (
        ["fail", "wide", "at_call", "30"],
        [],
        "an observation of agent_0 does not fit its Box(-inf, inf, (2,), float32) at env step 58",
    ),
    "rendering": (
        ["fail", "render", "at_call", "3"],
        ["--capture-video", "--eval-interval", "20"],
        "its render() raised RuntimeError('render failed on purpose') at env step 20",
    ),
    "in a worker process": (
        ["fail", "step", "at_call", "30"],
        ["--async-envs"],
        "its step() raised RuntimeError('step failed on purpose') at env step 58",
    ),
}


@pytest.mark.parametrize("kwargs, flags, message", FAULTS.values(), ids=FAULTS.keys())
def test_every_fault_of_the_users_env_is_one_error_line(tmp_path, run_script, kwargs, flags, message):
    """Exit code 1 and one line naming the env, the call, the step (after the first) and the exception; a fault after
    an update keeps that update's checkpoint (the step is where the update left the run: 20 env steps each)."""
    result = run_script(tmp_path, *FAULT_FLAGS, "--env-kwargs", *kwargs, *flags, check=False)
    assert_one_line_error(result, "error: --env-id tests.faulty_env: ")
    assert message in result.stderr
    runs = os.listdir(tmp_path / "runs") if os.path.exists(tmp_path / "runs") else []
    kept = [torch.load(tmp_path / "runs" / run / "checkpoint.pt", weights_only=False)["global_step"] for run in runs]
    assert kept == ([int(message.split("at env step ")[1]) // 20 * 20] if "at env step" in message else [])


def test_a_failed_resume_leaves_its_checkpoint_as_it_was(tmp_path, run_script):
    """An env that fails at the resumed run's first reset (faulty_env's "reseed": seeds from 10 on, as a resumed
    run's envs get): one error line, and the checkpoint byte for byte as it was, its generators among it."""
    flags = [*FAULT_FLAGS, "--env-kwargs", "fail", "reseed", "at_call", "10"]
    run_script(tmp_path, *flags)
    (run_name,) = os.listdir(tmp_path / "runs")
    checkpoint = tmp_path / "runs" / run_name / "checkpoint.pt"
    saved = checkpoint.read_bytes()
    resumed = run_script(tmp_path, *flags, "--total-timesteps", "800", "--resume", str(checkpoint), check=False)
    assert_one_line_error(resumed, "its reset() raised RuntimeError('reset failed on purpose') at env step 400")
    assert checkpoint.read_bytes() == saved


def test_an_evaluation_an_env_fault_stopped_is_not_skipped_after_the_resume(tmp_path, run_script):
    """Evaluations every 40 env steps, iterations of 20: the env fails rendering in the first one (step 40) and the
    run keeps that update; resumed, the run evaluates after its first iteration, at step 60, as the missed one is due
    (and fails again, at the resumed process's third render), not at the next multiple of 40."""
    flags = [*FAULT_FLAGS, "--env-kwargs", "fail", "render", "at_call", "3", "--capture-video", "--eval-interval", "40"]
    message = "its render() raised RuntimeError('render failed on purpose') at env step "
    assert_one_line_error(run_script(tmp_path, *flags, check=False), message + "40")
    (run_name,) = os.listdir(tmp_path / "runs")
    checkpoint = tmp_path / "runs" / run_name / "checkpoint.pt"
    assert torch.load(checkpoint, weights_only=False)["progress"]["eval_step"] == 0
    assert_one_line_error(run_script(tmp_path, *flags, "--resume", str(checkpoint), check=False), message + "60")


def test_gymnasium_warnings_are_silenced_only_for_worker_processes(monkeypatch):
    """AsyncVectorEnv logs a worker's exception before it is raised as the run's one error line: only then is
    gymnasium's logger quieted; the evaluation envs and a run without --async-envs leave it as it was."""
    monkeypatch.setattr(gymnasium.logger, "min_level", gymnasium.logger.WARN)
    spec = m.get_env_spec("tests.faulty_env", {})
    m.PettingZooVecEnv(spec, 2, 0, CPU, async_envs=False, render_first=True)
    assert gymnasium.logger.min_level == gymnasium.logger.WARN
    m.PettingZooVecEnv(spec, 1, 0, CPU, async_envs=True).envs.close()
    assert gymnasium.logger.min_level == gymnasium.logger.ERROR + 1


def test_a_state_that_fails_once_an_agent_left_gives_the_critic_the_joined_observations(tmp_path, run_script, capsys):
    """multiwalker without terminate_on_fall, and tests/faulty_env.py's "leave", raise in state() once an agent left
    (with every agent in the episode that would be a fault of the env, test_a_state_that_cannot_be...): the spec falls
    back to the observations joined, with one warning, and a run on such an env trains to its end.
    multiwalker's falls end its episodes before its time limit of 500 steps: the probe meets none (limit 0)."""
    walkers = m.get_env_spec("pettingzoo.sisl.multiwalker_v9", {"terminate_on_fall": False})
    assert not walkers.has_state and walkers.state_dim == 3 * walkers.obs_dim
    walkers = m.get_env_spec("pettingzoo.sisl.multiwalker_v9", {})
    assert walkers.has_state and walkers.episode_limit == 0  # a fall ends the episode: state() answers
    assert "its state() raised AttributeError(" in capsys.readouterr().out
    leaving = ["--env-kwargs", "fail", "leave", "at_call", "2"]
    assert not m.get_env_spec("tests.faulty_env", {"fail": "leave", "at_call": 2}).has_state
    assert m.get_env_spec("tests.faulty_env", {}).has_state
    result = run_script(tmp_path, *FAULT_FLAGS, *leaving)
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: --env-id tests.faulty_env: its state() raised RuntimeError('state failed on purpose') once an agent "
        "left; the critic takes the observations joined"
    ]
    assert "run in runs/" in result.stdout


def test_the_envs_implement_the_env_interface_and_a_run_reads_the_spec_once(tmp_path, monkeypatch):
    """BatchedMPE and PettingZooVecEnv are VecEnvs; only BatchedMPE keeps episodes under way across a resume. A run
    reads its env's spec once, for the memory check, its envs and its evaluation envs."""
    spec = env_spec()
    batched, generic = m.BatchedMPE(spec, 2, 0, CPU), m.PettingZooVecEnv(spec, 2, 0, CPU)
    members = set(m.VecEnv.__annotations__) | {name for name in vars(m.VecEnv) if not name.startswith("_")}
    assert members == {"spec", "keeps_episodes", "reset", "observe", "step", "state_dict", "load_state_dict"}
    assert all(hasattr(env, name) for env in (batched, generic) for name in members)
    assert batched.keeps_episodes and not generic.keeps_episodes
    calls = []
    monkeypatch.setattr(m, "get_env_spec", lambda *args: calls.append(args) or spec)
    monkeypatch.chdir(tmp_path)
    m.main(tiny_args(total_timesteps=100))
    assert calls == [("simple_spread_v3", scenario())]


def test_a_fault_in_test_mode_is_one_error_line(tmp_path, run_script):
    """A checkpoint of an env that fails only when it renders, evaluated with a video: one line, exit 1."""
    run_script(tmp_path, *FAULT_FLAGS, "--env-kwargs", "fail", "render", "at_call", "2", "--save-model")
    (run_name,) = os.listdir(tmp_path / "runs")
    result = run_script(tmp_path, "--eval-checkpoint", f"runs/{run_name}/model.pt", "--capture-video", check=False)
    assert_one_line_error(result, "error: --env-id tests.faulty_env: its render() raised RuntimeError('render fai")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--n-agents", "6"], "--n-agents is for MPE scenarios; use --env-kwargs with tests.faulty_env"),
        (["--max-cycles", "9"], "--max-cycles is for MPE scenarios; use --env-kwargs with tests.faulty_env"),
        (["--env-kwargs", "fail", "step", "at_call"], "--env-kwargs takes name-value pairs, not 3 values"),
    ],
)
def test_flags_an_env_given_by_import_path_cannot_take_are_one_error_line(tmp_path, run_script, flags, message):
    assert_one_line_error(run_script(tmp_path, *FAULT_FLAGS, *flags, check=False), message)


@pytest.mark.parametrize("flag", [["--n-agents", "3"], ["--max-cycles", "25"], ["--max_cycles=25"]])
def test_mpe_flags_are_refused_for_an_env_given_by_import_path_even_at_their_defaults(flag):
    """Given at all, not only when it differs from the default: the env would not take it, whatever its value."""
    name = flag[0].split("=")[0].replace("_", "-")
    with pytest.raises(
        SystemExit, match=f"^error: {name} is for MPE scenarios; use --env-kwargs with tests.faulty_env"
    ):
        m.parse_args(["--env-id", "tests.faulty_env", *flag])
    assert m.parse_args([*flag]).env_id == "simple_spread_v3"  # an MPE scenario takes it


def test_a_fault_of_the_users_env_keeps_the_last_update_and_resumes(tmp_path, run_script):
    assert_an_env_fault_keeps_the_last_update(run_script, tmp_path)


def test_bad_resumes_are_refused_in_one_line(tmp_path, run_script):
    assert_bad_resumes_are_refused(run_script, tmp_path, m)


def test_script_reports_bad_input_in_one_line(tmp_path, run_script):
    (tmp_path / "bad.pt").write_bytes(b"garbage")
    for flags, message in [
        (["--num-mini-batch", "7", *TINY], "does not divide"),
        (["--eval-checkpoint", str(tmp_path / "bad.pt")], "is a text file"),
    ]:
        assert_one_line_error(run_script(tmp_path, *flags, check=False), message)
    for flags, message in [
        (["--env-id", "simple_tag_v3"], "--env-id simple_tag_v3: cannot make an env of simple_tag_v3: ModuleNotFound"),
        (["--env-id", "mpe2.simple_spread_v3", "--env-kwargs", "M", "4"], "unexpected keyword argument 'M'"),
        (["--env-id", KAZ, "--continuous-actions"], "unexpected keyword argument 'continuous_actions'"),
        (["--env-kwargs", "N", "4"], "apply to envs given by import path"),
        (["--env-id", KAZ, "--env-kwargs", "obs_method", "image"], "unsupported observations"),
    ]:
        assert_one_line_error(run_script(tmp_path, *flags, check=False), message)


def test_an_import_path_names_a_module_a_package_attribute_or_a_class():
    """--env-id takes the path of a module, of a package attribute (MaMuJoCo's `mamujoco_v1` is not a module), or of
    a class or function in a module, as `module:name` (gymnasium's entry points) or `module.name`; a missing module
    that the env's own module imports is named as such, not taken for a missing attribute."""
    import gymnasium_robotics

    from tests.tutorial_env import MeetEnv

    assert m.import_path("gymnasium_robotics.mamujoco_v1") is gymnasium_robotics.mamujoco_v1
    assert m.import_path("pettingzoo.sisl.pursuit_v5").__name__ == "pettingzoo.sisl.pursuit_v5"
    assert (
        m.import_path("tests.tutorial_env:MeetEnv") is MeetEnv
        and m.import_path("tests.tutorial_env.MeetEnv") is MeetEnv
    )
    with pytest.raises(AttributeError):
        m.import_path("pettingzoo.sisl.no_such_env_v0")
    with pytest.raises(AttributeError):
        m.import_path("tests.tutorial_env:NoSuchEnv")
    with pytest.raises(ImportError, match="'no_such_package'"):
        m.import_path("no_such_package.env_v0")


def test_the_users_env_is_made_as_written_and_what_cannot_be_made_is_one_line(tmp_path, run_script):
    """A class is made with --env-kwargs only: `render_mode` reaches the constructor only for a video, so a
    constructor without it is one error line then; a module without `parallel_env` says how to name the env."""
    env = m.make_env("tests.tutorial_env:MeetEnv", {})
    assert type(env).__name__ == "MeetEnv" and env.possible_agents == ["blue", "red"]
    with pytest.raises(SystemExit, match="unexpected keyword argument 'render_mode'"):
        m.make_env("tests.tutorial_env:MeetEnv", {}, "rgb_array")
    with pytest.raises(SystemExit, match=r"a module without parallel_env: .* as tests.tutorial_env:NAME"):
        m.make_env("tests.tutorial_env", {})
    flags = ["--env-id", "tests.tutorial_env:MeetEnv", *TINY, "--capture-video"]
    assert_one_line_error(run_script(tmp_path, *flags, check=False), "unexpected keyword argument 'render_mode'")
    assert not os.path.exists(tmp_path / "runs")  # refused before the run began


def test_the_probe_reads_the_time_limit_and_calls_state_where_training_does(capsys):
    """The start-up probe plays the env: its time limit, kept by the env (`max_cycles`, `limit`, ... TIME_LIMITS) or
    else the length of the first episode that a time limit ended (0: none within 400 steps, test_a_state_that_fails...),
    and state() checked where training calls it; a state() built from the agents still playing, which cannot answer
    after the last step (faulty_env's "joined_state"), is the state (test_a_state_that_cannot_answer_after_the_last...);
    one without a Box state_space of at most MAX_INPUTS numbers is not used, with a warning line."""
    assert (m.get_env_spec("tests.faulty_env", {"max_cycles": 100}).episode_limit, capsys.readouterr().out) == (100, "")
    assert m.get_env_spec("tests.arena_env", {}).episode_limit == 40
    assert m.get_env_spec("tests.faulty_env", {"max_cycles": 1000}).episode_limit == 1000  # beyond the probe's steps
    joined = m.get_env_spec("tests.faulty_env", {"fail": "joined_state"})
    assert joined.has_state and joined.episode_limit == 5 and joined.state_dim == 2 * joined.obs_dim
    tutorial = m.get_env_spec("tests.tutorial_env:MeetEnv", {})
    assert (tutorial.has_state, tutorial.episode_limit, tutorial.obs_dim, tutorial.state_dim) == (False, 30, 28, 56)
    assert capsys.readouterr().out.splitlines() == [
        "warning: --env-id tests.arena_env: it has no Box state_space of at most 4096 numbers; the critic takes the "
        "observations joined",
        "warning: --env-id tests.tutorial_env:MeetEnv: it has no Box state_space of at most 4096 numbers; the critic "
        "takes the observations joined",
    ]
    with pytest.raises(m.EnvError, match=r"^--env-id tests.faulty_env: its step\(\) raised RuntimeError"):
        m.get_env_spec("tests.faulty_env", {"fail": "step"})  # the probe's step too: one error line (`__main__`)


@pytest.mark.parametrize(
    "limit, gamma", [(5, 0.9), (25, 0.9), (40, 0.9), (50, 0.92), (100, 0.96), (200, 0.98), (400, 0.99), (0, 0.99)]
)
def test_without_gamma_given_the_discount_follows_the_time_limit(limit, gamma, monkeypatch, capsys):
    """clip(1 - 4 / T, 0.9, 0.99), T the env's time limit (0: none met, 0.99), said in one line; a --gamma given is
    kept and nothing is said; a resumed run keeps the discount of its checkpoint (0.93 here), whatever the env's time
    limit says now. Read where the run would check a resume, so that nothing trains."""

    class Checked(Exception):
        pass

    def check_resume(args, checkpoint):
        raise Checked(args.gamma)

    spec, saved = env_spec()._replace(episode_limit=limit), {}
    for name, value in dict(
        get_env_spec=lambda *_: spec, load_checkpoint=lambda *_: saved, check_resume=check_resume
    ).items():
        monkeypatch.setattr(m, name, value)
    derived = [f"gamma {gamma}, from the env's time limit: {limit or 'none in 400'} steps"]
    for given, checkpoint, expected, said in (
        (0.0, {}, gamma, derived),
        (0.5, {}, 0.5, []),
        (0.0, {"args": {"gamma": 0.93}}, 0.93, []),
    ):
        saved = checkpoint
        with pytest.raises(Checked) as chosen:
            m.main(tiny_args(gamma=given, resume="checkpoint.pt"))
        assert chosen.value.args == (expected,)
        assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("gamma")] == said


def test_discrete_observations_are_one_hot_and_count_so_against_the_size_limit(monkeypatch):
    """rps_v2 observes the other's last move as Discrete(4), the tutorial env its grid as MultiDiscrete([7] * 4): as
    gymnasium's flatten gives them, one-hot (4 and 28 numbers). As one ordinal number, the input LayerNorm would give
    every rps observation the same features: an actor without ids must tell the four apart. The size limit counts
    the one-hot width."""
    spec = m.get_env_spec("pettingzoo.classic.rps_v2", {})
    assert spec.obs_dim == 4 and m.get_env_spec("tests.tutorial_env:MeetEnv", {}).obs_dim == 28
    env = m.PettingZooEnv(spec)
    np.testing.assert_array_equal(env.stack({"player_0": 3, "player_1": 0}), [[0, 0, 0, 1], [1, 0, 0, 0]])
    obs = torch.stack([torch.as_tensor(env.stack({"player_0": k, "player_1": k})) for k in range(4)])  # (4, 2, 4)
    agent = m.Agent(spec, m.Args(use_agent_id=False))
    logits = agent.get_dist(agent.actor_input(obs), torch.ones(4, 2, 3, dtype=torch.bool)).logits[
        :, 0
    ]  # (4, 3) of player_0
    assert len({tuple(row) for row in logits.tolist()}) == 4
    monkeypatch.setattr(m, "MAX_INPUTS", 3)
    with pytest.raises(SystemExit, match="unsupported observations {'Discrete"):
        m.get_env_spec("pettingzoo.classic.rps_v2", {})


@pytest.mark.parametrize("masks", ["", "observation"])
@pytest.mark.parametrize("obs", ["box", "box2d", "sizes", "discrete", "multidiscrete", "multibinary", "int64", "uint8"])
def test_stack_flattens_each_observation_as_gymnasium_does(obs, masks):
    """`PettingZooEnv.stack` flattens a Box without gymnasium's dispatch (5x faster at 495 agents): each row equals
    gymnasium's flatten byte for byte, also where a Box of integers takes floats (cast to its dtype first) and from a
    Dict observation with an action mask; an absent agent's row is zeros."""
    kind = "box" if obs in ("int64", "uint8") else obs
    spec = m.get_env_spec("tests.random_env", {"n_agents": 3, "obs": kind, "masks": masks})
    if kind != obs:  # a Box of integers of the same size, given floats
        spec = spec._replace(obs_spaces=[gymnasium.spaces.Box(0, 5, (3,), np.dtype(obs), seed=0)] * 3)
    env = m.PettingZooEnv(spec)
    for space in spec.obs_spaces:  # the same draws every time (unseeded, 1 in 64 multibinary draws are all zeros)
        space.seed(0)
    flats = {a: space.sample() * (1.7 if kind != obs else 1) for a, space in zip(spec.agents, spec.obs_spaces)}
    del flats["agent_1"]
    expected = np.zeros((3, spec.obs_dim), np.float32)
    for i, (agent, space) in enumerate(zip(spec.agents, spec.obs_spaces)):
        flat = gymnasium.spaces.flatten(space, flats[agent]) if agent in flats else []
        expected[i, : len(flat)] = flat
    observations = {a: {"observation": x, "action_mask": np.ones(2)} if masks else x for a, x in flats.items()}
    assert np.abs(expected).sum() > 0 and env.stack(observations).tobytes() == expected.tobytes()


def test_a_sampled_evaluation_draws_from_a_generator_of_its_own(tmp_path):
    """--eval-sample: evaluations sample the policy's actions (other returns than the greedy ones on spread), the same
    draws each time (its own generator, seeded alike), and training's generator is left as it was."""
    args = tiny_args(n_eval_episodes=4, eval_sample=True)
    envs = m.PettingZooVecEnv(env_spec(), 4, 0, CPU)
    agent, *_ = m.build_agent(envs.spec, args, CPU)
    rng = torch.get_rng_state()
    sampled = [m.evaluate_and_record(agent, envs, args, None, 0, None, None) for _ in range(2)]
    assert torch.equal(torch.get_rng_state(), rng)
    np.testing.assert_array_equal(*sampled)
    greedy = m.evaluate_and_record(agent, envs, dataclasses.replace(args, eval_sample=False), None, 0, None, None)
    assert not np.allclose(greedy, sampled[0])


def test_a_sampled_evaluation_says_so_in_training_and_in_test_mode(tmp_path, run_script):
    """The progress lines read "eval sampled"; test mode samples a checkpoint whose run did, and says so."""
    trained = run_script(tmp_path, *TINY, "--eval-sample", "--save-model")
    assert "| eval sampled " in trained.stdout.splitlines()[-2]
    (run_name,) = os.listdir(tmp_path / "runs")
    tested = run_script(tmp_path, "--eval-checkpoint", str(tmp_path / "runs" / run_name / "model.pt"))
    assert "(trained 200 steps on simple_spread_v3): eval sampled episodic_return" in tested.stdout


def test_observations_and_state_of_several_dimensions_are_taken_flattened():
    """pursuit: 8 pursuers, each observing a 7x7x3 Box, and a 16x16x3 state: the networks get them flattened, as
    the env gives them; an image (KAZ's 512x512x3) stays an error (test_script_reports_bad_input_in_one_line)."""
    env_id = "pettingzoo.sisl.pursuit_v5"
    spec = m.get_env_spec(env_id, {})
    assert (len(spec.agents), spec.obs_dim, spec.state_dim, spec.action_dim, spec.has_state) == (8, 147, 768, 5, True)
    envs = m.PettingZooVecEnv(m.get_env_spec(env_id, {}), 2, 0, CPU)
    envs.reset()
    obs, state, alive, _ = envs.observe()
    assert obs.shape == (2, 8, 147) and state.shape == (2, 768) and alive.all()
    env = m.make_env(env_id, {})
    observations, _ = env.reset(seed=0)  # as env 0 of the vector
    expected = np.stack([np.ravel(observations[agent]) for agent in spec.agents])
    np.testing.assert_array_equal(obs[0].numpy(), expected)
    np.testing.assert_array_equal(state[0].numpy(), np.ravel(env.state()))


def test_observations_of_different_sizes_are_padded_and_an_agent_who_leaves_the_arena_dies():
    """tests/arena_env.py: even agents observe 10 numbers, odd ones 16 (their teammates too), zero-padded to 16; an
    agent that steps out of the square dies at that step, with the penalty in every living agent's reward."""
    envs = m.PettingZooVecEnv(m.get_env_spec("tests.arena_env", {}), 1, 0, CPU)
    assert envs.spec.obs_dim == 16 and envs.spec.state_dim == 4 * 16 and not envs.spec.has_state
    envs.reset()
    obs, *_ = envs.observe()
    assert (obs[0, 0::2, 10:] == 0).all() and (obs[0, 1::2, 10:] != 0).all()
    env = envs.envs.envs[0].env.unwrapped
    env.pos[0] = [-0.95, 0.0]  # one move left from the edge
    step = envs.step(torch.tensor([[1, 0, 0, 0]]))
    assert step.terminated[0].tolist() == [True, False, False, False] and step.alive[0].tolist() == [0, 1, 1, 1]
    nearest = np.where([0, 1, 1, 1], np.linalg.norm(env.targets[:, None] - env.pos[None], axis=-1), 2.0).min(axis=1)
    assert step.rewards[0].tolist() == pytest.approx([-nearest.mean() - 10.0] * 4)
    steep = importlib.import_module("tests.arena_env").parallel_env(reward="steep")  # the stand-still probe (panel.md)
    steep.reset(seed=0)
    rewards = steep.step({agent: 0 for agent in steep.agents})[1]  # nobody moves
    nearest = np.linalg.norm(steep.targets[:, None] - steep.pos[None], axis=-1).min(axis=1)
    assert list(rewards.values()) == pytest.approx([1.0 - 4.0 * nearest.mean()] * 4)


def test_the_progress_line_shows_the_latest_episodes_that_ended(tmp_path, run_script):
    """Episodes of 40 steps, a line every 25: a line after which no episode ended shows the return of the latest that
    did, not nan (only the first line has none to show)."""
    flags = ["--env-id", "tests.dying_env", "--env-kwargs", "max_cycles", "40", "death_step", "100"]
    result = run_script(tmp_path, *flags, *TINY[2:], "--total-timesteps", "300")
    lines = [line for line in result.stdout.splitlines() if line.startswith("step")]
    returns = [line.split("episodic_return")[1].split("|")[0].strip() for line in lines]
    assert len(returns) == 3 and returns[0] == "nan" and returns[1] != "nan" and returns[2] == returns[1]


def test_the_first_progress_line_comes_after_the_first_iteration(tmp_path, monkeypatch, capsys):
    """On a slow env the first --log-interval can be minutes away: a line after the first iteration says the run is
    under way (then every interval, and at the end)."""
    monkeypatch.chdir(tmp_path)
    m.main(tiny_args(total_timesteps=400, log_interval=300))
    steps = [line.split("/")[0].split()[-1] for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    assert steps == ["100", "300", "400"]


def test_by_default_evaluations_wait_for_their_interval_and_thirty_iterations(tmp_path, monkeypatch):
    """No evaluation at step 0, and by default evaluations (and checkpoints) at least 30 iterations apart: with 4,000
    envs of one step an iteration, every 120,000 steps instead of 50,000; an --eval-interval given is kept."""
    monkeypatch.chdir(tmp_path)
    flags = dict(n_rollout_threads=4000, episode_length=1, hidden_size=4, ppo_epoch=1, eval_interval=0)
    for eval_interval, evaluated in ((0, [120_000, 124_000]), (50_000, [52_000, 100_000, 124_000])):
        args = tiny_args(**flags | dict(total_timesteps=124_000, eval_interval=eval_interval, log_interval=10**6))
        run_dir = tmp_path / "runs" / m.main(args)["run_name"]
        assert [step for step, _ in logged_scalars(run_dir)["eval/episodic_return"]] == evaluated


def test_a_run_takes_the_torch_threads_it_is_given(tmp_path, monkeypatch, capsys):
    """Half the cores by default (one on two cores), so that two runs side by side keep their speed, said at the start;
    --n-training-threads sets others."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(16)), raising=False)
    before = torch.get_num_threads()
    try:
        for given, threads in ((3, 3), (m.Args().n_training_threads, 8)):
            m.main(tiny_args(total_timesteps=100, n_training_threads=given))
            assert torch.get_num_threads() == threads
            assert capsys.readouterr().out.startswith(f"training on cpu, torch threads: {threads}\n")
    finally:
        torch.set_num_threads(before)


def test_evaluation_records_the_first_episode_when_its_env_renders():
    spec = env_spec(max_cycles=5)
    agent = m.Agent(spec, m.Args())
    envs = m.PettingZooVecEnv(spec, n_envs=2, seed=0, device=CPU, render_first=True)
    assert [env.render_mode for env in envs.envs.envs] == ["rgb_array", None]
    returns, frames = m.evaluate(agent, envs, 0, m.Args(eval_max_steps=1000), None)
    assert returns.shape == (2, 3) and frames.shape == (6, 700, 700, 3) and frames.dtype == np.uint8
    assert frames.std() > 0


def test_generic_envs_report_an_agent_who_dies_and_the_end_of_the_episode():
    """tests/dying_env.py through the env interface: agent_1 leaves at step 2 of 4. Its reward counts at that step,
    it stays terminated with zero observations and rewards, and the episode ends by truncation for the others;
    the env then begins the next episode within the same step, its last observations kept in final_obs."""
    envs = m.PettingZooVecEnv(m.get_env_spec("tests.dying_env", {"death_step": 2, "max_cycles": 4}), 2, 0, CPU)
    spec = envs.spec
    assert spec.agents == ["agent_0", "agent_1", "agent_2"] and (spec.obs_dim, spec.action_dim) == (3, 4)
    assert spec.state_dim == 9 and not spec.has_state and not spec.continuous  # no env.state(): the obs joined
    np.testing.assert_array_equal(spec.avail_actions, [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    envs.reset()
    actions = torch.tensor([[1, 2, 3], [0, 1, 2]])
    ids = torch.arange(3.0).expand(2, 3)
    steps = [envs.step(actions) for _ in range(4)]
    for t, step in enumerate(steps, start=1):
        dead = t >= 2
        assert step.terminated[:, 1].tolist() == [dead, dead] and not step.terminated[:, [0, 2]].any()
        assert step.truncated[:, [0, 2]].all() == (t == 4) and not step.truncated[:, 1].any()
        torch.testing.assert_close(step.rewards[:, 1], actions[:, 1].float() * (t <= 2))
        torch.testing.assert_close(step.rewards[:, [0, 2]], actions[:, [0, 2]].float())
        torch.testing.assert_close(step.final_obs[..., 0], ids * torch.tensor([1.0, t <= 2, 1.0]))
        torch.testing.assert_close(step.state, step.obs.flatten(1))
    assert steps[0].alive.all() and not steps[1].alive[:, 1].any() and steps[2].alive[:, [0, 2]].all()
    assert (steps[1].obs[:, 1] == 0).all() and (steps[1].obs[:, 0, 1] == 2).all()
    assert [bool(s.ended.all()) for s in steps] == [False, False, False, True]
    assert steps[3].alive.all() and torch.equal(steps[3].obs, torch.stack([ids, 0 * ids, 0 * ids], dim=-1))
    torch.testing.assert_close(steps[3].final_obs[:, 0], torch.tensor([[0.0, 4.0, 1.0], [0.0, 4.0, 0.0]]))


def test_generic_envs_scale_unit_box_actions_to_each_agents_bounds():
    """A continuous policy acts in the unit box: agent i's first 1 + i numbers, clipped into [0, 1], become
    -2 + 4 a in its Box(-2, 2); the padding it does not have is dropped."""
    envs = m.PettingZooVecEnv(m.get_env_spec("tests.dying_env", {"continuous": True}), 1, 0, CPU)
    assert envs.spec.continuous and envs.spec.action_dim == 3
    envs.reset()
    unit = torch.tensor([[[0.25, 9.0, 9.0], [1.5, 0.5, 9.0], [-1.0, 0.75, 0.5]]])
    step = envs.step(unit)
    expected = [-2 + 4 * 0.25, (-2 + 4 * 1.0) + (-2 + 4 * 0.5), (-2 + 0.0) + (-2 + 4 * 0.75) + (-2 + 4 * 0.5)]
    torch.testing.assert_close(step.rewards, torch.tensor([expected]))


@pytest.mark.parametrize("team_reward", [True, False])
def test_an_agent_who_died_adds_nothing_to_the_policys_update(team_reward):
    """tests/dying_env.py, agent_1 gone after step 3 of 6: the update's losses (one batch, before any step) equal
    those computed by hand from the alive agents' steps only (the policy loss, the entropy, the advantages' statistics);
    the critic learns those steps too without the team reward, and with it every step (a dead agent's return is the
    team's until the episode ends), ValueNorm fed likewise."""
    torch.manual_seed(0)
    envs = m.PettingZooVecEnv(m.get_env_spec("tests.dying_env", {}), 2, 0, CPU)
    args = m.Args(ppo_epoch=1, lr=0.0, team_reward=team_reward)
    agent, value_norm, optimizer = m.build_agent(envs.spec, args, CPU)
    buffer = m.RolloutBuffer(6, 2, envs.spec, CPU)
    envs.reset()
    buffer.obs[0], buffer.state[0], buffer.alive[0], buffer.avail[0] = envs.observe()
    with torch.no_grad():
        for t in range(6):
            actions, logprobs = agent.act(buffer.obs[t], buffer.avail[t])
            step = envs.step(actions)
            buffer.insert(t, actions, logprobs, step)
        buffer.compute_values(agent, value_norm)
        advantages, returns = m.compute_gae(buffer, 0.99, 0.95, team_reward)
    buffer.logprobs += 0.3 * torch.randn_like(buffer.logprobs)  # ratios away from 1, some clipped: a loss not ~0
    alive = buffer.alive[:-1]
    valued = alive | team_reward
    assert alive[:3].all() and not alive[3:, :, 1].any() and alive[3:, :, [0, 2]].all()
    old_values = value_norm.normalize(buffer.values[:-1][valued])  # the critic's outputs when it acted
    stats = m.ppo_update(agent, optimizer, value_norm, buffer, advantages, returns, args)
    by_hand = m.ValueNorm()
    by_hand.update(returns[valued])
    with torch.no_grad():
        obs, state = buffer.obs[:-1].flatten(0, 1), buffer.state[:-1].flatten(0, 1)
        dist = agent.get_dist(agent.actor_input(obs), buffer.avail[:-1].flatten(0, 1))
        entropy = dist.entropy().view_as(alive)[alive].mean()
        ratio = (dist.log_prob(buffer.actions.flatten(0, 1)).view_as(alive) - buffer.logprobs)[alive].exp()
        values = agent.get_value(agent.critic_input(obs, state)).view_as(alive)[valued]
    ones = torch.ones_like(values, dtype=torch.bool)
    value_loss = m.value_loss_fn(values, old_values, by_hand.normalize(returns[valued]), ones, args)
    adv = (advantages[alive] - advantages[alive].mean()) / (advantages[alive].std() + 1e-5)
    policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - args.clip, 1 + args.clip) * adv).mean()
    assert abs(policy_loss.item()) > 0.01 and stats["policy_loss"] == pytest.approx(policy_loss.item(), rel=1e-5)
    assert stats["entropy"] == pytest.approx(entropy.item(), rel=1e-6)
    assert stats["value_loss"] == pytest.approx(value_loss.item(), rel=1e-5)
    assert valued.sum() == (alive.numel() if team_reward else alive.sum())


def test_a_resume_after_a_fault_in_the_final_evaluation_finishes_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_a_resume_finishes_the_final_evaluation(m, tmp_path)
