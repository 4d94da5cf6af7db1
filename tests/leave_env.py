"""A small PettingZoo parallel env whose team optimum needs the credit an agent earns after it has left (died).

Two agents, episodes truncated after 10 steps. Each step agent 0 may stay (action 0) or leave the episode for good
(action 1); agent 1's two actions do nothing. Each observes (the step / 10, whether agent 0 has left).
- `mode="costly"`: leaving costs the team. Every agent in the episode gets -1 a step; once agent 0 has left,
  agent 1 gets -5 a step. Best: agent 0 stays, -10 per agent. Leaving at once gives (-1 - 46) / 2 = -23.5 per agent,
  but spares agent 0 its own -1s: an agent whose credit stops at its death learns to leave.
- `mode="helpful"`: leaving pays the team and costs the one who leaves. Every agent in the episode gets +1 a step,
  agent 0 gets -2 on the step it leaves, and after that agent 1 gets +4 a step. Best: agent 0 leaves at once,
  (-2 + 37) / 2 = 17.5 per agent against 10 for staying; an agent whose credit stops at its death stays.
Trained with `--env-id tests.leave_env --env-kwargs mode costly` (or helpful).
"""

import numpy as np
from gymnasium.spaces import Box, Discrete
from pettingzoo import ParallelEnv

MODES = {"costly": (-1.0, -1.0, -5.0), "helpful": (1.0, -2.0, 4.0)}  # a step's reward, leaving's, the other's after


class LeaveEnv(ParallelEnv):
    metadata = {"name": "leave_v0"}

    def __init__(self, mode="costly", max_cycles=10):
        self.possible_agents = ["agent_0", "agent_1"]
        self.step_reward, self.leave_reward, self.after_reward = MODES[mode]
        self.max_cycles = max_cycles

    def observation_space(self, agent):
        return Box(0.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return Discrete(2)

    def observations(self, agents):
        left = float("agent_0" not in self.agents)
        return {a: np.array([self.t / self.max_cycles, left], dtype=np.float32) for a in agents}

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return self.observations(self.agents), {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        leaves = "agent_0" in self.agents and actions["agent_0"] == 1
        rewards = {a: self.step_reward for a in self.agents}
        if leaves:
            rewards["agent_0"] = self.leave_reward
        elif "agent_0" not in self.agents:
            rewards["agent_1"] = self.after_reward
        terminations = {a: a == "agent_0" and leaves for a in self.agents}
        truncations = {a: self.t >= self.max_cycles for a in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return self.observations(rewards), rewards, terminations, truncations, {a: {} for a in rewards}


def parallel_env(**kwargs) -> LeaveEnv:
    return LeaveEnv(**kwargs)
