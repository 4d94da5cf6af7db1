"""A small cooperative env in which wandering off is fatal, for probing the defaults (docs/panel.md).

Four agents move by 0.1 (none, -x, +x, -y, +y) in the square [-1, 1]^2 for `max_cycles` steps, towards as many
targets. Each step every living agent gets the team reward: `reward="negative"` minus the mean over targets of the
nearest living agent's distance, `"positive"` one minus it, `"steep"` one minus four times it (negative for agents
that stand still, positive near the targets); and minus `death_penalty` for each agent that left the
square at that step, which dies (the episode ends when all have). Agent i observes its position and the targets
relative to it; odd agents also see their teammates, so the observation sizes differ. Trained with
`--env-id tests.arena_env`.
"""

import numpy as np
from gymnasium.spaces import Box, Discrete
from pettingzoo import ParallelEnv

MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], dtype=np.float64) * 0.1


class ArenaEnv(ParallelEnv):
    metadata = {"name": "arena_v0"}

    def __init__(self, n_agents=4, max_cycles=40, death_penalty=10.0, reward="negative", render_mode=None):
        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        self.n, self.max_cycles, self.death_penalty, self.render_mode = n_agents, max_cycles, death_penalty, render_mode
        shapes = {"negative": (0.0, 1.0), "positive": (1.0, 1.0), "steep": (1.0, 4.0)}
        self.offset, self.distance_weight = shapes[reward]
        self.rng = np.random.default_rng()

    def observation_space(self, agent: str) -> Box:
        teammates = 2 * (self.n - 1) if self.possible_agents.index(agent) % 2 else 0
        return Box(-np.inf, np.inf, (2 + 2 * self.n + teammates,), np.float32)

    def action_space(self, agent: str) -> Discrete:
        return Discrete(5)

    def observe(self) -> dict:
        observations = {}
        for i, agent in enumerate(self.possible_agents):
            parts = [self.pos[i], (self.targets - self.pos[i]).ravel()]
            if i % 2:
                parts.append((np.delete(self.pos, i, axis=0) - self.pos[i]).ravel())
            if agent in self.agents:
                observations[agent] = np.concatenate(parts).astype(np.float32)
        return observations

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        self.pos = self.rng.uniform(-0.7, 0.7, (self.n, 2))
        self.targets = self.rng.uniform(-0.9, 0.9, (self.n, 2))
        self.alive = np.ones(self.n, dtype=bool)
        return self.observe(), {a: {} for a in self.agents}

    def step(self, actions: dict):
        self.t += 1
        for i, agent in enumerate(self.possible_agents):
            if agent in actions:
                self.pos[i] += MOVES[int(actions[agent])]
        died = self.alive & (np.abs(self.pos) > 1.0).any(axis=1)
        self.alive &= ~died
        dist = np.linalg.norm(self.targets[:, None] - self.pos[None], axis=-1)  # (targets, agents)
        nearest = np.where(self.alive[None], dist, 2.0).min(axis=1)  # a dead agent covers nothing
        team = self.offset - self.distance_weight * nearest.mean() - self.death_penalty * died.sum()
        observations = self.observe()
        rewards = {a: team for a in self.agents}
        terminations = {a: bool(died[self.possible_agents.index(a)]) for a in self.agents}
        truncations = {a: self.t >= self.max_cycles for a in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return observations, rewards, terminations, truncations, {a: {} for a in observations}


def parallel_env(**kwargs) -> ArenaEnv:
    return ArenaEnv(**kwargs)
