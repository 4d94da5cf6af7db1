"""A small PettingZoo parallel env for the tests, in which an agent dies at a known step.

Three agents. Agent i observes (i, the step, its last action's first number) and acts with one of 2 + i discrete
actions, or with `continuous` a vector in Box(-2, 2) of 1 + i numbers; its reward is the sum of its action.
agent_1 leaves the episode (is terminated) at step `death_step`; the episode is truncated after `max_cycles` steps,
which the env keeps as `limit`. With `death_chance`, each agent also dies at each step with that chance, drawn from
numpy's global generator; `action_start` numbers the discrete actions from there (gymnasium's `Discrete(n, start)`).
Trained with `--env-id tests.dying_env`.
"""

import numpy as np
from gymnasium.spaces import Box, Discrete
from pettingzoo import ParallelEnv


class DyingEnv(ParallelEnv):
    metadata = {"name": "dying_env_v0"}

    def __init__(
        self, death_step=3, max_cycles=6, continuous=False, death_chance=0.0, action_start=0, render_mode=None
    ):
        self.possible_agents = ["agent_0", "agent_1", "agent_2"]
        self.death_step, self.limit, self.death_chance = death_step, max_cycles, death_chance
        self.render_mode = render_mode
        self.action_spaces = {
            a: Box(-2.0, 2.0, (1 + i,), np.float32) if continuous else Discrete(2 + i, start=action_start)
            for i, a in enumerate(self.possible_agents)
        }

    def observation_space(self, agent: str) -> Box:
        return Box(-np.inf, np.inf, (3,), np.float32)

    def action_space(self, agent: str):
        return self.action_spaces[agent]

    def observe(self, agent: str, action) -> np.ndarray:
        return np.array([self.possible_agents.index(agent), self.t, np.ravel(action)[0]], dtype=np.float32)

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return {a: self.observe(a, 0) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict):
        assert all(
            self.action_spaces[a].contains(np.asarray(actions[a], dtype=self.action_spaces[a].dtype))
            for a in self.agents
        ), actions
        self.t += 1
        observations = {a: self.observe(a, actions[a]) for a in self.agents}
        rewards = {a: float(np.sum(actions[a])) for a in self.agents}
        dies = np.random.random(len(self.agents)) < self.death_chance
        terminations = {a: a == "agent_1" and self.t == self.death_step or d for a, d in zip(self.agents, dies)}
        truncations = {a: self.t >= self.limit for a in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return observations, rewards, terminations, truncations, {a: {} for a in observations}


def parallel_env(**kwargs) -> DyingEnv:
    return DyingEnv(**kwargs)
