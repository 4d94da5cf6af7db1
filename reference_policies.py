"""Hand-written policies for the three MPE scenarios of the benchmark (spread at any number of agents), measured on
mpe2 itself: the yardsticks that the benchmark's plots and tables draw next to the learned policies.

- random: uniformly random discrete actions (every scenario).
- nearest landmark: every agent heads for the landmark nearest to it, even when another agent does too.
- scripted: at every step an optimal assignment of agents to landmarks (`scipy.optimize.linear_sum_assignment` on
  their distances, so that no two agents head for the same landmark); each agent then takes the move that brings
  it closest to its landmark two steps ahead, the first position its action reaches (mpe2 moves an agent with its
  velocity before the force changes it), with mpe2's soft contact force of the agents it touches now in that step.

- planner (spread): the scripted assignment; every agent's 625 sequences of 4 moves are rolled out (the contact
  force of now in the first), each costing the distances to its landmark at the 4 positions its moves reach (steps
  2 to 5) and at the point where it then comes to rest. Every agent first takes its own best plan; then two rounds
  of best responses, agent by agent, add a penalty of 4/N for each of those steps at which the plan would overlap
  another agent's current plan. The first move of each plan is taken. The strongest yardstick at large N.

- oracle (speaker-listener and reference): every mover heads for its goal landmark, read from the world instead of
  from the messages, with the two-step lookahead of `scripted`; no message is sent (speaker-listener's speaker says
  its first word, reference's agents say word 0). It shows what perfect communication is worth.

Nearest landmark and scripted steer clear of nobody: they show what a simple rule achieves.

    python reference_policies.py --n-agents 1 2 3 4 6 8 10 --episodes 200 --out docs/benchmark/reference_policies.json
"""

import dataclasses
import importlib
import itertools
import json
from collections import defaultdict

import numpy as np
import tyro
from scipy.optimize import linear_sum_assignment

DT, DAMPING, SENSITIVITY = 0.1, 0.25, 5.0  # mpe2's time step, velocity damping and action force scale
CONTACT_FORCE, CONTACT_MARGIN = 100.0, 1e-3  # mpe2's soft collision: force scale and softplus margin
AGENT_SIZE = 0.15  # spread's agents overlap (and collide) when closer than twice this
MOVES = np.array(
    [[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]]
)  # discrete action: none, -x, +x, -y, +y
PLAN = np.array(list(itertools.product(range(len(MOVES)), repeat=4)))  # (625, 4): the planner's move sequences


@dataclasses.dataclass
class Args:
    n_agents: list[int] = dataclasses.field(default_factory=lambda: [3, 6, 10])
    """team sizes of simple_spread_v3 to measure"""
    episodes: int = 100
    """episodes per policy, scenario and team size (env k reset with seed + k)"""
    seed: int = 0
    """seed of the first episode and of the random policy"""
    out: str | None = None
    """JSON file for the results: {env_id: {N: {policy: [mean, standard error]}}}"""


def positions(world) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The agents' positions and velocities (n_agents, 2) and the landmarks' positions (n_landmarks, 2)."""
    agents = np.array([a.state.p_pos for a in world.agents])
    velocities = np.array([a.state.p_vel for a in world.agents])
    return agents, velocities, np.array([landmark.state.p_pos for landmark in world.landmarks])


def contact_forces(agents: np.ndarray) -> np.ndarray:
    """(n_agents, 2): mpe2's soft contact force on each agent from all the others (`World.get_collision_force`),
    100 x the softplus penetration (margin 1e-3) along the line between them; nothing between agents apart."""
    delta = agents[:, None] - agents[None]  # (n_agents, n_agents, 2): p_i - p_j
    dist = np.linalg.norm(delta, axis=-1, keepdims=True)
    penetration = np.logaddexp(0, -(dist - 2 * AGENT_SIZE) / CONTACT_MARGIN) * CONTACT_MARGIN
    with np.errstate(invalid="ignore", divide="ignore"):  # an agent and itself: 0 / 0, dropped
        return np.nan_to_num(CONTACT_FORCE * delta / dist * penetration).sum(axis=1)


def moves_toward(agents: np.ndarray, velocities: np.ndarray, targets: np.ndarray, forces=None) -> np.ndarray:
    """(n_agents,) the discrete move that puts each agent nearest its target (n_agents, 2) two steps ahead, under
    mpe2's integration (the position moves with the old velocity, which is then damped and accelerated by the move's
    force and the other `forces` (n_agents, 2) on it)."""
    drift = agents + velocities * DT + velocities * (1 - DAMPING) * DT  # (n_agents, 2): where no force takes it
    pushed = 0.0 if forces is None else forces[:, None]  # (n_agents, 1, 2)
    ahead = drift[:, None] + (MOVES[None] * SENSITIVITY + pushed) * DT * DT  # (n_agents, 5, 2)
    return np.linalg.norm(ahead - targets[:, None], axis=-1).argmin(axis=1)


def nearest_landmark(world, rng: np.random.Generator) -> np.ndarray:
    agents, velocities, landmarks = positions(world)
    distances = np.linalg.norm(agents[:, None] - landmarks[None], axis=-1)  # (n_agents, n_landmarks)
    return moves_toward(agents, velocities, landmarks[distances.argmin(axis=1)])


def assigned_landmarks(agents: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """(n_agents, 2): each agent's landmark in the assignment of least total distance (no two agents share one)."""
    _, assigned = linear_sum_assignment(np.linalg.norm(agents[:, None] - landmarks[None], axis=-1))
    return landmarks[assigned]  # rows come back in order 0..n-1


def scripted(world, rng: np.random.Generator) -> np.ndarray:
    agents, velocities, landmarks = positions(world)
    return moves_toward(agents, velocities, assigned_landmarks(agents, landmarks), contact_forces(agents))


def rollout(start: np.ndarray, velocity: np.ndarray, forces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions (..., steps, 2) an agent passes under mpe2's integration with the forces (..., steps, 2), one a
    step, and (..., 2) where it then comes to rest (its velocity damped by 0.75 a step: v * dt / 0.25 further)."""
    position, path = np.broadcast_to(start, forces.shape[:-2] + start.shape[-1:]), []
    for t in range(forces.shape[-2]):
        position, velocity = position + velocity * DT, velocity * (1 - DAMPING) + forces[..., t, :] * DT
        path.append(position)
    return np.stack(path, axis=-2), position + velocity * DT / DAMPING


def planner(world, rng: np.random.Generator) -> np.ndarray:
    agents, velocities, landmarks = positions(world)
    n_agents, targets = len(agents), assigned_landmarks(agents, landmarks)
    forces = np.concatenate([MOVES[PLAN], np.zeros((len(PLAN), 1, 2))], axis=1) * SENSITIVITY  # (625, 5, 2)
    contact, paths, costs = contact_forces(agents), [], []
    for i in range(n_agents):
        path, rest = rollout(agents[i], velocities[i], forces + np.eye(5)[0][:, None] * contact[i])  # (625, 5, 2)
        paths.append(path[:, 1:])  # steps 2 to 5, the ones its moves reach
        costs.append(
            np.linalg.norm(paths[-1] - targets[i], axis=-1).sum(axis=1) + np.linalg.norm(rest - targets[i], axis=-1)
        )
    chosen = [cost.argmin() for cost in costs]  # each agent's own best plan, then two rounds of best responses
    for i in list(range(n_agents)) * 2 if n_agents > 1 else []:
        others = np.stack([paths[j][chosen[j]] for j in range(n_agents) if j != i])  # (n_agents - 1, 4, 2)
        overlaps = np.linalg.norm(paths[i][:, None] - others[None], axis=-1) < 2 * AGENT_SIZE  # (625, n_agents - 1, 4)
        chosen[i] = (costs[i] + 4 / n_agents * overlaps.sum(axis=(1, 2))).argmin()
    return PLAN[chosen, 0]


def oracle_listener(world, rng: np.random.Generator) -> np.ndarray:
    """Speaker-listener: the speaker (agent 0) says word 0, the listener heads for the speaker's goal landmark."""
    agents, velocities, _ = positions(world)
    move = moves_toward(agents[1:], velocities[1:], world.agents[0].goal_b.state.p_pos[None])
    return np.concatenate([[0], move])


def oracle_pair(world, rng: np.random.Generator) -> np.ndarray:
    """Reference: each agent heads for the landmark that the other one holds as its goal; action = move + 5 * word,
    word 0."""
    agents, velocities, _ = positions(world)
    return moves_toward(agents, velocities, np.array([world.agents[1 - i].goal_b.state.p_pos for i in range(2)]))


def random_actions(world, rng: np.random.Generator, n_actions: list[int]) -> np.ndarray:
    return rng.integers(n_actions)


# Each scenario's policies besides the random one
POLICIES = {
    "simple_spread_v3": {"nearest landmark": nearest_landmark, "scripted": scripted, "planner": planner},
    "simple_speaker_listener_v4": {"oracle": oracle_listener},
    "simple_reference_v3": {"oracle": oracle_pair},
}


def measure(env_id: str, policy, n_agents: int, episodes: int, seed: int) -> tuple[float, float]:
    """Mean per-agent episode return on mpe2's `env_id` (25 steps; `n_agents` for spread), and its standard error
    over episodes; `policy` None is the random one."""
    env = importlib.import_module(f"mpe2.{env_id}").parallel_env(**({"N": n_agents} if "spread" in env_id else {}))
    n_actions, rng = [env.action_space(agent).n for agent in env.possible_agents], np.random.default_rng(seed)
    returns = np.zeros(episodes)
    for k in range(episodes):
        env.reset(seed=seed + k)
        while env.agents:
            world = env.unwrapped.world
            actions = random_actions(world, rng, n_actions) if policy is None else policy(world, rng)
            _, rewards, *_ = env.step({agent: int(a) for agent, a in zip(env.agents, actions)})
            returns[k] += np.mean(list(rewards.values()))
    return float(returns.mean()), float(returns.std(ddof=1) / np.sqrt(episodes))


def main(args: Args) -> dict:
    """{env_id: {N: {policy: (mean, standard error)}}} for spread at each of `args.n_agents` and the other two
    scenarios at their two agents, printed as one table."""
    results = defaultdict(dict)
    print("| scenario | N | policy | return per agent |\n|---|---|---|---|")
    for env_id, policies in POLICIES.items():
        for n in args.n_agents if "spread" in env_id else [2]:
            for name, policy in {"random": None, **policies}.items():
                results[env_id].setdefault(str(n), {})[name] = measure(env_id, policy, n, args.episodes, args.seed)
                mean, error = results[env_id][str(n)][name]
                print(f"| {env_id} | {n} | {name} | {mean:.2f} ± {error:.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return dict(results)


if __name__ == "__main__":
    main(tyro.cli(Args))
