"""The batched torch MPE that the scripts train on (`BatchedMPE`, the same code in all four scripts; see
test_shared_code.py) against mpe2 itself: the same world state goes into both, both take the same random actions
for whole episodes across the truncation, and every output must agree, step by step."""

import os
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import mappo_mpe as m  # noqa: E402

CPU = torch.device("cpu")

# (env_id, continuous, extra Args): every scenario with both action types; spread also with 6 agents, alone (no
# other agent to see or collide with)
CASES = [
    ("simple_spread_v3", False, {}),
    ("simple_spread_v3", True, {}),
    ("simple_speaker_listener_v4", False, {}),
    ("simple_speaker_listener_v4", True, {}),
    ("simple_reference_v3", False, {}),
    ("simple_reference_v3", True, {}),
    ("simple_spread_v3", False, {"n_agents": 6}),
    ("simple_spread_v3", True, {"n_agents": 6}),
    ("simple_spread_v3", False, {"n_agents": 1}),
]


def scenario(env_id: str = "simple_spread_v3", **args) -> dict:
    return m.scenario_kwargs(m.Args(env_id=env_id, **args))


@pytest.fixture
def float64():
    """Runs the test with float64 as torch's default dtype, in which the batched env then computes."""
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def load_world(batched: m.BatchedMPE, k: int, env):
    """Puts the world of mpe2 env `env` into env k of the batched env: positions, velocities, messages, goals and the
    episode's step count."""
    world = env.unwrapped.world
    goals = [world.landmarks.index(a._goal_b) if getattr(a, "_goal_b", None) else 0 for a in world.agents]
    batched.pos[k] = torch.as_tensor(np.array([e.state.p_pos for e in world.entities]))
    batched.vel[k] = torch.as_tensor(np.array([a.state.p_vel for a in world.agents]))
    batched.comm[k] = torch.as_tensor(np.array([a.state.c for a in world.agents]))
    batched.goal[k] = torch.tensor(goals)
    batched.steps[k] = env.unwrapped.steps


def mpe2_step(env, actions: np.ndarray, spec: m.EnvSpec) -> tuple[np.ndarray, ...]:
    """Steps mpe2's parallel env with the scripts' actions (each agent its own dimensions, clipped into the box as
    mpe2's env() clips them); returns terminated, truncated, and the observations (zero-padded), state and rewards
    in float64, as mpe2's scenario computes them."""
    sizes = spec.avail_actions.sum(axis=1)
    own = [a[:n].clip(0.0, 1.0) if spec.continuous else int(a) for a, n in zip(actions, sizes)]
    _, rewards, terminated, truncated, _ = env.step(dict(zip(spec.agents, own)))
    world, scenario = env.unwrapped.world, env.unwrapped.scenario
    agent_obs = [scenario.observation(a, world) for a in world.agents]
    obs = np.zeros((len(agent_obs), spec.obs_dim))
    for i, o in enumerate(agent_obs):
        obs[i, : len(o)] = o
    ends = [np.array([flags[a] for a in spec.agents]) for flags in (terminated, truncated)]
    return *ends, obs, np.concatenate(agent_obs), np.array([rewards[a] for a in spec.agents])


def random_actions(rng, spec: m.EnvSpec, n_envs: int) -> np.ndarray:
    """Discrete: any action of each agent. Continuous: zero-padded vectors with values outside [0, 1] as well, which
    both envs clip into the box."""
    if spec.continuous:
        return rng.uniform(-0.5, 1.5, (n_envs, len(spec.agents), spec.action_dim)) * spec.avail_actions
    return rng.integers(spec.avail_actions.sum(axis=1), size=(n_envs, len(spec.agents)))


def compare_with_mpe2(env_id: str, continuous: bool, extra: dict, reload_each_step: bool, atol: float):
    """50 mpe2 envs and a batched env of 50 start from the same worlds (mpe2's seeded resets) and take the same
    random actions for two episodes of 25 steps. With `reload_each_step`, mpe2's world is put into the batched env
    before every step, so that each step is compared from the same state (float32 drift neither hides nor fakes an
    error); without, the batched env runs on by itself and mpe2's world is loaded only after each reset."""
    n_envs, dtype = 50, torch.get_default_dtype()
    kwargs = scenario(env_id, continuous_actions=continuous, **extra)
    batched = m.BatchedMPE(m.get_env_spec(env_id, kwargs), n_envs, seed=0, device=CPU)
    spec = batched.spec
    envs = [m.make_env(env_id, kwargs) for _ in range(n_envs)]
    for k, env in enumerate(envs):
        env.reset(seed=1000 + k)
        load_world(batched, k, env)
    rng = np.random.default_rng(0)
    for t in range(2 * kwargs["max_cycles"]):
        if reload_each_step:
            for k, env in enumerate(envs):
                load_world(batched, k, env)
        actions = random_actions(rng, spec, n_envs)
        step = batched.step(torch.as_tensor(actions, dtype=dtype if continuous else torch.long))
        expected = [mpe2_step(env, actions[k], spec) for k, env in enumerate(envs)]
        terminated, truncated, obs, state, rewards = (np.stack(x) for x in zip(*expected))
        assert (
            step.obs.dtype == step.rewards.dtype == dtype
            and step.truncated.dtype == step.terminated.dtype == torch.bool
        )
        np.testing.assert_array_equal(step.terminated.numpy(), terminated)
        np.testing.assert_array_equal(step.truncated.numpy(), truncated)
        np.testing.assert_allclose(step.final_obs.numpy(), obs, rtol=0, atol=atol, err_msg=f"obs, step {t}")
        np.testing.assert_allclose(step.final_state.numpy(), state, rtol=0, atol=atol, err_msg=f"state, step {t}")
        np.testing.assert_allclose(step.rewards.numpy(), rewards, rtol=0, atol=atol, err_msg=f"rewards, step {t}")
        if truncated.all():  # both start new episodes: the batched env from its own draws, so mpe2's is loaded
            assert not torch.allclose(step.obs, step.final_obs)
            for k, env in enumerate(envs):
                env.reset()
                load_world(batched, k, env)
        else:
            torch.testing.assert_close(step.obs, step.final_obs, rtol=0, atol=0)
    assert t >= kwargs["max_cycles"] and truncated.all()


@pytest.mark.parametrize("env_id,continuous,extra", CASES)
def test_batched_env_steps_as_mpe2_in_float32(env_id, continuous, extra):
    compare_with_mpe2(env_id, continuous, extra, reload_each_step=True, atol=1e-5)


@pytest.mark.parametrize("env_id,continuous,extra", CASES)
def test_batched_env_steps_as_mpe2_in_float64_for_whole_episodes(float64, env_id, continuous, extra):
    compare_with_mpe2(env_id, continuous, extra, reload_each_step=False, atol=1e-9)


def test_spread_contact_forces_push_overlapping_agents_apart():
    """Two agents 0.1 apart (overlapping by 0.2) get equal and opposite forces of 100 * 0.2 along their axis; the
    third, far away, gets next to none: the same as mpe2's get_collision_force."""
    batched = m.BatchedMPE(m.get_env_spec("simple_spread_v3", scenario()), 1, seed=0, device=CPU)
    batched.pos[0, :3] = torch.tensor([[0.0, 0.0], [0.1, 0.0], [0.9, 0.9]])
    forces = batched.contact_forces()[0]
    torch.testing.assert_close(forces[0], torch.tensor([-20.0, 0.0]), rtol=1e-4, atol=0)
    torch.testing.assert_close(forces[1], -forces[0])
    assert forces[2].abs().max() < 1e-30
    world = m.make_env("simple_spread_v3", scenario()).unwrapped.world
    for agent, pos in zip(world.agents, batched.pos[0, :3].double().numpy()):
        agent.state.p_pos = pos
    force_a, force_b = world.get_collision_force(world.agents[0], world.agents[1])
    np.testing.assert_allclose(forces[:2].numpy(), np.stack([force_a, force_b]), rtol=1e-5)


@pytest.mark.parametrize("env_id", ["simple_spread_v3", "simple_speaker_listener_v4", "simple_reference_v3"])
def test_resets_draw_as_mpe2_draws(env_id):
    """Positions uniform in [-1, 1]^2 (bounds, mean and variance over many resets, for the batched env and for mpe2
    alike), agents at rest and silent, each agent's goal one of the 3 landmarks uniformly and independently, and the
    goal colours mpe2 gives its landmarks."""
    n_envs = 20_000
    batched = m.BatchedMPE(m.get_env_spec(env_id, scenario(env_id)), n_envs, seed=0, device=CPU)
    batched.vel.fill_(1.0)
    batched.comm.fill_(1.0)
    batched.steps.fill_(7)
    batched.reset()
    mpe2_env = m.make_env(env_id, scenario(env_id))
    mpe2_pos = []
    for seed in range(2000):
        mpe2_env.reset(seed=seed)
        mpe2_pos.append([e.state.p_pos for e in mpe2_env.unwrapped.world.entities])
    for pos in (batched.pos.numpy(), np.array(mpe2_pos)):
        samples = pos.reshape(-1)
        assert -1.0 <= samples.min() < -0.99 and 0.99 < samples.max() <= 1.0
        assert abs(samples.mean()) < 4 * np.sqrt(1 / 3 / len(samples))
        assert abs(samples.var() - 1 / 3) < 0.01
    assert batched.vel.abs().sum() == batched.comm.abs().sum() == batched.steps.abs().sum() == 0
    if env_id == "simple_spread_v3":
        return
    pairs = np.bincount((batched.goal[:, 0] * 3 + batched.goal[:, 1]).numpy(), minlength=9) / n_envs
    assert np.abs(pairs - 1 / 9).max() < 4 * np.sqrt(1 / 9 * 8 / 9 / n_envs)  # both agents' goals: 9 pairs alike
    colours = [landmark.color for landmark in mpe2_env.unwrapped.world.landmarks]
    np.testing.assert_array_equal(batched.colours.numpy(), np.array(colours, dtype=np.float32))


def test_every_env_resets_on_its_own_and_keeps_its_final_observation():
    """Envs at different steps of their episodes: only those that reach max_cycles end and start anew (at rest, step
    count 0); their final observation is the one an env without truncation would have had after the step."""
    n_envs = 6
    batched = m.BatchedMPE(m.get_env_spec("simple_spread_v3", scenario(max_cycles=25)), n_envs, seed=0, device=CPU)
    endless = m.BatchedMPE(m.get_env_spec("simple_spread_v3", scenario(max_cycles=1000)), n_envs, seed=1, device=CPU)
    batched.reset()
    batched.vel.uniform_(-1.0, 1.0)
    batched.steps = torch.tensor([24, 3, 24, 0, 10, 24])
    endless.load_state_dict(batched.state_dict())
    actions = torch.randint(5, (n_envs, 3))
    step, reference = batched.step(actions), endless.step(actions)
    ended = torch.tensor([True, False, True, False, False, True])
    assert torch.equal(step.ended, ended) and torch.equal(step.truncated.all(dim=1), ended)
    torch.testing.assert_close(step.final_obs, reference.obs, rtol=0, atol=0)
    torch.testing.assert_close(step.final_state, reference.state, rtol=0, atol=0)
    torch.testing.assert_close(step.obs[~ended], reference.obs[~ended], rtol=0, atol=0)
    assert (step.obs[ended] - reference.obs[ended]).abs().amax(dim=(1, 2)).min() > 0.1  # new episodes
    assert torch.equal(batched.steps, torch.tensor([0, 4, 0, 1, 11, 0]))
    assert batched.vel[ended].abs().sum() == 0 and batched.vel[~ended].abs().sum() > 0


def test_same_seed_same_episodes_and_a_restored_env_goes_on_identically(tmp_path):
    """Seeded resets repeat, differ between envs and seeds; an env restored from a weights-only checkpoint of another
    one's state (mid-episode) steps exactly as it, through the truncation and the resets that draw new episodes."""
    kwargs = scenario("simple_speaker_listener_v4", continuous_actions=True)
    first, again, other = (
        m.BatchedMPE(m.get_env_spec("simple_speaker_listener_v4", kwargs), 4, seed, CPU) for seed in (7, 7, 8)
    )
    for env in (first, again, other):
        env.reset()
    obs = [env.observe()[0] for env in (first, again, other)]
    assert torch.equal(obs[0], obs[1]) and not torch.equal(obs[0], obs[2])
    assert not torch.equal(obs[0][0], obs[0][1])
    for _ in range(10):
        first.step(torch.rand(4, 2, 5))
    torch.save(first.state_dict(), tmp_path / "env.pt")
    other.load_state_dict(torch.load(tmp_path / "env.pt", weights_only=True))
    for _ in range(60):
        actions = torch.rand(4, 2, 5) * 2 - 0.5
        for a, b in zip(first.step(actions), other.step(actions)):
            assert torch.equal(a, b)


def test_where_the_joined_observations_do_not_fit_the_batched_env_gives_no_state():
    """Spread's 27 agents see 4,374 numbers joined, more than the networks take: the spec has no state (the critic
    takes each agent's own observation), and neither does any step of the batched env."""
    spec = m.get_env_spec("simple_spread_v3", scenario(n_agents=27))
    batched = m.BatchedMPE(spec, 2, seed=0, device=CPU)
    batched.reset()
    assert (spec.state_dim, batched.observe()[1].shape) == (0, (2, 0))
    step = batched.step(torch.zeros(2, 27, dtype=torch.long))
    assert step.state.shape == step.final_state.shape == (2, 0)


def test_a_non_finite_continuous_action_is_a_one_line_error():
    batched = m.BatchedMPE(m.get_env_spec("simple_spread_v3", scenario(continuous_actions=True)), 2, seed=0, device=CPU)
    batched.reset()
    actions = torch.full((2, 3, 5), 7.0)
    batched.step(actions)  # finite values outside the box are clipped, not refused
    actions[1, 2, 3] = float("nan")
    with pytest.raises(SystemExit, match=r"^error: the policy gave a continuous action that is NaN or infinite"):
        batched.step(actions)


def test_an_agent_that_cannot_move_keeps_its_place_and_velocity_as_in_mpe2():
    """The speaker never moves: given a velocity (resets never give it one), mpe2's integrate_state skips it, and so
    does the batched env, while the listener moves as usual."""
    kwargs = scenario("simple_speaker_listener_v4")
    batched = m.BatchedMPE(m.get_env_spec("simple_speaker_listener_v4", kwargs), 1, seed=0, device=CPU)
    env = m.make_env("simple_speaker_listener_v4", kwargs)
    env.reset(seed=0)
    for agent in env.unwrapped.world.agents:
        agent.state.p_vel = np.array([0.3, -0.2])
    load_world(batched, 0, env)
    speaker_pos = batched.pos[0, 0].clone()
    mpe2_step(env, np.array([1, 2]), batched.spec)
    batched.step(torch.tensor([[1, 2]]))
    world = env.unwrapped.world
    torch.testing.assert_close(batched.pos[0, 0], speaker_pos, atol=0, rtol=0)
    torch.testing.assert_close(batched.vel[0, 0], torch.tensor([0.3, -0.2]))
    np.testing.assert_allclose(batched.pos[0, :2].numpy(), [a.state.p_pos for a in world.agents], atol=1e-6)
    np.testing.assert_allclose(batched.vel[0].numpy(), [a.state.p_vel for a in world.agents], atol=1e-6)
