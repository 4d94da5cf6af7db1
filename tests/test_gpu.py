"""On a GPU only (skipped elsewhere): the PPO update replayed as CUDA graphs (`GraphedStep`) is the eager update,
step for step: the same parameters, Adam moments and logged statistics (to float rounding: kernels that add with
atomics may sum in another order on any two runs)."""

import importlib
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def update_three_times(m, args, graphed: bool) -> tuple:
    """Three updates of a fresh agent on one random rollout (25 steps of 8 envs: 200 samples), the learning rate
    changed between them as --linear-lr-decay does: the agent's parameters, Adam's state, each update's stats and the
    graph (none when eager)."""
    device = torch.device("cuda")
    spec = m.get_env_spec(args.env_id, m.scenario_kwargs(args))
    torch.manual_seed(0)
    agent, value_norm, optimizer = m.build_agent(spec, args, device)
    buffer = m.RolloutBuffer(25, 8, spec, device)
    for name in ("obs", "state", "values", "logprobs"):
        getattr(buffer, name, torch.empty(0)).normal_()
    buffer.actions.random_(0, spec.action_dim)
    buffer.alive[:, :, 0] = torch.rand(26, 8, device=device) < 0.8  # deaths: masked means see them
    advantages, returns = torch.randn(2, 25, 8, len(spec.agents), device=device)
    step = m.GraphedStep() if graphed else m.ppo_step
    stats = []
    for lr in (args.lr, args.lr / 2, args.lr / 4):
        for group in optimizer.param_groups:
            group["lr"] = lr
        stats.append(m.ppo_update(agent, optimizer, value_norm, buffer, advantages, returns, args, step))
    return [p.detach().clone() for p in agent.parameters()], optimizer.state_dict(), stats, getattr(step, "graph", 0)


@pytest.mark.parametrize("script", ["mappo_mpe", "mat_mpe", "mat_mpe_ep_critic"])
@pytest.mark.parametrize("num_mini_batch", [1, 2])
def test_the_update_as_cuda_graphs_is_the_eager_update(script, num_mini_batch):
    """ppo_epoch 4: three eager steps, the capture, then replays only (24 steps with two minibatches of 100)."""
    m = importlib.import_module(script)
    args = m.Args(ppo_epoch=4, num_mini_batch=num_mini_batch)
    eager, graphed = (update_three_times(m, args, g) for g in (False, True))
    close = dict(rtol=1e-5, atol=1e-6)
    for a, b in zip(eager[0], graphed[0]):
        torch.testing.assert_close(a, b, **close)
    for a, b in zip(eager[1]["state"].values(), graphed[1]["state"].values()):
        torch.testing.assert_close(a, b, **close)  # step, exp_avg, exp_avg_sq
    assert eager[1]["param_groups"] == graphed[1]["param_groups"]  # floats again: checkpoints as without graphs
    for a, b in zip(eager[2], graphed[2]):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6)
    assert isinstance(graphed[3], torch.cuda.CUDAGraph)  # captured: the later steps were replays
