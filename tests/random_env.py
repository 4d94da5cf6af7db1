"""A PettingZoo parallel env whose every behaviour is set by keyword arguments (`--env-kwargs`), for the random-env
check (`python benchmark.py random-envs`, `random_env_configs` there) and the tests: each observation and action kind
the README names and those it refuses, action masks in both places, state kinds, episode kinds, deaths and faults.

- `n_agents`; `obs`: "box" (3 numbers), "box2d" ((2, 3)), "sizes" (agent i: 2 + i numbers), "long" (1,500
  numbers: three agents' joined exceed the scripts' 4,096), "discrete" (Discrete(4)),
  "multidiscrete" ([3, 2]), "multibinary" (3), and refused: "image" ((64, 64, 3)), "tuple"; `wide_obs`: agent 0
  observes one number more than its space (with "sizes", within the padding of the larger agents);
- `action`: "discrete" (agent i: Discrete(2 + i, start=`action_start`)), "discrete3" (every agent Discrete(3): many
  agents without many actions), "box" (Box(-2, 2, (1 + i,))), and refused:
  "box_unbounded" (-inf to inf), "box_half" (-inf to 1), "multidiscrete", "mixed" (agent 0 Discrete, the rest Box);
- `masks`: "", "info" or "observation" (a Dict observation), each step a random half of the moves but the first
  allowed, as `mask_dtype`; `masks_at_reset` False leaves them out of reset's infos; a forbidden action raises
  ValueError("forbidden action ..."): the runner's "forbidden action";
- `state`: "none" (no state(): the base class raises), "box" (state_space Box((5,)) and a state() that answers),
  "left" (state() raises once an agent left), "wrong_size" (6 numbers for its 5), "infinite" (+inf from the
  `fault_at`-th env step on);
- `limit`: steps before truncation (0: none); `death_chance`: each agent leaves (dies) with it each step once the env
  has made `deaths_from` steps over its life, the episode ends when all have;
- `fault`: "" or the call that fails at the env's `fault_at`-th step counted over its life: "reset" (the first reset
  after it), "step", "nan_obs", "inf_obs_dying" (an agent's last observation, on the step it dies, is +inf),
  "nan_reward"; faults raise RuntimeError("fault ...").
"""

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

OBS_SPACES = {
    "box": lambda i: spaces.Box(-1.0, 1.0, (3,), np.float32),
    "box2d": lambda i: spaces.Box(-1.0, 1.0, (2, 3), np.float32),
    "sizes": lambda i: spaces.Box(-1.0, 1.0, (2 + i,), np.float32),
    "long": lambda i: spaces.Box(-1.0, 1.0, (1500,), np.float32),
    "discrete": lambda i: spaces.Discrete(4),
    "multidiscrete": lambda i: spaces.MultiDiscrete([3, 2]),
    "multibinary": lambda i: spaces.MultiBinary(3),
    "image": lambda i: spaces.Box(0, 255, (64, 64, 3), np.uint8),
    "tuple": lambda i: spaces.Tuple([spaces.Discrete(2), spaces.Discrete(3)]),
}


class RandomEnv(ParallelEnv):
    metadata = {"name": "random_env_v0"}

    def __init__(
        self,
        n_agents=2,
        obs="box",
        wide_obs=False,
        action="discrete",
        action_start=0,
        masks="",
        mask_dtype="int8",
        masks_at_reset=True,
        state="none",
        limit=10,
        death_chance=0.0,
        deaths_from=0,
        fault="",
        fault_at=0,
        render_mode=None,
    ):
        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        self.obs, self.wide_obs, self.action, self.masks, self.mask_dtype = obs, wide_obs, action, masks, mask_dtype
        self.masks_at_reset, self.state_kind, self.limit, self.death_chance = masks_at_reset, state, limit, death_chance
        self.deaths_from = deaths_from
        self.fault, self.fault_at, self.render_mode, self.action_start = fault, fault_at, render_mode, action_start
        self.obs_spaces = {a: OBS_SPACES[obs](i) for i, a in enumerate(self.possible_agents)}
        self.action_spaces = {a: self.make_action_space(i) for i, a in enumerate(self.possible_agents)}
        self.mask_sizes = {a: spaces.flatdim(s) for a, s in self.action_spaces.items()}
        if masks == "observation":
            self.obs_spaces = {
                a: spaces.Dict({"observation": s, "action_mask": spaces.MultiBinary(self.mask_sizes[a])})
                for a, s in self.obs_spaces.items()
            }
        if state in ("box", "left", "wrong_size", "infinite"):
            self.state_space = spaces.Box(-1.0, 1.0, (5,), np.float32)
        self.rng, self.steps = np.random.default_rng(0), 0

    def make_action_space(self, i: int):
        kind = {"mixed": "discrete" if i == 0 else "box"}.get(self.action, self.action)
        return {
            "discrete": lambda: spaces.Discrete(2 + i, start=self.action_start),
            "discrete3": lambda: spaces.Discrete(3),
            "box": lambda: spaces.Box(-2.0, 2.0, (1 + i,), np.float32),
            "box_unbounded": lambda: spaces.Box(-np.inf, np.inf, (1 + i,), np.float32),
            "box_half": lambda: spaces.Box(-np.inf, 1.0, (1 + i,), np.float32),
            "multidiscrete": lambda: spaces.MultiDiscrete([2, 3]),
        }[kind]()

    def observation_space(self, agent):
        return self.obs_spaces[agent]

    def action_space(self, agent):
        return self.action_spaces[agent]

    def faulty(self, kind: str) -> bool:
        return self.fault == kind and self.steps >= self.fault_at

    def observe(self, agent: str):
        space = OBS_SPACES[self.obs](self.possible_agents.index(agent))
        space.seed(int(self.rng.integers(1 << 31)))
        x = space.sample()
        if self.wide_obs and agent == "agent_0":
            x = np.append(np.ravel(x), 0.5).astype(np.float32)
        if self.faulty("nan_obs"):
            x = np.full(np.shape(x), np.nan, dtype=np.float32)
        if self.masks != "observation":
            return x
        return {"observation": x, "action_mask": self.current_masks[agent]}

    def draw_masks(self, every: bool = False):
        """Each agent's allowed actions for the next step: action 0, and the others with chance 1/2 (all: `every`)."""
        self.current_masks = {}
        for agent in self.agents:
            mask = (self.rng.random(self.mask_sizes[agent]) < 0.5) | every
            mask[0] = True
            self.current_masks[agent] = mask.astype(self.mask_dtype)

    def infos(self, with_masks: bool) -> dict:
        if self.masks != "info" or not with_masks:
            return {a: {} for a in self.agents}
        return {a: {"action_mask": self.current_masks[a]} for a in self.agents}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        if self.faulty("reset"):
            raise RuntimeError(f"fault in reset at env step {self.steps}")
        self.agents, self.t = list(self.possible_agents), 0
        self.draw_masks(every=not self.masks_at_reset)  # masks it does not give, it does not enforce
        return {a: self.observe(a) for a in self.agents}, self.infos(self.masks_at_reset)

    def step(self, actions):
        self.steps += 1
        if self.faulty("step"):
            raise RuntimeError(f"fault in step at env step {self.steps}")
        for agent in self.agents:
            action = actions[agent]
            space = self.action_spaces[agent]
            if (
                self.masks
                and isinstance(space, spaces.Discrete)
                and not self.current_masks[agent][action - space.start]
            ):
                raise ValueError(f"forbidden action {action} of {agent} at env step {self.steps}")
            if not self.action_spaces[agent].contains(np.asarray(action, dtype=self.action_spaces[agent].dtype)):
                raise ValueError(f"action {action} of {agent} outside its space at env step {self.steps}")
        self.t += 1
        dies = {a: self.rng.random() < self.death_chance and self.steps > self.deaths_from for a in self.agents}
        rewards = {a: float(self.rng.normal()) for a in self.agents}
        if self.faulty("nan_reward"):
            rewards[self.agents[0]] = float("nan")
        terminations = dict(dies)
        truncations = {a: bool(self.limit) and self.t >= self.limit for a in self.agents}
        self.draw_masks()
        observations = {a: self.observe(a) for a in self.agents}
        if self.faulty("inf_obs_dying") and any(dies.values()):
            dying = next(a for a, d in dies.items() if d)
            observations[dying] = np.full(np.shape(observations[dying]), np.inf, dtype=np.float32)
        infos = self.infos(True)
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return observations, rewards, terminations, truncations, infos

    def state(self):
        if self.state_kind == "none":
            return super().state()
        if self.state_kind == "left" and len(self.agents) < len(self.possible_agents):
            raise RuntimeError("state() cannot answer once an agent left")
        if self.state_kind == "infinite" and self.steps >= self.fault_at:
            return np.full(5, np.inf, dtype=np.float32)
        return np.zeros(6 if self.state_kind == "wrong_size" else 5, dtype=np.float32)

    def render(self):
        return np.zeros((8, 8, 3), dtype=np.uint8)


def parallel_env(**kwargs) -> RandomEnv:
    return RandomEnv(**kwargs)
