"""A small PettingZoo parallel env for the tests that fails on request, as a user's env with a bug would.

Two agents observe (their index, the step) and act with one of 3 discrete actions; each gets the reward 1 per step
and the episode is truncated after `max_cycles` steps. With `fail`, the env goes wrong at its `at_call`-th call of
that kind (counted over the env's life, so over episodes): "construct" raises ValueError in the constructor,
"reset", "step", "state" or "render" raise RuntimeError there, "nonfinite" returns NaN observations and rewards from
that step on, "wide" observations of 3 numbers where its space says 2 (until the next reset); "reseed" raises in a
reset given a seed from `at_call` to 99,999, as a resumed run's envs get (the evaluation envs' are above); "leave"
terminates the last agent at step `at_call` of each episode, and `state()` then raises, as multiwalker's does once
a walker fell (terminate_on_fall False); "joined_state" joins in `state()` the observations of the agents still
playing, as many users write it, which raises once all have left, after the last step; "wide_state" gives a state of
one number more than its `state_space`. Trained with `--env-id tests.faulty_env`.
"""

import numpy as np
from gymnasium.spaces import Box, Discrete
from pettingzoo import ParallelEnv


class FaultyEnv(ParallelEnv):
    metadata = {"name": "faulty_env_v0", "render_modes": ["rgb_array"]}

    def __init__(self, fail="none", at_call=1, max_cycles=5, n_agents=2, render_mode=None):
        if fail == "construct":
            raise ValueError(f"n_agents must be positive, got {n_agents}")
        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        self.fail, self.at_call, self.max_cycles, self.render_mode = fail, at_call, max_cycles, render_mode
        self.calls = {"reset": 0, "step": 0, "state": 0, "render": 0}
        self.state_space = Box(-np.inf, np.inf, (2 * n_agents,), np.float32)

    def observation_space(self, agent: str) -> Box:
        return Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent: str) -> Discrete:
        return Discrete(3)

    def goes_wrong(self, call: str, mode: str | None = None) -> bool:
        """Counts a call of this kind; whether `fail` asks for `mode` (the call's own by default) from this call on."""
        self.calls[call] += 1
        return self.fail == (mode or call) and self.calls[call] >= self.at_call

    def observe(self) -> dict:
        value = np.nan if self.nonfinite else self.t
        return {
            a: np.array([i, value, 0][: 2 + self.wide], dtype=np.float32) for i, a in enumerate(self.possible_agents)
        }

    def reset(self, seed=None, options=None):
        if self.goes_wrong("reset") or self.fail == "reseed" and seed is not None and self.at_call <= seed < 100_000:
            raise RuntimeError("reset failed on purpose")
        self.agents, self.t, self.nonfinite, self.wide = list(self.possible_agents), 0, False, False
        return self.observe(), {a: {} for a in self.agents}

    def step(self, actions: dict):
        self.nonfinite = self.nonfinite or self.goes_wrong("step", "nonfinite")
        self.wide = self.fail == "wide" and self.calls["step"] >= self.at_call
        if self.fail == "step" and self.calls["step"] >= self.at_call:
            raise RuntimeError("step failed on purpose")
        self.t += 1
        rewards = {a: np.nan if self.nonfinite else 1.0 for a in self.agents}
        truncations = {a: self.t >= self.max_cycles for a in self.agents}
        leaves = self.fail == "leave" and self.t >= self.at_call  # the last agent, if still in the episode
        terminations = {a: leaves and a == self.possible_agents[-1] for a in self.agents}
        self.agents = [a for a in self.agents if not terminations[a]] if self.t < self.max_cycles else []
        return self.observe(), rewards, terminations, truncations, {a: {} for a in rewards}

    def state(self) -> np.ndarray:
        if self.goes_wrong("state") or self.fail == "leave" and len(self.agents) < len(self.possible_agents):
            raise RuntimeError("state failed on purpose")
        if self.fail == "wide_state":
            return np.zeros(self.state_space.shape[0] + 1, dtype=np.float32)
        observations = self.observe()  # "joined_state": of the agents still playing, none after the last step
        return np.concatenate([observations[a] for a in (self.agents if self.fail == "joined_state" else observations)])

    def render(self) -> np.ndarray:
        if self.goes_wrong("render"):
            raise RuntimeError("render failed on purpose")
        return np.zeros((8, 8, 3), dtype=np.uint8)


def parallel_env(**kwargs) -> FaultyEnv:
    return FaultyEnv(**kwargs)
