"""Tests for reference_policies.py: the hand-written policies on hand-made worlds, and measured on mpe2."""

import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import reference_policies as rp  # noqa: E402


def entity(pos, vel=(0.0, 0.0)) -> SimpleNamespace:
    return SimpleNamespace(state=SimpleNamespace(p_pos=np.array(pos), p_vel=np.array(vel)))


def world(agents, velocities, landmarks) -> SimpleNamespace:
    """Just what the policies read of an mpe2 world: positions and velocities."""
    return SimpleNamespace(
        agents=[entity(p, v) for p, v in zip(agents, velocities)], landmarks=[entity(p) for p in landmarks]
    )


@pytest.mark.parametrize(
    "velocity,target,move",
    [
        ((0.0, 0.0), (1.0, 0.0), 2),  # at rest: push toward the target
        ((0.0, 0.0), (0.0, -1.0), 3),
        ((0.0, 0.0), (0.0, 0.0), 0),  # already there: no force
        ((2.0, 0.0), (0.1, 0.0), 1),  # rushing past it: brake, although the target lies ahead
    ],
)
def test_moves_toward_looks_two_steps_ahead(velocity, target, move):
    moves = rp.moves_toward(np.zeros((1, 2)), np.array([velocity]), np.array([target]))
    assert moves.tolist() == [move]


def test_scripted_shares_the_landmarks_out_where_nearest_landmark_does_not():
    """Both agents are nearest the landmark at the origin; the assignment sends the farther one to the other."""
    w = world(agents=[(0.1, 0.0), (0.45, 0.0)], velocities=[(0.0, 0.0)] * 2, landmarks=[(0.0, 0.0), (1.0, 0.0)])
    rng = np.random.default_rng(0)
    assert rp.nearest_landmark(w, rng).tolist() == [1, 1]  # both go -x
    assert rp.scripted(w, rng).tolist() == [1, 2]  # agent 0 -x, agent 1 +x


def test_contact_forces_are_mpe2s_and_scripted_counts_them_in():
    """Two of spread's agents 0.2 apart (they touch below 0.3): each is pushed off the other with mpe2's force
    (`World.get_collision_force` on a real spread world), about 10 along x, twice a move's 5; agents apart feel
    nothing. Agent 0, pushed -x by 0.1 in two steps onto its landmark at the origin, stays put (without the push it
    would go -x)."""
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(N=2)
    env.reset(seed=0)
    mpe_world = env.unwrapped.world
    for agent, position in zip(mpe_world.agents, [(0.1, 0.0), (0.3, 0.0)]):
        agent.state.p_pos = np.array(position)
    expected = mpe_world.get_collision_force(*mpe_world.agents)  # [on agent 0, on agent 1]
    agents = np.array([[0.1, 0.0], [0.3, 0.0]])
    np.testing.assert_allclose(rp.contact_forces(agents), np.stack(expected), rtol=1e-12)
    assert expected[0][0] == pytest.approx(-10.0, abs=0.01)
    np.testing.assert_allclose(rp.contact_forces(np.array([[0.0, 0.0], [0.5, 0.0]])), 0.0, atol=1e-12)
    w = world(agents=[(0.1, 0.0), (0.3, 0.0)], velocities=[(0.0, 0.0)] * 2, landmarks=[(0.0, 0.0), (1.0, 0.0)])
    assert rp.scripted(w, np.random.default_rng(0)).tolist() == [0, 2]


def test_one_agent_scripted_is_nearest_landmark_and_both_beat_random():
    """With one agent the assignment is the nearest landmark: the same episodes give the same returns; the planner,
    with nobody to avoid, differs only by looking further ahead."""
    policies = {"random": None, **rp.POLICIES["simple_spread_v3"]}
    random, nearest, scripted, planner = (rp.measure("simple_spread_v3", p, 1, 4, seed=3) for p in policies.values())
    assert scripted == nearest
    assert scripted[0] > random[0] and planner[0] > random[0] and scripted[1] > 0


def test_oracle_listener_heads_for_the_speakers_goal():
    """The speaker says word 0; the listener, at rest at the origin, pushes toward the goal landmark, not the nearer
    one."""
    w = world(agents=[(0.5, 0.5), (0.0, 0.0)], velocities=[(0.0, 0.0)] * 2, landmarks=[(0.1, 0.0), (0.0, -1.0)])
    w.agents[0].goal_b = w.landmarks[1]
    assert rp.oracle_listener(w, np.random.default_rng(0)).tolist() == [0, 3]  # -y


def test_oracle_pair_heads_for_the_goal_the_other_agent_holds():
    w = world(agents=[(0.0, 0.0), (1.0, 1.0)], velocities=[(0.0, 0.0)] * 2, landmarks=[(1.0, 0.0), (1.0, 2.0)])
    w.agents[0].goal_b, w.agents[1].goal_b = w.landmarks[1], w.landmarks[0]  # agent 1's goal for agent 0 is (1, 0)
    assert rp.oracle_pair(w, np.random.default_rng(0)).tolist() == [2, 4]  # agent 0 +x, agent 1 +y


@pytest.mark.parametrize("env_id", ["simple_speaker_listener_v4", "simple_reference_v3"])
def test_oracles_beat_random_on_mpe2(env_id):
    random, oracle = (rp.measure(env_id, p, 2, 6, seed=0) for p in (None, rp.POLICIES[env_id]["oracle"]))
    assert oracle[0] > random[0] + 5 and oracle[1] > 0


def test_rollout_integrates_as_mpe2_and_rests_where_the_drift_ends():
    """From (0, 0) at velocity (1, 0) without force: mpe2 moves with the old velocity, then damps it by 0.75, so the
    path is 0.1, 0.175; the drift after it adds 0.5625 * 0.1 / 0.25, ending at v * dt / 0.25 = 0.4 from the start,
    however many steps came first. One push of 5 along +y at rest shows only in the second position."""
    path, rest = rp.rollout(np.zeros(2), np.array([1.0, 0.0]), np.zeros((2, 2)))
    np.testing.assert_allclose(path, [[0.1, 0.0], [0.175, 0.0]])
    np.testing.assert_allclose(rest, [0.4, 0.0])
    path, _ = rp.rollout(np.zeros(2), np.zeros(2), np.array([[0.0, 5.0], [0.0, 0.0]]))
    np.testing.assert_allclose(path, [[0.0, 0.0], [0.0, 0.05]])


def test_planner_brakes_before_its_landmark_and_shares_them_out():
    """One agent rushing at its landmark brakes (scripted's two-step lookahead does too); two agents take the
    assigned landmarks, as scripted does."""
    rushing = world(agents=[(0.0, 0.0)], velocities=[(2.0, 0.0)], landmarks=[(0.3, 0.0)])
    assert rp.planner(rushing, np.random.default_rng(0)).tolist() == [1]  # -x
    w = world(agents=[(0.1, 0.0), (0.3, 0.0)], velocities=[(0.0, 0.0)] * 2, landmarks=[(-0.5, 0.0), (1.0, 0.0)])
    assert rp.planner(w, np.random.default_rng(0)).tolist() == [1, 2]


def test_the_planner_beats_scripted_on_the_same_mpe2_episodes():
    """At N=6, where collisions cost scripted most, the same 10 episodes (seeds 0-9) score higher under the planner."""
    scripted, planner = (rp.measure("simple_spread_v3", p, 6, 10, seed=0) for p in (rp.scripted, rp.planner))
    assert planner[0] > scripted[0] + 1
