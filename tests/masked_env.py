"""A small PettingZoo parallel env whose action masks matter, for the tests and the masks' learning runs.

Two agents on a 5x5 grid, each with a goal cell. Actions: 0 stay, 1 left, 2 right, 3 down, 4 up. At every step
each move off the grid is unavailable, and each other move is blocked with probability `blocked` (walls the
observation does not show, drawn anew every step); staying is always available. The available actions are in each
agent's info (`masks="info"`), in a Dict observation {"observation", "action_mask"} (`masks="observation"`), or
nowhere (`masks="none"`: the same env, its walls unseen by the policy). An unavailable action leaves the agent where
it is, costs it 1, and is counted in `unavailable` (with `strict`, it raises instead). Each step costs an agent its
Manhattan distance to its goal over 8; an agent on its goal leaves the episode (terminated); the episode is truncated
after `max_cycles` steps. Observation: own cell, own goal, the other agent's cell (or -1s once it left), over 4.

Faults for the tests: `bad_mask="size"` gives masks of 4 values; `bad_mask="empty"` gives agent "a" a mask that
allows nothing at the env's `at_step`-th step. Trained with `--env-id tests.masked_env`.
"""

import numpy as np
from gymnasium.spaces import Box, Dict, Discrete
from pettingzoo import ParallelEnv

MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]])
SIZE = 5


class MaskedEnv(ParallelEnv):
    metadata = {"name": "masked_env_v0"}

    def __init__(
        self, masks="info", blocked=0.5, max_cycles=20, strict=False, bad_mask="", at_step=0, render_mode=None
    ):
        self.possible_agents = ["a", "b"]
        self.masks, self.blocked, self.max_cycles, self.strict = masks, blocked, max_cycles, strict
        self.bad_mask, self.at_step, self.render_mode = bad_mask, at_step, render_mode
        self.rng, self.unavailable, self.steps = np.random.default_rng(), 0, 0
        self.box = Box(-1.0, 1.0, (6,), np.float32)

    def observation_space(self, agent: str):
        if self.masks == "observation":
            return Dict({"observation": self.box, "action_mask": Box(0, 1, (5,), np.int8)})
        return self.box

    def action_space(self, agent: str) -> Discrete:
        return Discrete(5)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        cells = self.rng.choice(SIZE * SIZE, size=4, replace=False)
        self.pos, self.goal = np.divmod(cells[:2], SIZE), np.divmod(cells[2:], SIZE)
        self.pos, self.goal = np.stack(self.pos, axis=1), np.stack(self.goal, axis=1)  # (2, 2) each
        self.draw_masks()
        return self.observations(), self.infos()

    def draw_masks(self):
        """(2, 5) int8: this step's available actions of each agent."""
        ahead = self.pos[:, None] + MOVES  # (2, 5, 2)
        on_grid = ((ahead >= 0) & (ahead < SIZE)).all(axis=-1)
        open_ = self.rng.random((2, 5)) >= self.blocked
        self.avail = (on_grid & open_).astype(np.int8)
        self.avail[:, 0] = 1
        if self.bad_mask == "empty" and self.steps + 1 == self.at_step:
            self.avail[0] = 0
        if self.bad_mask == "size":
            self.avail = self.avail[:, :4]

    def observations(self) -> dict:
        out = {}
        for i, agent in enumerate(self.possible_agents):
            if agent in self.agents:
                other = self.pos[1 - i] if self.possible_agents[1 - i] in self.agents else np.array([-SIZE, -SIZE])
                obs = np.concatenate([self.pos[i], self.goal[i], other]).astype(np.float32) / (SIZE - 1)
                out[agent] = {"observation": obs, "action_mask": self.avail[i]} if self.masks == "observation" else obs
        return out

    def infos(self) -> dict:
        index = self.possible_agents.index
        return {a: {"action_mask": self.avail[index(a)]} if self.masks == "info" else {} for a in self.agents}

    def step(self, actions: dict):
        self.t, self.steps = self.t + 1, self.steps + 1
        rewards = {}
        for agent in self.agents:
            i, action = self.possible_agents.index(agent), int(actions[agent])
            if self.avail[i, action]:
                self.pos[i] += MOVES[action]
            elif self.strict:
                raise ValueError(f"{agent} took action {action}, unavailable at step {self.t}")
            else:
                self.unavailable += 1
            rewards[agent] = -np.abs(self.pos[i] - self.goal[i]).sum() / 8 - (not self.avail[i, action])
        terminations = {a: bool((self.pos[k] == self.goal[k]).all()) for k, a in enumerate(self.possible_agents)}
        terminations = {a: terminations[a] for a in self.agents}
        truncations = {a: self.t >= self.max_cycles for a in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        self.draw_masks()
        return self.observations(), rewards, terminations, truncations, self.infos()

    def render(self):
        grid = np.zeros((SIZE, SIZE, 3), dtype=np.uint8)
        for (x, y), colour in zip(self.pos, ([255, 0, 0], [0, 0, 255])):
            grid[x, y] = colour
        return np.kron(grid, np.ones((8, 8, 1), dtype=np.uint8))


def parallel_env(**kwargs) -> MaskedEnv:
    return MaskedEnv(**kwargs)


def greedy_action(obs: np.ndarray, mask: np.ndarray) -> int:
    """The hand-written policy: among the available actions, the one that brings the agent nearest its goal."""
    pos, goal = np.rint(obs[:2] * (SIZE - 1)), np.rint(obs[2:4] * (SIZE - 1))
    distances = [np.abs(pos + move - goal).sum() if mask[a] else np.inf for a, move in enumerate(MOVES)]
    return int(np.argmin(distances))


class ContinuousMaskedEnv(MaskedEnv):
    """Box actions and masks in the info: refused at start, as masks need Discrete actions."""

    def action_space(self, agent: str) -> Box:
        return Box(-1.0, 1.0, (2,), np.float32)
