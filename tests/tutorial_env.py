"""A user's env written as PettingZoo's custom-environment tutorial writes one: a `ParallelEnv` subclass in a module
without a `parallel_env` function, a constructor without `render_mode`, MultiDiscrete observations, spaces behind
`functools.lru_cache`, and no `state()` or `state_space`. Two agents on a 7x7 grid, 5 moves each (stay, left, right,
down, up), each rewarded minus a twelfth of their Manhattan distance at every step; episodes are truncated after 30
steps. Trained with `--env-id tests.tutorial_env:MeetEnv` (or `tests.tutorial_env.MeetEnv`). `PlainMeetEnv` has the
same methods without subclassing `ParallelEnv` (so no `unwrapped`, `state` or `close`).
"""

import functools

import numpy as np
from gymnasium.spaces import Discrete, MultiDiscrete
from pettingzoo import ParallelEnv

MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]])


class MeetEnv(ParallelEnv):
    metadata = {"name": "meet_v0"}

    def __init__(self):
        self.possible_agents = ["blue", "red"]
        self.rng = np.random.default_rng()

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.timestep = 0
        self.positions = self.rng.integers(0, 7, size=(2, 2))
        return self.observations(), {agent: {} for agent in self.agents}

    def step(self, actions):
        for i, agent in enumerate(self.possible_agents):
            self.positions[i] = np.clip(self.positions[i] + MOVES[actions[agent]], 0, 6)
        self.timestep += 1
        distance = np.abs(self.positions[0] - self.positions[1]).sum()
        rewards = {agent: -distance / 12 for agent in self.agents}
        terminations = {agent: False for agent in self.agents}
        truncations = {agent: self.timestep >= 30 for agent in self.agents}
        observations = self.observations()
        if self.timestep >= 30:
            self.agents = []
        return observations, rewards, terminations, truncations, {agent: {} for agent in self.possible_agents}

    def observations(self):
        return {agent: self.positions.flatten() for agent in self.agents}

    def render(self):
        grid = np.full((7, 7), ".")
        grid[tuple(self.positions[0])], grid[tuple(self.positions[1])] = "B", "R"
        print("\n".join(" ".join(row) for row in grid))

    @functools.lru_cache(maxsize=None)  # noqa: B019, UP033 (as the tutorial writes it)
    def observation_space(self, agent):
        return MultiDiscrete([7] * 4)

    @functools.lru_cache(maxsize=None)  # noqa: B019, UP033 (as the tutorial writes it)
    def action_space(self, agent):
        return Discrete(5)


PlainMeetEnv = type(
    "PlainMeetEnv", (), {k: v for k, v in vars(MeetEnv).items() if k not in ("__dict__", "__weakref__")}
)
