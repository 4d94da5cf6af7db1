"""Recurrent MAPPO (rMAPPO, Yu et al., 2022) for the cooperative PettingZoo MPE scenarios, in one file.

`mappo_mpe.py` with a GRU in the actor and the critic, as the official MAPPO runs MPE: zeroed at each episode's
start, replayed in training from each rollout's first hidden states.

    python mappo_mpe_rnn.py  # simple_spread_v3, 3 agents, tuned on mpe2
    python mappo_mpe_rnn.py --eval-checkpoint runs/<run_name>/model.pt --capture-video
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import importlib.util
import io
import itertools
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

import gymnasium
import imageio.v3 as iio
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from gymnasium import spaces
from torch import Tensor
from torch.distributions import Categorical, Normal
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Hyperparameters:
    """The task and the algorithm; `Args` adds the run's flags."""

    env_id: str = "simple_spread_v3"
    """an MPE scenario, or a PettingZoo parallel env's import path (my_env:MyEnv)"""
    n_agents: int = 3
    """spread: agents (and landmarks)"""
    sort_entities: bool = False
    """spread: landmarks and other agents ordered nearest first"""
    nearest_k: int = 0
    """spread: the actor sees the K nearest landmarks and K - 1 others; 0: all"""
    max_cycles: int = 25
    """MPE: steps per episode"""
    continuous_actions: bool = False
    """Box(0, 1) actions from a Gaussian policy"""
    n_rollout_threads: int = 32
    """parallel environments"""

    preset: Literal["tuned", "official"] = "tuned"
    """per-scenario settings (PRESETS): tuned on mpe2, or the official code's"""
    total_timesteps: int = 2_000_000
    """environment steps in all"""
    episode_length: int = 25
    """steps per environment per rollout"""
    lr: float = 7e-4
    """learning rate"""
    linear_lr_decay: bool = False
    """decay the learning rate linearly to 0"""
    ppo_epoch: int = 10
    """passes over each rollout"""
    num_mini_batch: int = 1
    """minibatches of whole envs per pass"""
    clip: float = 0.2
    """PPO clip of the policy ratio and the value change"""
    gamma: float = 0.0
    """discount; 0: clip(1 - 4 / T, 0.9, 0.99) for the env's time limit T"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 1.0
    """value loss coefficient"""
    max_grad_norm: float = 10.0
    """gradient norm clip per actor and critic"""
    hidden_size: int = 64
    """hidden layer and GRU width"""
    activation: Literal["tanh", "relu"] = "tanh"
    """hidden-layer activation"""
    use_valuenorm: bool = True
    """normalize the critic's targets by running statistics"""
    huber_delta: float = 10.0
    """delta of the Huber value loss"""
    clipped_value_loss: bool = True
    """PPO-clip the value loss too"""
    feature_norm: bool = True
    """LayerNorm on the network inputs"""
    use_agent_id: bool = True
    """the actor sees a one-hot agent id"""
    state_type: Literal["EP", "FP", "AS", "local"] = "EP"
    """critic input: EP env.state() once per env; FP state + id; AS state + own obs + id; local own obs + id"""
    separate_actors: bool = False
    """an actor per agent"""
    team_reward: bool = True
    """agents learn the team's mean reward, even once dead"""


MPE_SCENARIOS = ("simple_spread_v3", "simple_reference_v3", "simple_speaker_listener_v4")
# Per scenario, under the flags given (docs/tuning.md)
PRESETS = {
    "official": {
        "simple_spread_v3": {"gamma": 0.99},
        "simple_speaker_listener_v4": {"gamma": 0.99, "ppo_epoch": 15, "separate_actors": True, "activation": "relu"},
        "simple_reference_v3": {"gamma": 0.99, "ppo_epoch": 15, "activation": "relu"},
    },
    "tuned": {
        "simple_spread_v3": {"gamma": 0.9, "sort_entities": True, "n_rollout_threads": 64},
        "simple_speaker_listener_v4": {"gamma": 0.99, "ppo_epoch": 15, "separate_actors": True},
        "simple_reference_v3": {"gamma": 0.9, "ppo_epoch": 15, "activation": "relu", "n_rollout_threads": 128},
    },
}
CONTINUOUS_PRESETS = {"official": {}, "tuned": {"simple_spread_v3": {"ent_coef": 0.003}}}


# ---------- Networks


def layer_init(layer, gain: float = np.sqrt(2)):
    nn.init.orthogonal_(layer.weight, gain)
    if layer.bias is not None:
        nn.init.constant_(layer.bias, 0.0)
    return layer


def mlp(in_dim, args):
    """The official MAPPO trunk: [LayerNorm], then 2 x (Linear, activation, LayerNorm)."""
    hidden = args.hidden_size
    act, gain = {"tanh": nn.Tanh, "relu": nn.ReLU}[args.activation], nn.init.calculate_gain(args.activation)
    layers = [nn.LayerNorm(in_dim)] if args.feature_norm else []
    layers += [layer_init(nn.Linear(in_dim, hidden), gain), act(), nn.LayerNorm(hidden)]
    layers += [layer_init(nn.Linear(hidden, hidden), gain), act(), nn.LayerNorm(hidden)]
    return nn.Sequential(*layers)


def gru_over_sequence(gru, x, hidden, starts):
    """Hidden states (L, N, H) after each step of x (L, N, in_dim) from hidden (N, H), zeroed at `starts` (L, N)."""
    L = x.shape[0]
    cuts = [0, *(torch.nonzero(starts[1:].any(dim=1)).flatten() + 1).tolist(), L]
    keep = (~starts).unsqueeze(-1).to(x.dtype)  # (L, N, 1)
    outputs = []
    for begin, end in zip(cuts[:-1], cuts[1:]):
        out, last = gru(x[begin:end], (hidden * keep[begin]).unsqueeze(0))
        outputs.append(out)
        hidden = last[0]
    return torch.cat(outputs)


class RecurrentNet(nn.Module):
    """The official rMAPPO net: trunk -> GRU -> LayerNorm -> linear output."""

    def __init__(self, in_dim, out_dim, out_gain, args):
        super().__init__()
        self.trunk = mlp(in_dim, args)
        self.gru = nn.GRU(args.hidden_size, args.hidden_size)
        for name, param in self.gru.named_parameters():
            nn.init.orthogonal_(param) if "weight" in name else nn.init.zeros_(param)
        self.norm = nn.LayerNorm(args.hidden_size)
        self.out = layer_init(nn.Linear(args.hidden_size, out_dim), out_gain)

    def forward(self, x, hidden, starts):
        """x (L, B, R, in_dim), hidden (B, R, H), starts (L, B) -> (L, B, R, out_dim), hidden states (L, B, R, H)."""
        L, B, R, _ = x.shape
        features = self.trunk(x).view(L, B * R, -1)
        row_starts = starts.repeat_interleave(R, dim=1)  # (L, B * R): an env's rows start together
        hiddens = gru_over_sequence(self.gru, features, hidden.reshape(B * R, -1), row_starts).view(L, B, R, -1)
        return self.out(self.norm(hiddens)), hiddens


class Gaussian(Normal):
    """Gaussian of mean 0.5 + `out` censored to [0, 1]; the dims an agent lacks (`dims` 0) count 0."""

    def __init__(self, out, std_logit, dims):
        super().__init__(out + 0.5, torch.sigmoid(std_logit).expand_as(out), validate_args=False)
        self.dims = dims

    def sample(self):
        return super().sample().clamp(0.0, 1.0) * self.dims

    @property
    def mode(self):
        return self.mean.clamp(0.0, 1.0) * self.dims

    def log_prob(self, actions):
        below, above = (torch.special.log_ndtr(z / self.stddev) for z in (-self.mean, self.mean - 1.0))  # P(face)
        log_prob = torch.where(actions <= 0.0, below, torch.where(actions >= 1.0, above, super().log_prob(actions)))
        return (log_prob * self.dims).sum(-1)

    def entropy(self):
        return (super().entropy() * self.dims).sum(-1)


def action_distribution(out: Tensor, avail_actions: Tensor, std_logit: Tensor | None):
    if std_logit is None:
        return Categorical(logits=out.masked_fill(~avail_actions, -1e10), validate_args=False)
    return Gaussian(out, std_logit, avail_actions)


class Agent(nn.Module):
    """GRU actor(s) and a centralized GRU critic."""

    def __init__(self, spec: EnvSpec, args):
        super().__init__()
        n_agents = len(spec.agents)
        self.use_agent_id = args.use_agent_id
        self.state_type = args.state_type if spec.state_dim else "local"
        self.entities = spec.entities if args.sort_entities or args.nearest_k else ()
        actor_columns = nearest_columns(spec, args.nearest_k) if args.nearest_k else None
        self.register_buffer("actor_columns", actor_columns, persistent=False)
        self.register_buffer("agent_ids", torch.eye(n_agents))
        obs, state = torch.zeros(1, n_agents, spec.obs_dim), torch.zeros(1, spec.state_dim)
        actor_in = self.actor_input(obs).shape[-1]
        n_actors = n_agents if args.separate_actors else 1
        self.actors = nn.ModuleList(RecurrentNet(actor_in, spec.action_dim, 0.01, args) for _ in range(n_actors))
        # the std starts at sigmoid(2) = 0.88
        self.actor_std_logit = nn.Parameter(torch.full((n_actors, spec.action_dim), 2.0)) if spec.continuous else None
        # EP: one pass per env, a value head per agent
        critic_in = self.critic_input(obs, state).shape[-1]
        self.critic = RecurrentNet(critic_in, n_agents if self.state_type == "EP" else 1, 1.0, args)
        critic_rows = 1 if self.state_type == "EP" else n_agents
        self.hidden_shapes = ((n_agents, args.hidden_size), (critic_rows, args.hidden_size))

    def initial_hidden(self, n_envs):
        """Zero hidden states: actors (n_envs, n_agents, H), critic (n_envs, rows, H)."""
        return tuple(torch.zeros(n_envs, *shape, device=self.agent_ids.device) for shape in self.hidden_shapes)

    def critic_input(self, obs, state):
        """obs (..., n_agents, obs_dim), state (..., state_dim) -> EP (..., 1, state_dim), else (..., n_agents, F)."""
        if self.state_type == "local":  # AS without a state
            state = state[..., :0]
        elif self.entities:  # spread's state: the observations joined
            state = sort_entities(state.unflatten(-1, (len(self.agent_ids), -1)), self.entities).flatten(-2)
        if self.state_type == "EP":
            return state.unsqueeze(-2)
        ids = self.agent_ids.expand(*obs.shape[:-1], -1)
        global_state = state.unsqueeze(-2).expand(*obs.shape[:-1], -1)
        if self.state_type == "FP":
            return torch.cat([global_state, ids], dim=-1)
        return torch.cat([global_state, sort_entities(obs, self.entities), ids], dim=-1)

    def actor_input(self, obs):
        obs = sort_entities(obs, self.entities)
        if self.actor_columns is not None:  # the nearest K of each kind, zero-padded
            obs = F.pad(obs, (0, 1))[..., self.actor_columns]
        if not self.use_agent_id:
            return obs
        return torch.cat([obs, self.agent_ids.expand(*obs.shape[:-1], -1)], dim=-1)

    def get_value(self, x, hidden, starts):
        values, hiddens = self.critic(x, hidden, starts)
        return values.flatten(2), hiddens

    def get_dist(self, x, avail, hidden, starts):
        if len(self.actors) == 1:
            out, hiddens = self.actors[0](x, hidden, starts)
        else:
            outputs = [actor(x[:, :, i : i + 1], hidden[:, i : i + 1], starts) for i, actor in enumerate(self.actors)]
            out, hiddens = (torch.cat(parts, dim=2) for parts in zip(*outputs))
        return action_distribution(out, avail, self.actor_std_logit), hiddens

    def act(self, obs, avail, hidden, starts, deterministic=False):
        """One step: actions, log-probs (B, n_agents), next hidden state; `starts` (B,): episode starts."""
        dist, hiddens = self.get_dist(self.actor_input(obs[None]), avail[None], hidden, starts[None])
        action = dist.mode if deterministic else dist.sample()
        return action[0], dist.log_prob(action)[0], hiddens[0]


# ---------- Value normalization


class ValueNorm(nn.Module):
    """Running mean and variance of the returns, debiased (official MAPPO)."""

    def __init__(self, enabled=True, beta=0.99999, epsilon=1e-5, min_var=1e-2):
        super().__init__()
        self.enabled, self.beta, self.epsilon, self.min_var = enabled, beta, epsilon, min_var
        for name in ("running_mean", "running_mean_sq", "debiasing_term"):
            self.register_buffer(name, torch.zeros(()))

    def mean_var(self):
        if not self.enabled:
            return torch.zeros(()), torch.ones(())
        debias = self.debiasing_term.clamp(min=self.epsilon)
        mean = self.running_mean / debias
        var = (self.running_mean_sq / debias - mean**2).clamp(min=self.min_var)
        return mean, var

    @torch.no_grad()
    def update(self, x, steps=1):
        """`steps` updates at once (the official codes make one per minibatch)."""
        if not self.enabled:
            return
        decay = self.beta**steps
        self.running_mean.mul_(decay).add_(x.mean() * (1 - decay))
        self.running_mean_sq.mul_(decay).add_((x**2).mean() * (1 - decay))
        self.debiasing_term.mul_(decay).add_(1 - decay)

    def normalize(self, x):
        mean, var = self.mean_var()
        return (x - mean) / var.sqrt()

    def denormalize(self, x):
        mean, var = self.mean_var()
        return x * var.sqrt() + mean


# ---------- Rollout buffer and GAE


class RolloutBuffer:
    """One rollout (index t: the input at t, what acting on it gave) and its first hidden states."""

    def __init__(self, T, n_envs, spec: EnvSpec, device, hidden):
        n_agents = len(spec.agents)
        zeros = functools.partial(torch.zeros, device=device)
        self.obs = zeros(T + 1, n_envs, n_agents, spec.obs_dim)
        self.state = zeros(T + 1, n_envs, spec.state_dim)
        self.alive = torch.ones(T + 1, n_envs, n_agents, dtype=torch.bool, device=device)  # in the episode at t
        self.avail = torch.ones(T + 1, n_envs, n_agents, spec.action_dim, dtype=torch.bool, device=device)
        self.values = zeros(T + 1, n_envs, n_agents)  # on the scale of the returns
        action_shape, action_type = ((spec.action_dim,), torch.float32) if spec.continuous else ((), torch.long)
        self.actions = zeros(T, n_envs, n_agents, *action_shape, dtype=action_type)
        self.logprobs, self.rewards = zeros(T, n_envs, n_agents), zeros(T, n_envs, n_agents)
        self.terminated, self.truncated = (zeros(T, n_envs, n_agents, dtype=torch.bool) for _ in range(2))
        self.final_obs = zeros(T, n_envs, n_agents, spec.obs_dim)  # last obs of an episode that ended at t
        self.final_state = zeros(T, n_envs, spec.state_dim)
        self.final_values = zeros(T, n_envs, n_agents)  # to bootstrap truncations
        self.starts = zeros(T + 1, n_envs, dtype=torch.bool)  # obs[t] begins an episode
        self.starts[0] = True
        self.actor_hidden, self.critic_hidden = hidden

    def insert(self, t, actions, logprobs, step: StepResult):
        self.actions[t], self.logprobs[t], self.rewards[t] = actions, logprobs, step.rewards
        self.terminated[t], self.truncated[t] = step.terminated, step.truncated
        self.obs[t + 1], self.state[t + 1], self.alive[t + 1] = step.obs, step.state, step.alive
        self.avail[t + 1] = step.avail
        self.final_obs[t], self.final_state[t] = step.final_obs, step.final_state
        self.starts[t + 1] = step.ended

    @torch.no_grad()
    def compute_values(self, agent, value_norm):
        """The critic over T + 1 inputs; final input t, one step from hidden state t."""
        values, hiddens = agent.get_value(agent.critic_input(self.obs, self.state), self.critic_hidden, self.starts)
        self.values[:] = value_norm.denormalize(values)
        no_starts = torch.zeros_like(self.starts[1:]).flatten()[None]  # (1, T * n_envs)
        final_input = agent.critic_input(self.final_obs.flatten(0, 1)[None], self.final_state.flatten(0, 1)[None])
        final_values, _ = agent.get_value(final_input, hiddens[:-1].flatten(0, 1), no_starts)
        self.final_values[:] = value_norm.denormalize(final_values).view_as(self.final_values)
        self.next_critic_hidden = hiddens[-2]  # before obs[T]: the next rollout's start

    def start_next_rollout(self, actor_hidden):
        self.starts[0] = self.starts[-1]
        self.actor_hidden, self.critic_hidden = actor_hidden, self.next_critic_hidden


def compute_gae(buffer, gamma, gae_lambda, team_reward):
    """Advantages and returns (T, n_envs, n_agents), truncations bootstrapped."""
    rewards, values, terminated, truncated = buffer.rewards, buffer.values, buffer.terminated, buffer.truncated
    if team_reward:  # the team's mean reward, each agent to the episode's end
        rewards = rewards.mean(dim=-1, keepdim=True).expand_as(rewards)
        ended = (terminated | truncated).all(dim=-1, keepdim=True)
        truncated = (ended & (truncated & ~terminated).any(dim=-1, keepdim=True)).expand_as(truncated)
        terminated = ended & ~truncated
    next_values = torch.where(truncated, buffer.final_values, values[1:]) * ~terminated
    deltas = rewards + gamma * next_values - values[:-1]
    episode_continues = ~(terminated | truncated)
    advantages, gae = torch.zeros_like(rewards), torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        gae = deltas[t] + gamma * gae_lambda * gae * episode_continues[t]
        advantages[t] = gae
    return advantages, advantages + values[:-1]


# ---------- PPO update


def masked_mean(x, alive):
    return (x * alive).sum() / alive.sum().clamp(min=1)


def policy_loss_fn(new_logprob, old_logprob, advantages, alive, clip):
    logratio = new_logprob - old_logprob
    ratio = logratio.exp()
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
    with torch.no_grad():
        stats = dict(approx_kl=(ratio - 1) - logratio, clipfrac=((ratio - 1).abs() > clip).float(), ratio=ratio)
        stats = {name: masked_mean(x, alive) for name, x in stats.items()}
    return -masked_mean(surrogate, alive), stats


def value_loss_fn(values, old_values, returns, alive, args):
    """Huber loss of normalized values, PPO-clipped; with the team's reward the dead count."""
    loss = F.huber_loss(values, returns, reduction="none", delta=args.huber_delta)
    if args.clipped_value_loss:
        values_clipped = old_values + (values - old_values).clamp(-args.clip, args.clip)
        loss = torch.max(loss, F.huber_loss(values_clipped, returns, reduction="none", delta=args.huber_delta))
    return masked_mean(loss, alive | args.team_reward)


def minibatch_indices(batch_size, num_mini_batch, device):
    if num_mini_batch == 1:
        return [slice(None)]
    return list(torch.randperm(batch_size, device=device).split(batch_size // num_mini_batch))


def ppo_step(agent, optimizer, batch, args):
    """One gradient step; its statistics stay tensors (nothing waits on the device)."""
    actor_in, critic_in, alive, actions, old_logprobs, avail, advantages, old_values, returns, starts, hiddens = batch
    dist, _ = agent.get_dist(actor_in, avail, hiddens[0], starts)  # the masks the actions were drawn under
    policy_loss, pg_stats = policy_loss_fn(dist.log_prob(actions), old_logprobs, advantages, alive, args.clip)
    entropy = masked_mean(dist.entropy(), alive)
    value_loss = value_loss_fn(agent.get_value(critic_in, hiddens[1], starts)[0], old_values, returns, alive, args)
    optimizer.zero_grad()
    (policy_loss - args.ent_coef * entropy + args.vf_coef * value_loss).backward()
    actor_params = [p for name, p in agent.named_parameters() if not name.startswith("critic.")]
    actor_grad_norm = nn.utils.clip_grad_norm_(actor_params, args.max_grad_norm)
    critic_grad_norm = nn.utils.clip_grad_norm_(agent.critic.parameters(), args.max_grad_norm)
    optimizer.step()
    losses = dict(policy_loss=policy_loss.detach(), value_loss=value_loss.detach(), entropy=entropy.detach())
    return losses | pg_stats | dict(actor_grad_norm=actor_grad_norm, critic_grad_norm=critic_grad_norm)


def ppo_update(agent, optimizer, value_norm, buffer, advantages, returns, args):
    """`ppo_epoch` passes of minibatches of whole envs, sequences replayed through the GRUs."""
    old_values = value_norm.normalize(buffer.values[:-1])  # the clip's centre
    learned = returns[buffer.alive[:-1] | args.team_reward]  # as value_loss_fn counts them
    value_norm.update(learned, steps=args.ppo_epoch * args.num_mini_batch)
    alive_advantages = advantages[buffer.alive[:-1]]
    advantages = (advantages - alive_advantages.mean()) / (alive_advantages.std() + 1e-5)
    obs, state = buffer.obs[:-1], buffer.state[:-1]
    data = [agent.actor_input(obs), agent.critic_input(obs, state)]  # once an update
    data += [buffer.alive[:-1], buffer.actions, buffer.logprobs, buffer.avail[:-1], advantages, old_values]
    data += [value_norm.normalize(returns), buffer.starts[:-1]]
    stats = []
    for _ in range(args.ppo_epoch):
        for mb in minibatch_indices(data[0].shape[1], args.num_mini_batch, data[0].device):
            hiddens = (buffer.actor_hidden[mb], buffer.critic_hidden[mb])  # (mb, rows, H) before step 0
            stats.append(ppo_step(agent, optimizer, [x[:, mb] for x in data] + [hiddens], args))
    return {k: torch.stack([s[k] for s in stats]).mean().item() for k in stats[0]}


def build_agent(spec: EnvSpec, args, device):
    agent = Agent(spec, args).to(device)
    value_norm = ValueNorm(args.use_valuenorm).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5, fused=True)
    return agent, value_norm, optimizer


def main(args):
    """Rollouts, advantages, PPO updates; `TrainingRun` does the rest."""
    if args.eval_checkpoint is not None:
        run_evaluation_only(args)
        return {}
    with TrainingRun(args) as run:
        args, spec, envs, device = run.args, run.spec, run.envs, run.device  # args with the discount chosen
        T, n_envs = args.episode_length, args.n_rollout_threads
        agent, value_norm, optimizer = build_agent(spec, args, device)
        initial_lrs = [group["lr"] for group in optimizer.param_groups]  # before a resume loads decayed ones
        buffer = RolloutBuffer(T, n_envs, spec, device, agent.initial_hidden(n_envs))
        progress = run.start(agent, value_norm, optimizer, buffer)

        for iteration in range(progress.iteration + 1, run.num_iterations + 1):
            if args.linear_lr_decay:
                for group, initial_lr in zip(optimizer.param_groups, initial_lrs):
                    group["lr"] = initial_lr * (1.0 - (iteration - 1.0) / run.num_iterations)

            # 1. Collect a rollout: T steps of every env
            buffer.obs[0], buffer.state[0], buffer.alive[0], buffer.avail[0] = envs.observe()
            with torch.no_grad():
                hidden = buffer.actor_hidden
                for t in range(T):
                    actions, logprobs, hidden = agent.act(buffer.obs[t], buffer.avail[t], hidden, buffer.starts[t])
                    buffer.insert(t, actions, logprobs, envs.step(actions))
                    progress.global_step += n_envs

                # 2. Values and advantages
                buffer.compute_values(agent, value_norm)
                advantages, returns = compute_gae(buffer, args.gamma, args.gae_lambda, args.team_reward)

            # 3. PPO update
            update_start = time.time()
            losses = ppo_update(agent, optimizer, value_norm, buffer, advantages, returns, args)
            buffer.start_next_rollout(hidden)

            # 4. Log, evaluate, checkpoint; a stop ends the run here
            if run.end_iteration(iteration, losses, returns, update_start):
                break
    return run.summary


# ============================== Below: setting up, watching and ending a run (`Args`, `TrainingRun`, envs, checks)


SCRIPT = os.path.basename(__file__)


@dataclass
class Args(Hyperparameters):
    exp_name: str = SCRIPT[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (env k uses seed + k)"""
    torch_deterministic: bool = True
    """`torch.backends.cudnn.deterministic`"""
    cuda: bool = False
    """use the GPU when one is available"""
    n_training_threads: int = 0
    """torch threads on the CPU; 0: half the cores"""
    track: bool = False
    """track the run with Weights and Biases"""
    wandb_project_name: str = "mappo-mpe"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record an episode per evaluation (videos/, TensorBoard)"""
    save_model: bool = False
    """save the final and the best-evaluated model"""
    eval_checkpoint: str | None = None
    """test mode: evaluate this checkpoint, train nothing"""
    eval_n_agents: int = 0
    """test mode: play a --nearest-k model with N agents (0: as trained)"""
    resume: str | None = None
    """go on exactly with the run of this checkpoint (or run folder)"""
    checkpoint_interval: int = 0
    """env steps between checkpoints (also at the end, on a stop); 0: 200k or 30 iterations"""
    env_kwargs: dict[str, int | float | bool | str] = dataclasses.field(default_factory=dict)
    """an env by import path: its keyword arguments (--env-kwargs max_cycles 300 flag False)"""
    async_envs: bool = False
    """an env by import path: each copy in its own process"""

    eval_interval: int = 0
    """environment steps between evaluations; 0: 50k or 30 iterations"""
    n_eval_episodes: int = 32
    """episodes per evaluation"""
    eval_sample: bool = False
    """evaluate sampled actions, not the likeliest (greedy agents can deadlock)"""
    eval_max_steps: int = 10_000
    """steps after which an evaluation episode is cut"""
    log_interval: int = 20_000
    """environment steps between progress lines"""

    @property
    def batch(self):  # env steps of a rollout
        return self.episode_length * self.n_rollout_threads


def parse_args(argv=None):
    """`Args`: the command line over the preset it chooses."""
    argv = sys.argv[1:] if argv is None else argv
    for start in [i + 1 for i, arg in enumerate(argv) if arg in ("--env-kwargs", "--env_kwargs")]:
        count = next((n for n, arg in enumerate(argv[start:]) if arg.startswith("--")), len(argv) - start)
        if count % 2:
            raise ErrorExit(f"--env-kwargs takes name-value pairs, not {count} values")
    chosen, _ = tyro.cli(Args, args=argv, return_unknown_args=True, add_help=False)
    for flag in {"--n-agents", "--max-cycles"} & {arg.split("=")[0].replace("_", "-") for arg in argv}:
        if chosen.env_id not in MPE_SCENARIOS:
            raise ErrorExit(f"{flag} is for MPE scenarios; use --env-kwargs with {chosen.env_id}")
    settings = PRESETS[chosen.preset].get(chosen.env_id, {})
    if chosen.continuous_actions:
        settings = settings | CONTINUOUS_PRESETS[chosen.preset].get(chosen.env_id, {})
    if hasattr(chosen, "compile") and chosen.cuda and torch.cuda.is_available():
        settings = settings | {"compile": True}
    return tyro.cli(Args, args=argv, default=dataclasses.replace(Args(), **settings))


class TrainingRun(contextlib.AbstractContextManager):
    """All but the learning: envs, logs, resume, signals, evaluations, checkpoints, faults."""

    def __init__(self, args):
        self.device = device = setup_torch(args)
        self.spec = spec = get_env_spec(args.env_id, scenario_kwargs(args))
        random.seed(args.seed)  # the probe seeded them with 0
        np.random.seed(args.seed)
        check_memory(spec, args, device)
        print(f"training on {device.type}, torch threads: {torch.get_num_threads()}")
        if args.resume and os.path.isdir(args.resume):
            args = dataclasses.replace(args, resume=os.path.join(args.resume, "checkpoint.pt"))
        self.checkpoint = checkpoint = load_checkpoint(args.resume, device) if args.resume else None
        if not spec.state_dim and hasattr(args, "state_type"):
            args = dataclasses.replace(args, state_type="local")
        if not args.gamma and checkpoint:  # a resumed run keeps the discount it began with
            args = dataclasses.replace(args, gamma=checkpoint["args"]["gamma"])
        elif not args.gamma:  # a horizon 1 / (1 - gamma) of a quarter of the env's time limit
            args = dataclasses.replace(args, gamma=round(min(max(1 - 4 / (spec.episode_limit or 400), 0.9), 0.99), 3))
            print(f"gamma {args.gamma}, from the env's time limit: {spec.episode_limit or 'none in 400'} steps")
        if not spec.episode_limit or spec.episode_limit > args.eval_max_steps:
            print(f"--eval-max-steps: evaluation episodes end after {args.eval_max_steps:,} steps if not before")
        if checkpoint is not None:
            check_resume(args, checkpoint)
        self.args, n_envs = args, args.n_rollout_threads
        self.num_iterations = args.total_timesteps // args.batch
        if args.env_id in MPE_SCENARIOS:
            self.envs: VecEnv = BatchedMPE(spec, n_envs, args.seed, device)
        else:
            self.envs = PettingZooVecEnv(spec, n_envs, args.seed, device, args.async_envs)
        episodes, video = args.n_eval_episodes, args.capture_video
        self.eval_envs = PettingZooVecEnv(spec, episodes, args.seed, device, args.async_envs, video)
        run_dir = f"runs/{args.env_id.replace(':', '.')}__{args.exp_name}__{args.seed}__{int(time.time())}"
        self.run_dir = os.path.dirname(os.path.abspath(args.resume)) if args.resume else new_run_dir(run_dir)
        self.progress = Progress(**checkpoint["progress"]) if checkpoint else Progress()
        self.running_returns = torch.zeros(n_envs, len(spec.agents), device=device)
        self.writer = start_logging(self.run_dir, args, checkpoint and checkpoint["global_step"])
        self.signal = None
        self.handlers = {s: signal.signal(s, self.request_stop) for s in (signal.SIGINT, signal.SIGTERM)}

    def request_stop(self, signum, frame=None):
        """A stop at the iteration's end; a second signal acts at once."""
        self.signal = signum
        for s, handler in self.handlers.items():
            signal.signal(s, handler)

    def start(self, agent, value_norm, optimizer, buffer):
        """Puts a resumed run's state back, else resets the envs."""
        self.model, self.buffer, self.losses = (agent, value_norm, optimizer), buffer, {}
        if self.checkpoint is None:
            self.envs.reset()
        else:
            restore(self.checkpoint, agent, value_norm, optimizer, self.args.resume)
            resume_training(self, self.checkpoint)
        self.start_time, self.start_step, self.rollout_start = time.time(), self.progress.global_step, time.time()
        if self.progress.iteration == self.num_iterations:  # resumed after a stop in its final evaluation
            self.evaluate()
            if self.signal is None:  # made, not cut short by a stop
                self.save("checkpoint.pt", **training_state(self))
                print(f"step {self.progress.global_step:>9,} | the final evaluation {self.progress.eval_return:7.2f}")
        return self.progress

    def end_iteration(self, iteration, losses, returns, update_start):
        """Logs the update; evaluates, prints, checkpoints when due; True: a stop."""
        args, progress, buffer, batch = self.args, self.progress, self.buffer, self.args.batch
        seconds = {"rollout": update_start - self.rollout_start, "update": time.time() - update_start}
        values, returns = buffer.values[:-1][buffer.alive[:-1]], returns[buffer.alive[:-1]]
        var = returns.var()
        losses["explained_variance"] = np.nan if var == 0 else (1 - (returns - values).var() / var).item()
        progress.iteration, global_step, self.losses = iteration, progress.global_step, losses
        sps = int((global_step - self.start_step) / (time.time() - self.start_time))
        ended_returns = self.ended_episode_returns()
        if ended_returns is not None:
            progress.train_return = float(ended_returns.mean())
        lr = self.model[2].param_groups[0]["lr"]
        log_iteration(self.writer, global_step, sps, seconds, lr, losses, ended_returns, self.spec.agents)
        last, apart = iteration == self.num_iterations, 30 * batch
        if due(global_step, args.eval_interval or max(50_000, apart), global_step - progress.eval_step) or last:
            self.evaluate()
        if due(global_step, args.log_interval, batch) or last or global_step == self.start_step + batch:
            print(progress_line(progress, self.num_iterations * batch, sps, losses, args.eval_sample))
        stop = self.signal is not None  # read once: a later signal stops the next iteration, after its save
        if due(global_step, args.checkpoint_interval or max(200_000, apart), batch) or last or stop:
            self.save("checkpoint.pt", **training_state(self))
        self.rollout_start = time.time()
        return stop

    def ended_episode_returns(self):
        """(n_agents,) mean returns of the rollout's ended episodes; None: none ended."""
        running, ended_sum, count = self.running_returns, torch.zeros_like(self.running_returns[0]), 0
        for rewards, ended in zip(self.buffer.rewards, (self.buffer.terminated | self.buffer.truncated).all(dim=-1)):
            running += rewards
            ended_sum += (running * ended[:, None]).sum(dim=0)
            count += ended.sum()
            running *= ~ended[:, None]
        return (ended_sum / count).cpu().numpy() if (count := int(count)) else None

    def evaluate(self):
        """Evaluates, keeping the best model; one a stop cut short counts for nothing."""
        progress, step = self.progress, self.progress.global_step
        video = f"videos/{os.path.basename(self.run_dir)}/eval_{step}.mp4"
        returns = evaluate_and_record(self.model[0], self.eval_envs, self.args, self.writer, step, video, self)
        if self.signal is None:
            progress.eval_return, progress.eval_step = float(returns.mean()), step
            self.writer.add_scalar("eval/episodic_return", progress.eval_return, step)
        if progress.eval_return > progress.best_eval:
            progress.best_eval = progress.eval_return
            if self.args.save_model:
                self.save("best_model.pt")

    def save(self, name, **training):
        save_checkpoint(f"{self.run_dir}/{name}", *self.model, self.args, self.progress.global_step, **training)

    def __exit__(self, kind, error, trace):
        """`end`; a full disk: one error line, the checkpoint kept; a finished run only notes signals."""
        checkpoint = f"{self.run_dir}/checkpoint.pt"
        finished = self.progress.eval_step == self.progress.global_step == self.num_iterations * self.args.batch
        noted = lambda signum, frame: setattr(self, "signal", self.signal or signum)
        for s, handler in self.handlers.items():
            signal.signal(s, noted if kind is None and finished else handler)
        try:
            self.writer.close()  # TensorBoard's last events: a full disk may show here first
            self.end(kind, error, finished)
        except OSError as fault:
            if fault.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                raise
            line = f"{fault.filename or self.run_dir}: {fault.strerror}"
            if kind is None and finished:
                line += f"; the run is complete in {checkpoint}"
            elif os.path.isfile(checkpoint):
                line += f"; {checkpoint} is kept: once that is mended, add --resume {self.run_dir}"
            raise ErrorExit(line) from None
        finally:
            self.request_stop(self.signal)

    def end(self, kind, error, finished):
        """An env's fault: one error line, the last update kept; a stop: how to go on; else a summary."""
        progress, resume = self.progress, f"--resume {self.run_dir}/checkpoint.pt"
        if isinstance(error, EnvError):
            line = f"{error} at env step {progress.global_step:,}"
            if progress.iteration * self.args.batch > (self.checkpoint or {}).get("global_step", 0):
                progress.global_step = progress.iteration * self.args.batch  # where the last update left it
                self.save("checkpoint.pt", **training_state(self))
                line += f"; the run up to step {progress.global_step:,} is kept: fix the env, add {resume}"
            raise ErrorExit(line) from None
        if kind is not None:
            raise error
        summary = f"run in {self.run_dir}, with checkpoint.pt"
        if self.args.save_model:
            self.save("model.pt")
            best = f" and best_model.pt (best eval {progress.best_eval:.3f})" if np.isfinite(progress.best_eval) else ""
            summary += f", model.pt{best}"
        if self.signal is not None and not finished:  # a stop after the final save changes nothing
            how = f"stopped by {signal.Signals(self.signal).name} at step {progress.global_step:,}"
            print(f"{how}; {summary}; to go on, add {resume}")
            raise SystemExit(128 + self.signal)
        print(summary)
        self.summary = dict(run_name=os.path.basename(self.run_dir), losses=self.losses) | dataclasses.asdict(progress)


MAX_INPUTS = 4096  # numbers of an observation or state the MLPs take; more is an image


class EnvSpec(NamedTuple):
    agents: list[str]
    obs_dim: int  # largest flattened observation (others zero-padded)
    action_dim: int  # largest action space or vector
    state_dim: int  # 0: none (no state, and the observations joined would not fit)
    avail_actions: np.ndarray  # (n_agents, action_dim) bool: the actions each agent has
    continuous: bool  # actions in the unit box [0, 1]^action_dim
    action_masks: str  # where the masks are: "info", "observation", "" (none)
    has_state: bool  # env.state(); else the observations joined
    episode_limit: int  # the time limit; 0: none met
    entities: tuple  # spread's groups of interchangeable entities (`sort_entities`)
    env_id: str
    scenario: dict
    obs_spaces: list  # each agent's, without its action mask


def scenario_kwargs(args):
    continuous = {"continuous_actions": True} if args.continuous_actions else {}
    if args.env_id not in MPE_SCENARIOS:
        return args.env_kwargs | continuous
    kwargs = dict(max_cycles=args.max_cycles, continuous_actions=args.continuous_actions)
    return kwargs | ({"N": args.n_agents} if args.env_id == "simple_spread_v3" else {})


def make_env(env_id, scenario, render_mode=None):
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    module = f"mpe2.{env_id}" if env_id in MPE_SCENARIOS else env_id
    try:
        maker = import_path(module)
        if not callable(maker := getattr(maker, "parallel_env", maker)):
            raise TypeError(f"a module without parallel_env: name the env's class or function, as {module}:NAME")
        env = maker(**scenario, **{"render_mode": render_mode} if render_mode else {})
    except Exception as e:  # a missing module or keyword, or the env's own error
        raise ErrorExit(f"--env-id {env_id}: cannot make an env of {module}: {e!r}") from None
    if hasattr(env, "agent_iter") or not hasattr(env, "possible_agents"):  # an AEC env's agents act in turn
        found = "an AEC env" if hasattr(env, "agent_iter") else f"{type(env).__name__}, without possible_agents"
        needed = "a PettingZoo parallel env: a module's parallel_env, or pettingzoo.utils.aec_to_parallel(env)"
        raise ErrorExit(f"--env-id {env_id}: made {found}; the scripts take {needed}")
    if render_mode is None and module.startswith("mpe2."):
        env.unwrapped.screen = None  # frees mpe2's 700x700 drawing surface (~2 MB)
    return env


def import_path(path):
    """`module.name` or `module:name`: the module, else the named attribute."""
    module, _, name = (path := path.replace(":", ".")).rpartition(".")
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as e:
        if not module or e.name != path:  # a module the env's own imports is missing: say so
            raise
    return getattr(importlib.import_module(module), name)


def get_env_spec(env_id, scenario):
    random.seed(0)  # the probe plays alike every time
    np.random.seed(0)
    env = make_env(env_id, scenario)
    first = call_env(env_id, env, "reset", seed=0)
    agents, box = env.possible_agents, lambda s: isinstance(s, spaces.Box) and np.prod(s.shape) <= MAX_INPUTS
    counts = (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
    obs_spaces, action_spaces = [env.observation_space(a) for a in agents], [env.action_space(a) for a in agents]
    in_obs = all(isinstance(s, spaces.Dict) and "action_mask" in s.spaces for s in obs_spaces)
    masks = "observation" if in_obs else "info" if any("action_mask" in first[1].get(a, {}) for a in agents) else ""
    obs_spaces = [s["observation"] for s in obs_spaces] if masks == "observation" else obs_spaces
    sizes = [spaces.flatdim(s) if box(s) or isinstance(s, counts) else np.inf for s in obs_spaces]
    discrete = all(isinstance(s, spaces.Discrete) for s in action_spaces)
    continuous = all(box(s) and len(s.shape) == 1 and np.isfinite([s.low, s.high]).all() for s in action_spaces)
    unsupported = [
        (max(sizes) > MAX_INPUTS, f"observations {set(map(str, obs_spaces))}"),
        (not (discrete or continuous), f"actions {set(map(str, action_spaces))}"),
        (masks and not discrete, f"action masks with actions {set(map(str, action_spaces))}"),
        (set(env.agents) != set(agents), "agents who join an episode after its start"),
    ]
    for what in [what for refused, what in unsupported if refused][:1]:
        raise ErrorExit(
            f"--env-id {env_id}: unsupported {what}; the networks take Box or discrete observations of at most "
            f"{MAX_INPUTS} numbers (an image wants a wrapper, e.g. SuperSuit's resize, in a module of your own for "
            "--env-id), all Discrete or all bounded 1-D Box actions, and every agent from the start of an episode"
        )
    action_dims = [s.shape[0] if continuous else int(s.n) for s in action_spaces]
    avail = np.arange(max(action_dims)) < np.array(action_dims)[:, None]
    entities = ()
    if env_id == "simple_spread_v3":  # [vel, pos, N landmarks, N - 1 other agents, their messages], 2 numbers each
        n, others = len(agents), 4 + 2 * len(agents)
        entities = ((n, (4,)), (n - 1, (others, others + 2 * (n - 1))))
    spec = EnvSpec(
        agents, max(sizes), len(avail[0]), 0, avail, continuous, masks, False, 0, entities, env_id, scenario, obs_spaces
    )
    state_space = getattr(env, "state_space", None)
    return probe_env(spec, env, first, state_space if box(state_space) else None)


def sort_entities(x, entities):
    """x (..., F) with each group (count, starts) of 2-number blocks ordered nearest first by its first start's run."""
    if not entities:
        return x
    x = x.clone()
    for count, starts in entities:
        runs = [x[..., s : s + 2 * count].unflatten(-1, (count, 2)) for s in starts]  # each (..., count, 2)
        order = runs[0].norm(dim=-1).argsort(dim=-1, stable=True)[..., None].expand_as(runs[0])
        for s, run in zip(starts, [run.gather(-2, order).flatten(-2) for run in runs]):
            x[..., s : s + 2 * count] = run
    return x


def nearest_columns(spec: EnvSpec, k):
    """(6k,) columns of a sorted spread observation: velocity, position, the nearest k landmarks and k - 1 agents."""
    columns = list(range(4))
    for (count, starts), keep in zip(spec.entities, (k, k - 1)):
        columns += [s + c if c < 2 * count else spec.obs_dim for s in starts for c in range(2 * keep)]
    return torch.tensor(columns)


TIME_LIMITS = ("max_cycles", "max_steps", "max_episode_steps", "episode_limit", "time_limit", "limit")


def probe_env(spec, env, first, state_space):
    """Up to 400 seeded random steps from `first`: the time limit, state() throughout, masks."""
    env_id, (observations, infos), sizes = spec.env_id, first, spec.avail_actions.sum(axis=1)
    problem = None if state_space else f"--env-id {env_id}: it has no Box state_space of at most {MAX_INPUTS} numbers"
    truncated, length = False, 0
    spec = spec._replace(has_state=True, state_dim=int(np.prod(state_space.shape))) if state_space else spec
    joint_actions = spaces.Tuple([env.action_space(a) for a in spec.agents], seed=0)
    for _ in range(400):
        if not env.agents:
            (observations, infos), length = call_env(env_id, env, "reset"), 0
        try:  # as training: at a reset and while any agent plays
            if problem is None:
                env_state(spec, env, None)
        except EnvError as e:
            if len(env.agents) == len(spec.agents):
                raise
            problem = f"{e} once an agent left"
        if not spec.action_masks and any("action_mask" in info for info in infos.values()):  # not with reset()
            if spec.continuous:
                raise ErrorExit(f"--env-id {env_id}: unsupported action masks with Box actions")
            spec = spec._replace(action_masks="info")
            print(f"warning: --env-id {env_id}: action masks in its step() infos only: all actions allowed at a reset")
        masks = read_masks(spec, observations, infos, np.isin(spec.agents, env.agents))
        masks = tuple(m[:n].astype(np.int8) for m, n in zip(masks, sizes)) if spec.action_masks else None
        actions = {a: x for a, x in zip(spec.agents, joint_actions.sample(masks)) if a in env.agents}
        observations, _, _, truncations, infos = call_env(env_id, env, "step", actions)
        length += 1
        if truncated := any(truncations.values()) and not env.agents:
            break
    if problem is not None:
        joined = len(spec.agents) * spec.obs_dim
        critic = "the observations joined" if joined <= MAX_INPUTS else f"each agent's observation ({joined:,} joined)"
        print(f"warning: {problem}; the critic takes {critic}")
        spec = spec._replace(has_state=False, state_dim=joined if joined <= MAX_INPUTS else 0)
    unwrapped = getattr(env, "unwrapped", env)
    kept = [n for name in TIME_LIMITS if isinstance(n := getattr(unwrapped, name, None), int) and n > 0]
    return spec._replace(episode_limit=(kept + [length if truncated else 0])[0])


def env_state(spec, env, obs: np.ndarray | None):
    """(state_dim,) float32: env.state(), or the observations `obs` joined; a wrong one is an EnvError."""
    joined = obs if spec.state_dim else ()
    state = np.asarray(call_env(spec.env_id, env, "state") if spec.has_state else joined, dtype=np.float32).ravel()
    if (size := state.size) != spec.state_dim:
        raise EnvError(f"--env-id {spec.env_id}: its state() has {size} numbers, its state_space {spec.state_dim}")
    if spec.has_state and not np.isfinite(state).all():
        raise EnvError(f"--env-id {spec.env_id}: its state() returned a NaN or infinity")
    return state


def read_masks(spec, observations, infos, alive: np.ndarray):
    """(n_agents, action_dim) bool: the `alive` agents' action masks; a bad one is an EnvError."""
    if not spec.action_masks:
        return spec.avail_actions
    avail, source = spec.avail_actions.copy(), infos if spec.action_masks == "info" else observations
    for i in np.flatnonzero(alive):
        agent, size = spec.agents[i], int(spec.avail_actions[i].sum())
        mask = np.asarray(source.get(agent, {}).get("action_mask", spec.avail_actions[i, :size]), dtype=bool).ravel()
        if len(mask) != size or not mask.any():
            what = f"has {len(mask)} values for its {size} actions" if len(mask) != size else "allows no action"
            raise EnvError(f"--env-id {spec.env_id}: the action_mask of {agent} (in its {spec.action_masks}) {what}")
        avail[i, :size] = mask
    return avail


class StepResult(NamedTuple):
    """What `VecEnv.step` gives: the next step's input, and what the step did."""

    obs: Tensor  # (n_envs, n_agents, obs_dim), already reset where an episode ended
    state: Tensor  # (n_envs, state_dim)
    rewards: Tensor  # (n_envs, n_agents), as terminated and truncated (bool)
    terminated: Tensor
    truncated: Tensor
    final_obs: Tensor  # the step's observation and state, before a reset
    final_state: Tensor
    alive: Tensor  # (n_envs, n_agents) bool: who acts on `obs`
    avail: Tensor  # (n_envs, n_agents, action_dim) bool: allowed on `obs`

    @property
    def ended(self):
        return (self.terminated | self.truncated).all(dim=1)


class VecEnv(Protocol):
    """`spec`'s env copies stepped together, an ended episode begun anew in `step`; a dead agent stays terminated."""

    spec: EnvSpec
    keeps_episodes: bool  # `load_state_dict` puts back the episodes under way

    def reset(self): ...
    def observe(self) -> tuple[Tensor, ...]: ...  # (obs, state, alive, avail): the next input
    def step(self, actions: Tensor) -> StepResult: ...  # actions (n_envs, n_agents) or unit-box vectors
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict): ...


# mpe2's world constants (_mpe_utils/core.py and simple_env.py)
DT, DAMPING, SENSITIVITY, CONTACT_FORCE, CONTACT_MARGIN = 0.1, 0.25, 5.0, 100.0, 1e-3
LOCAL_RATIO = 0.5  # mpe2's weight of an agent's own reward against the team's
SPREAD_AGENT_SIZE = 0.15  # spread's agents collide when closer than twice this
MOVES = [[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]]  # discrete move: none, -x, +x, -y, +y


class BatchedMPE:
    """`n_envs` copies of an mpe2 scenario as tensors, mpe2 1.1.1's arithmetic in its order; resets from a CPU RNG."""

    WORLD = ("pos", "vel", "comm", "goal", "steps")
    keeps_episodes = True

    def __init__(self, spec, n_envs, seed, device):
        self.spec, self.env_id, self.n_envs, self.device = spec, spec.env_id, n_envs, device
        self.max_cycles = spec.scenario["max_cycles"]
        self.n_agents = n_agents = len(spec.agents)
        # mpe2's make_world: who moves, who speaks (message size), the landmarks' colours
        if self.env_id == "simple_spread_v3":
            self.n_landmarks, self.dim_c, movable, speaks = n_agents, 2, [True] * n_agents, [False] * n_agents
            shade = 0.0
        elif self.env_id == "simple_speaker_listener_v4":
            self.n_landmarks, self.dim_c, movable, speaks = 3, 3, [False, True], [True, False]
            shade = 0.15
        else:
            self.n_landmarks, self.dim_c, movable, speaks = 3, 10, [True, True], [True, True]
            shade = 0.25
        self.colours, self.movable = 0.5 * torch.eye(3, device=device) + shade, torch.tensor(movable, device=device)
        others = [[k for k in range(n_agents) if k != i] for i in range(n_agents)]
        self.others = torch.tensor(others, dtype=torch.long, device=device)  # (n_agents, n_agents - 1)
        self.agent_rows = torch.arange(n_agents, device=device)
        self.action_effects = self.action_table(movable, speaks).to(device)
        zeros = functools.partial(torch.zeros, device=device)
        self.pos, self.vel = zeros(n_envs, n_agents + self.n_landmarks, 2), zeros(n_envs, n_agents, 2)
        self.comm, self.goal = zeros(n_envs, n_agents, self.dim_c), zeros(n_envs, n_agents, dtype=torch.long)
        self.steps = torch.zeros(n_envs, dtype=torch.long)
        self.alive = torch.ones(n_envs, n_agents, dtype=torch.bool, device=device)  # no agent leaves an episode early
        self.never = torch.zeros_like(self.alive)  # no scenario terminates; truncated between ends
        self.avail = torch.as_tensor(spec.avail_actions, device=device).expand(n_envs, -1, -1)
        self.generator = torch.Generator().manual_seed(seed)

    def action_table(self, movable, speaks):
        """(n_agents, action_dim, 2 + dim_c): each action's [force, message], or an action vector's (`_set_action`)."""
        table = torch.zeros(self.n_agents, self.spec.action_dim, 2 + self.dim_c)
        for i in range(self.n_agents):
            n_moves = 5 if movable[i] else 0
            if self.spec.continuous:
                if movable[i]:
                    table[i, [2, 1, 4, 3], [0, 0, 1, 1]] = torch.tensor([1.0, -1.0, 1.0, -1.0]) * SENSITIVITY
                if speaks[i]:
                    table[i, n_moves + torch.arange(self.dim_c), 2 + torch.arange(self.dim_c)] = 1.0
                continue
            for action in range(int(self.spec.avail_actions[i].sum())):
                move, message = divmod(action, n_moves)[::-1] if movable[i] else (0, action)
                table[i, action, :2] = torch.tensor(MOVES[move]) * SENSITIVITY
                if speaks[i]:
                    table[i, action, 2 + message] = 1.0
        return table

    def reset(self):
        self.reset_envs(torch.ones(self.n_envs, dtype=torch.bool))

    def reset_envs(self, envs):
        """New episodes (mpe2's `reset_world`) where `envs` (n_envs,) bool on the CPU."""
        pos = torch.rand(self.pos.shape, generator=self.generator) * 2 - 1
        goal = torch.randint(self.n_landmarks, self.goal.shape, generator=self.generator)
        self.steps = self.steps * ~envs
        keep = ~envs.to(self.device)[:, None, None]
        self.pos = torch.where(keep, self.pos, pos.to(self.device))
        self.vel, self.comm = self.vel * keep, self.comm * keep
        self.goal = torch.where(keep[:, 0], self.goal, goal.to(self.device))

    def step(self, actions: Tensor) -> StepResult:
        if self.spec.continuous and not torch.isfinite(actions).all():  # the one wait for the device, continuous only
            raise ErrorExit("the policy gave a continuous action that is NaN or infinite (it diverged)")
        rewards, final_obs, final_state = self.advance(actions)
        self.steps = self.steps + 1  # a new tensor: an earlier state_dict() stays as it was
        ended = self.steps >= self.max_cycles  # (n_envs,) on the CPU: the device hears of it only when one does
        obs, state, truncated = final_obs, final_state, self.never
        if ended.any():
            self.reset_envs(ended)
            obs, state = self.observations()
            truncated = ended.to(self.device)[:, None].expand(-1, self.n_agents)
        return StepResult(obs, state, rewards, self.never, truncated, final_obs, final_state, self.alive, self.avail)

    def advance(self, actions):
        """The world one step on (mpe2's `World.step`): its rewards, observations and state."""
        if self.spec.continuous:  # clipped into the box as mpe2 clips them
            effects = torch.einsum("eia,iac->eic", actions.clamp(0.0, 1.0), self.action_effects)
        else:
            effects = self.action_effects[self.agent_rows, actions]  # (n_envs, n_agents, 2 + dim_c)
        force, self.comm = effects[..., :2], effects[..., 2:]
        if self.env_id == "simple_spread_v3":
            force = force + self.contact_forces()
        self.integrate(force)
        relative, dist = self.relative_positions()
        return self.rewards(relative, dist), *self.observations(relative)

    def contact_forces(self):
        """(n_envs, n_agents, 2): mpe2's soft contact forces between spread's agents, at any distance."""
        agents = self.pos[:, : self.n_agents]
        delta = agents[:, :, None] - agents[:, None]  # (n_envs, n_agents, n_agents, 2): p_i - p_k
        dist = torch.linalg.vector_norm(delta, dim=-1, keepdim=True)
        penetration = F.softplus(-(dist - 2 * SPREAD_AGENT_SIZE) / CONTACT_MARGIN) * CONTACT_MARGIN
        forces = CONTACT_FORCE * penetration / dist * delta  # NaN for an agent and itself (0 / 0)
        return forces.nan_to_num_(0.0).sum(dim=2)

    def integrate(self, force):
        """mpe2's `integrate_state`: a movable agent moves at its old velocity, then damps and accelerates (mass 1)."""
        agents, landmarks, moves = self.pos[:, : self.n_agents], self.pos[:, self.n_agents :], self.movable[:, None]
        self.pos = torch.cat([agents + self.vel * DT * moves, landmarks], dim=1)
        self.vel = torch.where(moves, self.vel * (1 - DAMPING) + force * DT, self.vel)

    def relative_positions(self):
        """(n_envs, n_agents, n_entities, 2) with [.., i, j] = p_j - p_i, and the distances."""
        relative = self.pos[:, None] - self.pos[:, : self.n_agents, None]
        return relative, torch.linalg.vector_norm(relative, dim=-1)

    def observe(self) -> tuple[Tensor, ...]:
        return *self.observations(), self.alive, self.avail

    def observations(self, relative=None):
        """Observations (n_envs, n_agents, obs_dim) as each scenario's `observation`, zero-padded, and the state."""
        relative = self.relative_positions()[0] if relative is None else relative
        N = self.n_agents
        landmarks = relative[:, :, N:]  # (n_envs, n_agents, n_landmarks, 2)
        messages = self.comm[:, self.others]  # (n_envs, n_agents, n_agents - 1, dim_c): the other agents'
        if self.env_id == "simple_speaker_listener_v4":
            speaker = self.colours[self.goal[:, 0]]  # (n_envs, 3): the colour of the listener's goal landmark
            listener = torch.cat([self.vel[:, 1], landmarks[:, 1].flatten(1), messages[:, 1, 0]], dim=-1)
            obs = torch.stack([F.pad(speaker, (0, listener.shape[1] - speaker.shape[1])), listener], dim=1)
            return obs, torch.cat([speaker, listener], dim=-1)
        if self.env_id == "simple_reference_v3":  # goal colour: the landmark the other agent should reach
            parts = [self.vel, landmarks.flatten(2), self.colours[self.goal], messages.flatten(2)]
        else:
            others = relative[:, self.agent_rows[:, None], self.others]  # (n_envs, n_agents, n_agents - 1, 2)
            parts = [self.vel, self.pos[:, :N], landmarks.flatten(2), others.flatten(2), messages.flatten(2)]
        obs = torch.cat(parts, dim=-1)
        return obs, obs.flatten(1)[:, : self.spec.state_dim]  # none where the joined observations do not fit

    def rewards(self, relative, dist):
        """(n_envs, n_agents): each scenario's `reward`, mixed with its `global_reward` by mpe2's local ratio."""
        N = self.n_agents
        if self.env_id == "simple_speaker_listener_v4":  # both: minus the listener's squared distance to the goal
            to_goal = relative[:, 1, N:].take_along_dim(self.goal[:, :1, None], dim=1)  # (n_envs, 1, 2)
            return -to_goal.square().sum(dim=-1).expand(-1, N)
        if self.env_id == "simple_reference_v3":  # own: minus the other agent's distance to this agent's goal
            own = -dist[:, self.others[:, 0], N:].take_along_dim(self.goal[..., None], dim=2).squeeze(-1)
            return own.mean(dim=1, keepdim=True) * (1 - LOCAL_RATIO) + own * LOCAL_RATIO
        # spread: the team's minus the distance of each landmark's nearest agent; own: minus 1 per agent it overlaps
        team = -dist[:, :, N:].min(dim=1).values.sum(dim=1, keepdim=True)
        collisions = (dist[:, :, :N] < 2 * SPREAD_AGENT_SIZE).sum(dim=2) - 1  # each agent is at distance 0 from itself
        return team * (1 - LOCAL_RATIO) - collisions * LOCAL_RATIO

    def state_dict(self):
        return {**{name: getattr(self, name) for name in self.WORLD}, "generator": self.generator.get_state()}

    def load_state_dict(self, state):
        for name in self.WORLD:
            setattr(self, name, state[name].to("cpu" if name == "steps" else self.device))
        self.generator.set_state(state["generator"].cpu())


class ErrorExit(SystemExit):
    """Exits with status 1 and the one line `error: {message}`."""

    def __init__(self, message):
        super().__init__(f"error: {message}")


class EnvError(Exception):
    """An exception of the user's env, or a NaN or infinity it returned: one error line."""


def call_env(env_id, env, method, *args, **kwargs):
    try:
        return getattr(env, method)(*args, **kwargs)
    except Exception as e:
        raise e if isinstance(e, EnvError) else EnvError(f"--env-id {env_id}: its {method}() raised {e!r}") from None


class PettingZooEnv(gymnasium.Env):
    """A parallel env as a gymnasium env: observations (n_agents, obs_dim), a `StepResult` in info, its own resets."""

    def __init__(self, spec, render_mode=None):
        self.env, self.env_id, self.env_spec = make_env(spec.env_id, spec.scenario, render_mode), spec.env_id, spec
        n_agents, self.frames, self.recording, self.render_mode = len(spec.agents), [], False, render_mode
        self.observation_space = spaces.Box(-np.inf, np.inf, (n_agents, spec.obs_dim), np.float32)
        self.obs_sizes = [spaces.flatdim(s) for s in spec.obs_spaces]
        self.action_space = spaces.MultiDiscrete([spec.action_dim] * n_agents)
        if spec.continuous:  # the unit box, mapped to each agent's bounds by `env_action`
            self.action_space = spaces.Box(0.0, 1.0, (n_agents, spec.action_dim), np.float32)

    def env_action(self, agent, action: np.ndarray):
        space = self.env.action_space(agent)
        if not self.env_spec.continuous:
            return int(space.start) + int(action)
        return space.low + action[: len(space.low)].clip(0.0, 1.0) * (space.high - space.low)

    def stack(self, observations):
        """(n_agents, obs_dim) float32: the given agents' observations, zeros for the others."""
        obs = np.zeros(self.observation_space.shape, dtype=np.float32)
        if self.env_spec.action_masks == "observation":
            observations = {agent: own["observation"] for agent, own in observations.items()}
        for i, (agent, space, size) in enumerate(zip(self.env_spec.agents, self.env_spec.obs_spaces, self.obs_sizes)):
            if agent in observations:
                own = observations[agent]
                if isinstance(space, spaces.Box):  # as gymnasium's flatten, without its dispatch: 5x faster
                    flat = np.asarray(own, space.dtype).ravel()
                else:
                    flat = spaces.flatten(space, own) if space.contains(own) else ()
                if len(flat) != size:  # also one that fits another's padding
                    raise EnvError(f"--env-id {self.env_id}: an observation of {agent} does not fit its {space}")
                obs[i, :size] = flat
        return obs

    def reset(self, *, seed=None, options=None):
        if seed is not None:  # the vector env's reset: a rendering env records the episode it begins
            self.frames, self.recording = [], self.render_mode is not None
        observations, infos = call_env(self.env_id, self.env, "reset", seed=seed)
        self.alive = np.ones(len(self.env_spec.agents), dtype=bool)
        self.frames += [call_env(self.env_id, self.env, "render")] if self.recording else []
        obs, avail = self.stack(observations), read_masks(self.env_spec, observations, infos, self.alive)
        self.last_state = env_state(self.env_spec, self.env, obs)
        return obs, {"state": self.last_state, "alive": self.alive, "avail": avail}

    def step(self, actions: np.ndarray):
        agents = self.env_spec.agents
        own = {agent: self.env_action(agent, actions[i]) for i, agent in enumerate(agents) if self.alive[i]}
        observations, rewards, terminations, truncations, infos = call_env(self.env_id, self.env, "step", own)
        self.frames += [call_env(self.env_id, self.env, "render")] if self.recording else []
        info = dict(
            rewards=np.array([rewards.get(a, 0.0) for a in agents], dtype=np.float32),
            terminated=np.array([terminations.get(a, not alive) for a, alive in zip(agents, self.alive)]),
            truncated=np.array([truncations.get(a, False) for a in agents]),
            last_obs=self.stack(observations),
        )
        if live := set(self.env.agents):  # a set: np.isin takes a millisecond at 495 agents
            self.alive, last_obs = np.array([agent in live for agent in agents]), info["last_obs"]
            obs = last_obs if self.alive.all() else np.where(self.alive[:, None], last_obs, np.float32(0))
            try:
                state = self.last_state = env_state(self.env_spec, self.env, obs)
            except EnvError as e:  # failing once an agent left, where the start-up probe saw no agent leave
                fix = "make state() answer then, or drop state_space (the critic then takes the observations joined)"
                raise (e if self.alive.all() else EnvError(f"{e} once an agent left, unseen at start: {fix}")) from None
            avail = read_masks(self.env_spec, observations, infos, self.alive)
            return obs, 0.0, False, False, info | dict(last_state=state, state=state, alive=self.alive, avail=avail)
        # The episode is over. Where state() cannot answer after the last step, the state before it bootstraps.
        if info["truncated"].any():
            with contextlib.suppress(EnvError):
                self.last_state = env_state(self.env_spec, self.env, info["last_obs"])
        last_state, self.recording = self.last_state, False
        obs, begin_info = self.reset()
        return obs, 0.0, False, False, info | {"last_state": last_state} | begin_info


class PettingZooVecEnv:
    """`VecEnv` of `PettingZooEnv`s in gymnasium's SyncVectorEnv or AsyncVectorEnv."""

    keeps_episodes = False  # a resumed run begins new episodes, seeded from the steps

    def __init__(self, spec, n_envs, seed, device, async_envs=False, render_first=False):
        render = lambda k: "rgb_array" if render_first and k == 0 else None
        makers = [functools.partial(PettingZooEnv, spec, render(k)) for k in range(n_envs)]
        self.envs = (gymnasium.vector.AsyncVectorEnv if async_envs else gymnasium.vector.SyncVectorEnv)(makers)
        if async_envs:  # a worker's exception: raised here as one line, not logged by gymnasium first
            gymnasium.logger.min_level = gymnasium.logger.ERROR + 1
        self.spec, self.n_envs, self.seed, self.device, self.steps = spec, n_envs, seed, device, 0

    def reset(self, seed=None):
        obs, info = call_env(self.spec.env_id, self.envs, "reset", seed=self.seed if seed is None else seed)
        self.current = self.tensors("reset", obs, info["state"], info["alive"], info["avail"])

    def observe(self) -> tuple[Tensor, ...]:
        return self.current

    def step(self, actions: Tensor) -> StepResult:
        obs, _, _, _, info = call_env(self.spec.env_id, self.envs, "step", actions.cpu().numpy())
        self.steps += 1
        self.current = self.tensors("step", obs, info["state"], info["alive"], info["avail"])
        rest = self.tensors("step", *map(info.get, ("rewards", "terminated", "truncated", "last_obs", "last_state")))
        return StepResult(*self.current[:2], *rest, *self.current[2:])

    def tensors(self, call, *arrays):
        if not all(np.isfinite(x).all() for x in arrays):
            raise EnvError(f"--env-id {self.spec.env_id}: its {call}() returned a NaN or infinity")
        return tuple(torch.as_tensor(x, device=self.device) for x in arrays)

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]
        self.reset(self.seed + self.steps)


@torch.no_grad()
def evaluate(agent, envs: PettingZooVecEnv, seed, args, stop: TrainingRun | None):
    """One episode per env k (seed + k) to its end, a stop or --eval-max-steps: returns (n_envs, n_agents), frames."""
    envs.reset(seed)
    returns = torch.zeros(envs.n_envs, len(envs.spec.agents), device=envs.device)
    playing = torch.ones(envs.n_envs, dtype=torch.bool, device=envs.device)  # in its first episode still
    hidden, starts = agent.initial_hidden(envs.n_envs)[0], playing.clone()
    for _ in range(args.eval_max_steps):
        if not playing.any() or (stop is not None and stop.signal is not None):
            break
        obs, _, _, avail = envs.observe()
        actions, _, hidden = agent.act(obs, avail, hidden, starts, deterministic=not args.eval_sample)
        step = envs.step(actions)
        returns += step.rewards * playing[:, None]
        playing &= ~step.ended
        starts = step.ended
    frames = envs.envs.get_attr("frames")[0]
    return returns.cpu().numpy(), np.stack(frames) if frames else None


def evaluate_and_record(agent, eval_envs: PettingZooVecEnv, args, writer, step, video, stop):
    """`evaluate` on a generator apart from training's; with --capture-video episode 0 to `video` and TensorBoard."""
    with torch.random.fork_rng(devices=[eval_envs.device] * (eval_envs.device.type == "cuda")):
        torch.manual_seed(seed := args.seed + 100_000)
        returns, frames = evaluate(agent, eval_envs, seed, args, stop)
    if frames is not None:
        os.makedirs(os.path.dirname(video), exist_ok=True)
        write_file(video, iio.imwrite("<bytes>", frames, plugin="FFMPEG", extension=".mp4", fps=10, macro_block_size=1))
        small = torch.from_numpy(frames[:, ::2, ::2]).permute(0, 3, 1, 2).unsqueeze(0)  # (1, T, 3, H/2, W/2)
        writer.add_video("eval/video", small, step, fps=10)
    return returns


def save_checkpoint(path, agent, value_norm, optimizer, args, global_step, **training):
    model = dict(agent=agent.state_dict(), value_norm=value_norm.state_dict(), optimizer=optimizer.state_dict())
    checkpoint = dict(script=SCRIPT, args=dataclasses.asdict(args), global_step=global_step)
    torch.save(checkpoint | model | training, data := io.BytesIO())  # in memory: a full disk is an OSError, below
    write_file(path, data.getbuffer())


def write_file(path, data):
    """Writes `data` whole or not at all, synced to the disk; a failed write is an OSError naming `path`."""
    try:
        with open(f"{path}.tmp", "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(f"{path}.tmp", path)
        with contextlib.suppress(OSError):  # the rename too, where the folder can be synced (not on Windows)
            folder = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
    except BaseException as error:  # a Ctrl-C too
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{path}.tmp")
        raise OSError(error.errno, error.strerror, path) if isinstance(error, OSError) else error from None


def load_checkpoint(path, device):
    """The checkpoint; a missing, unreadable or foreign file is one error line."""
    if not os.path.isfile(path):
        raise ErrorExit(f"checkpoint not found: {path}")
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except Exception:
        with open(path, "rb") as f:
            head = f.read(4096)
        text = head.decode("utf-8", errors="ignore").encode() == head
        what = "is a text file" if text else "is a binary file that torch.save did not write"
        if head.startswith(b"PK\x03\x04"):  # torch.save writes a zip archive
            what = "starts like a torch checkpoint but is truncated or damaged"
        raise ErrorExit(f"{path} {what if head else 'is empty'}; expected a {SCRIPT} checkpoint") from None
    keys = {"script", "agent", "value_norm", "optimizer", "args", "global_step"}
    if not isinstance(checkpoint, dict) or not keys <= set(checkpoint):
        raise ErrorExit(f"{path} is a torch file but not a checkpoint of these scripts; expected {SCRIPT}")
    if checkpoint["script"] != SCRIPT:
        raise ErrorExit(f"{path} is a {checkpoint['script']} checkpoint, this is {SCRIPT}")
    return checkpoint


def restore(checkpoint, agent, value_norm, optimizer, path):
    try:
        agent.load_state_dict(checkpoint["agent"])
        value_norm.load_state_dict(checkpoint["value_norm"])
        optimizer.load_state_dict(checkpoint["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise ErrorExit(f"checkpoint {path} does not fit this model: {' '.join(str(e).split()[:40])}") from None


def check_resume(args, checkpoint):
    if "progress" not in checkpoint:
        raise ErrorExit(f"{args.resume} holds a model only; --resume takes the checkpoint.pt of a run folder")
    if "env" not in checkpoint or "next_step" in checkpoint["progress"]:  # worker processes, or a saved schedule
        raise ErrorExit(f"{args.resume} was written by an earlier version of {checkpoint['script']}: no resume")
    # What a run learns from must match; the other flags of Args may change
    learned = {*vars(Hyperparameters()), "seed", "torch_deterministic", "env_kwargs", "async_envs"}
    learned -= set() if args.linear_lr_decay else {"total_timesteps"}  # it sets the decay's schedule
    saved = checkpoint["args"]
    differing = [
        f"--{name.replace('_', '-')} ({saved.get(name)!r} there, {value!r} here)"
        for name, value in vars(args).items()
        if name in learned and saved.get(name, value) != value
    ]
    if differing:
        raise ErrorExit(f"{args.resume} was trained with other settings: {', '.join(differing)}")
    batch, progress = args.batch, checkpoint["progress"]
    final_owed = progress["eval_step"] < progress["global_step"] == args.total_timesteps // batch * batch
    if checkpoint["global_step"] + batch > args.total_timesteps and not final_owed:
        raise ErrorExit(
            f"{args.resume} is at step {checkpoint['global_step']:,} already; "
            f"give a larger --total-timesteps than {args.total_timesteps:,} to go on"
        )


@dataclass
class Progress:
    iteration: int = 0
    global_step: int = 0
    best_eval: float = -np.inf
    eval_return: float = np.nan
    eval_step: int = 0  # where it was: one that an env fault stopped is due again after a resume
    train_return: float = np.nan


def due(step, interval, since):
    """Whether an event every `interval` env steps fell in the last `since` steps."""
    return step // interval > (step - since) // interval


def training_state(run: TrainingRun):
    """What a checkpoint holds besides the model, to go on exactly (the GRUs' states too)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return dict(
        progress=dataclasses.asdict(run.progress),
        env=run.envs.state_dict(),
        episode_returns=run.running_returns,
        rollout_start=(run.buffer.actor_hidden, run.buffer.critic_hidden, run.buffer.starts[0]),
        rng_states=dict(torch=torch.get_rng_state(), cuda=cuda),
    )


def resume_training(run: TrainingRun, checkpoint):
    run.envs.load_state_dict(checkpoint["env"])
    run.buffer.actor_hidden, run.buffer.critic_hidden, run.buffer.starts[0] = checkpoint["rollout_start"]
    if run.envs.keeps_episodes:
        run.running_returns = checkpoint["episode_returns"]
    else:  # new episodes begin
        run.buffer.starts[0] = True
    torch.set_rng_state(checkpoint["rng_states"]["torch"].cpu())
    if checkpoint["rng_states"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([state.cpu() for state in checkpoint["rng_states"]["cuda"]])


def first_line(error):
    return next(iter(str(error).strip().splitlines()), type(error).__name__)


def check_args(args):
    counts = "n_rollout_threads n_agents max_cycles episode_length ppo_epoch num_mini_batch hidden_size"
    counts += " n_eval_episodes eval_max_steps log_interval"
    chosen = "n_training_threads eval_interval checkpoint_interval"  # 0: the script chooses
    rules = [  # NaN fails every test
        ("at least 1", lambda v: v >= 1, counts),
        ("at least 0", lambda v: v >= 0, "seed ent_coef vf_coef nearest_k eval_n_agents " + chosen),
        ("positive", lambda v: v > 0, "lr clip max_grad_norm huber_delta"),
        ("between 0 and 1", lambda v: 0 <= v <= 1, "gamma gae_lambda"),
    ]
    for what, ok, names in rules:  # first: the checks below divide by some of them
        for name in names.split():
            if not ok(getattr(args, name)):
                raise ErrorExit(f"--{name.replace('_', '-')} must be {what}, not {getattr(args, name)}")
    batch = args.batch
    if args.resume is not None and args.eval_checkpoint is not None:
        raise ErrorExit("--resume and --eval-checkpoint exclude each other: one trains on, the other only evaluates")
    if args.track and os.environ.get("WANDB_MODE") not in ("offline", "dryrun", "disabled"):  # a key, no network
        try:
            why = "" if importlib.import_module("wandb").login(prompt=False, verify=False) else "none found"
        except Exception as error:  # a malformed key
            why = first_line(error)
        if why:
            raise ErrorExit(f"--track needs a W&B API key ({why}): run `wandb login`, or set WANDB_MODE=offline")
    if args.capture_video and importlib.util.find_spec("imageio_ffmpeg") is None:
        raise ErrorExit("--capture-video needs imageio-ffmpeg to write mp4 files (pip install imageio-ffmpeg)")
    if args.env_id != "simple_spread_v3" and args.sort_entities:
        raise ErrorExit(f"--sort-entities applies to simple_spread_v3 only, not {args.env_id}")
    if args.nearest_k and (args.env_id != "simple_spread_v3" or args.use_agent_id or args.separate_actors):
        raise ErrorExit("--nearest-k takes simple_spread_v3, --no-use-agent-id and one actor: an input of any N")
    if args.eval_n_agents and args.eval_checkpoint is None:
        raise ErrorExit("--eval-n-agents is for test mode: add --eval-checkpoint")
    if args.env_id in MPE_SCENARIOS and (args.env_kwargs or args.async_envs):
        raise ErrorExit("--env-kwargs and --async-envs apply to envs given by import path, not to MPE scenarios")
    if args.n_rollout_threads % args.num_mini_batch != 0:
        raise ErrorExit(
            f"--num-mini-batch {args.num_mini_batch} does not divide --n-rollout-threads {args.n_rollout_threads} "
            "(a minibatch holds whole envs: their sequences stay unbroken)"
        )
    if args.eval_checkpoint is None and args.total_timesteps < batch:
        raise ErrorExit(f"--total-timesteps {args.total_timesteps} is less than one rollout ({batch} env steps)")


def memory_estimate(spec, args):
    """Peak bytes of a run: floats per agent-step of a rollout, fitted to measured peaks (docs/speed.md)."""
    n_agents = len(spec.agents)
    with torch.device("meta"):  # the model's size without its memory: weights, gradients, Adam's two moments
        agent = build_agent(spec, args, torch.device("meta"))[0]
        critic_input = agent.critic_input(torch.zeros(1, n_agents, spec.obs_dim), torch.zeros(1, spec.state_dim))
    inputs = spec.obs_dim + spec.state_dim / n_agents  # floats of observation and state stored per agent-step
    _, rows, width = critic_input.shape  # critic rows per env: 1 (EP) or n_agents
    extra = rows * width - spec.state_dim  # the critic's inputs beyond the state
    critic = (3 * extra + 15 * args.hidden_size * (rows - 1)) / n_agents  # more inputs and activations than EP's
    per_agent_step = 4 * inputs + critic + 5 * args.hidden_size  # then one minibatch's, with the actor's joined ids
    per_agent_step += (14 * args.hidden_size + 250 + 1.5 * args.use_agent_id * n_agents) / args.num_mini_batch
    return int(4 * args.batch * n_agents * per_agent_step + 16 * sum(p.numel() for p in agent.parameters()))


def check_memory(spec, args, device):
    """Refuses a run that would not fit in free memory, with a fifth more for the allocator."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    elif os.path.exists("/proc/meminfo"):
        free = 1024 * int(next(line for line in open("/proc/meminfo") if line.startswith("MemAvailable")).split()[1])
    else:
        return
    if (need := 1.2 * memory_estimate(spec, args)) > free:
        raise ErrorExit(
            f"this run needs about {need / 2**30:.1f} GiB (rollout buffer, update, allocator), more than the "
            f"{free / 2**30:.1f} GiB free on {device.type}; use fewer --n-rollout-threads or more --num-mini-batch"
        )


def setup_torch(args):
    check_args(args)
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
    if args.cuda and device.type == "cpu":
        print("warning: --cuda was given but no GPU is available; running on CPU")
    torch.manual_seed(args.seed)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(args.n_training_threads or max(1, cores // 2))  # torch's own takes every core
    torch.backends.cudnn.deterministic = args.torch_deterministic
    return device


def new_run_dir(base):
    """Makes `base`, or `base_2`, ... if a run started in the same second took it."""
    os.makedirs(os.path.dirname(base), exist_ok=True)
    for n in itertools.count(1):
        with contextlib.suppress(FileExistsError):
            os.mkdir(run_dir := f"{base}_{n}" if n > 1 else base)
            return run_dir


def start_logging(run_dir, args, resumed_step):
    """TensorBoard (and wandb with --track); a resumed run hides what the stopped one logged after `resumed_step`."""
    run_name = os.path.basename(run_dir)
    if args.track:
        wandb = importlib.import_module("wandb")
        names = dict(project=args.wandb_project_name, entity=args.wandb_entity, name=run_name, id=run_name)
        init = functools.partial(wandb.init, **names, config=vars(args), sync_tensorboard=True, save_code=True)
        try:
            init(resume="allow")
        except wandb.errors.CommError as error:  # no network: the run goes on, W&B's files kept for `wandb sync`
            print(f"warning: W&B unreachable ({first_line(error)}); logging offline, `wandb sync` it later")
            wandb.teardown()
            init(mode="offline")
    if resumed_step is not None:
        return SummaryWriter(run_dir, purge_step=resumed_step + 1)
    writer = SummaryWriter(run_dir)
    table = "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    return writer


def log_iteration(writer, global_step, sps, seconds, lr, losses, episode_returns, agents):
    scalars = {"charts/learning_rate": lr} | ({} if sps is None else {"charts/SPS": sps})
    scalars |= {f"losses/{k}": v for k, v in losses.items()} | {f"perf/{k}_ms": 1000 * v for k, v in seconds.items()}
    if episode_returns is not None:
        scalars |= {"charts/episodic_return": episode_returns.mean(), "charts/team_return": episode_returns.sum()}
        scalars |= {f"charts/episodic_return_{name}": r for name, r in zip(agents, episode_returns)}
    for tag, value in scalars.items():
        writer.add_scalar(tag, value, global_step)


def progress_line(progress, total_steps, sps, losses, sampled):
    minutes, seconds = divmod(int((total_steps - progress.global_step) / max(sps, 1)), 60)
    eta = f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{seconds:02d}s"
    return (
        f"step {progress.global_step:>9,}/{total_steps:,} | SPS {sps:>5} | episodic_return {progress.train_return:7.2f}"
        f" | eval{' sampled' * sampled} {progress.eval_return:7.2f} | value_loss {losses['value_loss']:.4f} | entropy "
        f"{losses['entropy']:.3f} | ETA {eta}"
    )


def run_evaluation_only(args):
    """Test mode: evaluates a checkpoint on mpe2 with the settings it was trained with."""
    device = setup_torch(args)
    checkpoint = load_checkpoint(args.eval_checkpoint, device)
    saved = {k: v for k, v in checkpoint["args"].items() if k in vars(Args())}
    keep = "eval_checkpoint n_eval_episodes eval_max_steps capture_video seed cuda eval_n_agents".split()
    keep += ["eval_sample"] * args.eval_sample  # sampled where the checkpoint's run or this command says so
    args = dataclasses.replace(Args(**saved), **{k: v for k, v in vars(args).items() if k in keep})
    if args.eval_n_agents and not args.nearest_k:
        raise ErrorExit(f"--eval-n-agents needs a checkpoint trained with --nearest-k: {args.eval_checkpoint}")
    args = dataclasses.replace(args, n_agents=args.eval_n_agents or args.n_agents)
    spec = get_env_spec(args.env_id, scenario_kwargs(args))
    envs = PettingZooVecEnv(spec, args.n_eval_episodes, args.seed, device, args.async_envs, args.capture_video)
    agent, value_norm, optimizer = build_agent(spec, args, device)
    if args.eval_n_agents:  # another team size: what fits it (the policy, whose input does not depend on N)
        own = agent.state_dict()
        agent.load_state_dict(fits := {k: v for k, v in checkpoint["agent"].items() if v.shape == own[k].shape}, False)
        print(f"--eval-n-agents: loaded all but {sorted(own.keys() - fits.keys())} (their size depends on N)")
    else:
        restore(checkpoint, agent, value_norm, optimizer, args.eval_checkpoint)
    run_dir, step = os.path.dirname(os.path.abspath(args.eval_checkpoint)), checkpoint["global_step"]
    video = f"videos/{os.path.basename(run_dir)}/test_{step}.mp4" if args.capture_video else None
    with SummaryWriter(run_dir) if video else contextlib.nullcontext() as writer:
        returns = evaluate_and_record(agent, envs, args, writer, step, video, None)
    per_agent = ", ".join(f"{a} {r:.3f}" for a, r in zip(spec.agents, returns.mean(axis=0)))
    print(
        f"{args.eval_checkpoint} (trained {step} steps on {args.env_id}): eval{' sampled' * args.eval_sample} episodic"
        f"_return {returns.mean():.3f} +- {returns.mean(axis=1).std():.3f} over {len(returns)} episodes; {per_agent}"
        + (f"\nvideo written to {video}" if video else "")
    )
    return returns


if __name__ == "__main__":
    # TensorBoard's writer thread: main() raises its failure again, as the run's one line
    threading.excepthook = lambda hook: "tensorboard" in type(hook.thread).__module__ or threading.__excepthook__(hook)
    try:
        main(parse_args())
    except (EnvError, OSError) as error:  # before a training run's first update, or in test mode: nothing to keep
        raise ErrorExit(error) from None
