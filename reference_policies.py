"""Hand-written policies for simple_spread_v3 at any number of agents, measured on mpe2 itself: the yardsticks that
the benchmark's plots and tables draw next to the learned policies.

- random: uniformly random discrete actions.
- nearest landmark: every agent heads for the landmark nearest to it, even when another agent does too.
- scripted: at every step an optimal assignment of agents to landmarks (`scipy.optimize.linear_sum_assignment` on
  their distances, so that no two agents head for the same landmark); each agent then takes the move that brings
  it closest to its landmark two steps ahead, the first position its action reaches (mpe2 moves an agent with its
  velocity before the force changes it).

They know nothing of collisions, so they are not the best reachable: they show what a simple rule achieves.

    python reference_policies.py --n-agents 1 2 3 4 6 8 10 --episodes 100 --out docs/benchmark/reference_policies.json
"""

import dataclasses
import json

import numpy as np
import tyro
from mpe2 import simple_spread_v3
from scipy.optimize import linear_sum_assignment

DT, DAMPING, SENSITIVITY = 0.1, 0.25, 5.0  # mpe2's time step, velocity damping and action force scale
MOVES = np.array(
    [[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]]
)  # discrete action: none, -x, +x, -y, +y


@dataclasses.dataclass
class Args:
    n_agents: list[int] = dataclasses.field(default_factory=lambda: [3, 6, 10])
    """team sizes of simple_spread_v3 to measure"""
    episodes: int = 100
    """episodes per policy and team size (env k reset with seed + k)"""
    seed: int = 0
    """seed of the first episode and of the random policy"""
    out: str | None = None
    """JSON file for the results: {"simple_spread_v3": {N: {policy: [mean, standard error]}}}"""


def positions(world) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The agents' positions and velocities (n_agents, 2) and the landmarks' positions (n_landmarks, 2)."""
    agents = np.array([a.state.p_pos for a in world.agents])
    velocities = np.array([a.state.p_vel for a in world.agents])
    return agents, velocities, np.array([landmark.state.p_pos for landmark in world.landmarks])


def moves_toward(agents: np.ndarray, velocities: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """(n_agents,) the discrete move that puts each agent nearest its target (n_agents, 2) two steps ahead, under
    mpe2's integration (the position moves with the old velocity, which is then damped and accelerated)."""
    drift = agents + velocities * DT + velocities * (1 - DAMPING) * DT  # (n_agents, 2): where no force takes it
    ahead = drift[:, None] + MOVES[None] * SENSITIVITY * DT * DT  # (n_agents, 5, 2)
    return np.linalg.norm(ahead - targets[:, None], axis=-1).argmin(axis=1)


def nearest_landmark(world, rng: np.random.Generator) -> np.ndarray:
    agents, velocities, landmarks = positions(world)
    distances = np.linalg.norm(agents[:, None] - landmarks[None], axis=-1)  # (n_agents, n_landmarks)
    return moves_toward(agents, velocities, landmarks[distances.argmin(axis=1)])


def scripted(world, rng: np.random.Generator) -> np.ndarray:
    agents, velocities, landmarks = positions(world)
    distances = np.linalg.norm(agents[:, None] - landmarks[None], axis=-1)
    _, assigned = linear_sum_assignment(distances)  # row i's landmark; rows come back in order 0..n-1
    return moves_toward(agents, velocities, landmarks[assigned])


def random_actions(world, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(len(MOVES), size=len(world.agents))


POLICIES = {"random": random_actions, "nearest landmark": nearest_landmark, "scripted": scripted}


def measure(policy, n_agents: int, episodes: int, seed: int) -> tuple[float, float]:
    """Mean per-agent episode return on mpe2's simple_spread_v3 (25 steps), and its standard error over episodes."""
    env, rng = simple_spread_v3.parallel_env(N=n_agents), np.random.default_rng(seed)
    returns = np.zeros(episodes)
    for k in range(episodes):
        env.reset(seed=seed + k)
        while env.agents:
            actions = policy(env.unwrapped.world, rng)
            _, rewards, *_ = env.step({agent: int(a) for agent, a in zip(env.agents, actions)})
            returns[k] += np.mean(list(rewards.values()))
    return float(returns.mean()), float(returns.std(ddof=1) / np.sqrt(episodes))


def main(args: Args) -> dict:
    results = {}
    print("| N | " + " | ".join(POLICIES) + " |\n|---|" + "---|" * len(POLICIES))
    for n in args.n_agents:
        results[str(n)] = {name: measure(p, n, args.episodes, args.seed) for name, p in POLICIES.items()}
        print(f"| {n} | " + " | ".join(f"{m:.2f} ± {se:.2f}" for m, se in results[str(n)].values()) + " |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"simple_spread_v3": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
