"""Tests for mat_mpe_ep_critic.py: the critic on the env's state, run once per env, then the transformer it keeps
from mat_mpe.py, then whole runs on a tiny budget. Code shared with the other scripts is kept equal by
test_shared_code.py."""

import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SCRIPT = "mat_mpe_ep_critic.py"  # run end to end by the run_script fixture (conftest.py)

from conftest import (  # noqa: E402
    GENERIC_ENVS,
    TINY,
    all_actions,
    all_alive,
    assert_a_resume_finishes_the_final_evaluation,
    assert_action_masks_are_obeyed,
    assert_an_env_fault_keeps_the_last_update,
    assert_bad_resumes_are_refused,
    assert_evaluations_of_a_continuing_task_end,
    assert_no_unavailable_action,
    assert_one_line_error,
    assert_resume_is_exact,
    assert_sigterm_checkpoint_resumes,
    assert_stops_cleanly,
    assert_the_encoder_takes_any_team_size,
    assert_the_value_clip_is_centred_on_the_values_acted_with,
    full_re_decode,
    random_masks,
    save_then_test_mode,
)

import mat_mpe_ep_critic as m  # noqa: E402

SCENARIOS = {
    # env_id: (n_agents, padded obs dim, action dim, state dim)
    "simple_spread_v3": (3, 18, 5, 54),
    "simple_reference_v3": (2, 21, 50, 42),
    "simple_speaker_listener_v4": (2, 11, 5, 14),
}
CPU = torch.device("cpu")


def env_spec(env_id: str = "simple_spread_v3", **args) -> m.EnvSpec:
    return m.get_env_spec(env_id, m.scenario_kwargs(m.Args(env_id=env_id, **args)))


def random_model(env_id="simple_spread_v3", n_agents=3, seed=0, **args) -> tuple[m.MultiAgentTransformer, m.EnvSpec]:
    """A model with large random weights, so that logits and values differ clearly between agents."""
    model_args = m.Args(env_id=env_id, n_agents=n_agents, **args)
    spec = m.get_env_spec(env_id, m.scenario_kwargs(model_args))
    torch.manual_seed(seed)
    model = m.MultiAgentTransformer(spec, model_args)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.reset_parameters()
            elif isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1.0, 0.3)
                module.bias.normal_(0.0, 0.3)
    return model, spec


@torch.no_grad()
def random_rollout(agent, spec, T: int, n_envs: int) -> m.RolloutBuffer:
    """A buffer of random observations and states, with the actions the agent takes on them."""
    buffer = m.RolloutBuffer(T, n_envs, spec, CPU)
    buffer.obs.normal_()
    buffer.state.normal_()
    buffer.avail[:] = random_masks(spec, buffer.obs)  # the update scores each action under the mask it had
    for t in range(T):
        buffer.actions[t], buffer.logprobs[t] = agent.act(buffer.obs[t], buffer.alive[t], buffer.avail[t])
    return buffer


# ----------------------------------------------------------------------------------------------------
# The critic: once per env
# ----------------------------------------------------------------------------------------------------


def test_sorted_critic_does_not_see_the_order_of_landmarks_in_the_state():
    """With --sort-entities the state critic sorts each agent's part of the state as the encoder sorts the
    observations: shuffling the landmark blocks of every part leaves the values exactly as they were."""
    model, spec = random_model(sort_entities=True)
    obs, state = torch.randn(32, 3, spec.obs_dim), torch.randn(32, 3, spec.obs_dim)  # mpe2's state joins observations
    shuffled = state.clone()
    shuffled[..., 4:10] = state[..., 4:10].unflatten(-1, (3, 2))[..., [2, 0, 1], :].flatten(-2)
    with torch.no_grad():
        values = model.get_value(obs, state.flatten(1))
        torch.testing.assert_close(model.get_value(obs, shuffled.flatten(1)), values, rtol=0, atol=0)
        plain, _ = random_model()
        assert not torch.allclose(plain.get_value(obs, shuffled.flatten(1)), plain.get_value(obs, state.flatten(1)))


@pytest.mark.parametrize("n_agents", [3, 12])
def test_once_per_env_equals_per_agent_on_replicated_states(n_agents):
    """The official buffer replicates the env's state for every agent and runs the critic per agent; here the
    critic runs once per env with one head per agent on the state and the encoder's representations, and agent i's
    value must be head i. Random weights against the replicated layout, in float64; then a known answer: a last
    layer of zero weights and biases 0..N-1 gives agent i the value i in every row (heads mixed up fail it)."""
    model, spec = random_model(n_agents=n_agents)
    model.double()
    obs, state = torch.randn(64, n_agents, spec.obs_dim).double(), torch.randn(64, spec.state_dim).double()
    values = model.get_value(obs, state)
    assert not torch.allclose(values, model.get_value(torch.randn_like(obs), state))  # the observations are read
    obs_rep = model.encode(model.agent_inputs(obs))  # (B, n_agents, n_embd)
    joined = torch.cat([state, obs_rep.flatten(1)], dim=-1)
    replicated = joined.unsqueeze(1).expand(-1, n_agents, -1)  # (B, n_agents, F), as the official accessor
    per_agent = model.critic(replicated).diagonal(dim1=1, dim2=2)  # agent i reads head i of its own row
    torch.testing.assert_close(values, per_agent, atol=1e-6, rtol=0)
    assert values.shape == (64, n_agents) and values.std(dim=0).min() > 0.01  # the state moves every agent's value
    last = model.critic[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.arange(n_agents))
    expected = torch.arange(n_agents, dtype=torch.float64).expand(64, -1)
    torch.testing.assert_close(model.get_value(obs, state), expected, atol=0, rtol=0)


def test_the_critic_sees_one_row_per_env_step(monkeypatch):
    """compute_values runs the critic on (T + 1) * n_envs rows, and on T * n_envs final states; the update on one
    row per sample; acting never calls it."""
    torch.manual_seed(0)
    T, n_envs, num_mini_batch = 5, 4, 2
    spec = env_spec()
    args = m.Args(ppo_epoch=2, num_mini_batch=num_mini_batch)
    agent, value_norm, optimizer = m.build_agent(spec, args, CPU)
    rows = []
    agent.critic.register_forward_hook(lambda module, inputs, output: rows.append(tuple(inputs[0].shape)))
    buffer = random_rollout(agent, spec, T, n_envs)
    assert rows == []
    buffer.compute_values(agent, value_norm)
    width = spec.state_dim + 3 * args.n_embd  # the state and the agents' representations
    assert rows == [((T + 1) * n_envs, width), (T * n_envs, width)]
    rows.clear()
    m.ppo_update(agent, optimizer, value_norm, buffer, torch.randn(T, n_envs, 3), torch.randn(T, n_envs, 3), args)
    assert rows == [(T * n_envs // num_mini_batch, width)] * (2 * num_mini_batch)


def test_critic_and_transformer_are_clipped_separately_and_share_no_parameters():
    torch.manual_seed(0)
    spec = env_spec()
    args = m.Args(ppo_epoch=1, max_grad_norm=1e-3)
    agent, value_norm, optimizer = m.build_agent(spec, args, CPU)
    critic = {id(p) for p in agent.critic.parameters()}
    assert critic and all(id(p) in critic for name, p in agent.named_parameters() if name.startswith("critic."))
    assert not hasattr(agent, "value_head")
    buffer = random_rollout(agent, spec, 4, 2)
    stats = m.ppo_update(agent, optimizer, value_norm, buffer, torch.randn(4, 2, 3), 10 * torch.randn(4, 2, 3), args)
    assert {"actor_grad_norm", "critic_grad_norm"} <= set(stats) and "grad_norm" not in stats
    assert stats["critic_grad_norm"] > 1e-3 and stats["actor_grad_norm"] > 1e-3  # both were clipped, each alone


def test_the_value_loss_trains_the_encoder_on_its_representations():
    """The update's values (from the encoder's representations of its teacher-forced pass) equal get_value's; the
    value loss alone moves the encoder, and never the decoder."""
    torch.manual_seed(0)
    spec = env_spec()
    agent = m.build_agent(spec, m.Args(), CPU)[0]
    buffer = random_rollout(agent, spec, 4, 2)
    obs, state = buffer.obs[:-1].flatten(0, 1), buffer.state[:-1].flatten(0, 1)
    actions, alive, avail = (x.flatten(0, 1) for x in (buffer.actions, buffer.alive[:-1], buffer.avail[:-1]))
    obs_rep = agent.evaluate_actions(obs, actions, alive, avail)[2]
    values = agent.critic_value(obs_rep, state)
    torch.testing.assert_close(values, agent.get_value(obs, state), atol=1e-5, rtol=0)
    values.sum().backward()
    grads = {name.split(".")[0] for name, p in agent.named_parameters() if p.grad is not None and p.grad.any()}
    assert grads == {"obs_encoder", "encoder_blocks", "critic"}


def test_without_a_state_the_critic_reads_each_agents_representation():
    """state_dim 0 (joined observations too large): one value head on each agent's representation."""
    spec = env_spec()._replace(has_state=False, state_dim=0)
    model = m.MultiAgentTransformer(spec, m.Args())
    obs = torch.randn(5, 3, spec.obs_dim)
    obs_rep = model.encode(model.agent_inputs(obs))
    values = model.get_value(obs, torch.zeros(5, 0))
    torch.testing.assert_close(values, model.critic(obs_rep)[..., 0], atol=0, rtol=0)
    assert values.shape == (5, 3) and model.critic[0][0].normalized_shape == (m.Args().n_embd,)


@pytest.mark.parametrize("lr,critic_lr", [(1e-3, 0.0), (0.0, 1e-3)])
def test_transformer_and_critic_learn_at_their_own_rates(lr, critic_lr):
    """`--lr` moves the transformer only and `--critic-lr` the critic only; the two groups hold every parameter once."""
    torch.manual_seed(0)
    spec = env_spec()
    args = m.Args(ppo_epoch=2, lr=lr, critic_lr=critic_lr)
    agent, value_norm, optimizer = m.build_agent(spec, args, CPU)
    grouped = [id(p) for group in optimizer.param_groups for p in group["params"]]
    assert sorted(grouped) == sorted(id(p) for p in agent.parameters())
    before = {name: p.detach().clone() for name, p in agent.named_parameters()}
    buffer = random_rollout(agent, spec, 4, 2)
    m.ppo_update(agent, optimizer, value_norm, buffer, torch.randn(4, 2, 3), 10 * torch.randn(4, 2, 3), args)
    moved = {name for name, p in agent.named_parameters() if not torch.equal(p, before[name])}
    critic = {name for name in before if name.startswith("critic.")}
    assert moved == (critic if critic_lr else set(before) - critic - {"std_logit"})


# ----------------------------------------------------------------------------------------------------
# The transformer (mat_mpe.py's, without the value head)
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_block,n_head,continuous", [(1, 1, False), (2, 2, False), (2, 2, True)])
def test_autoregressive_logprobs_equal_teacher_forced_ones(n_block, n_head, continuous):
    model, spec = random_model(n_block=n_block, n_head=n_head, continuous_actions=continuous)
    obs = torch.randn(256, 3, 18)
    with torch.no_grad():
        x, avail = model.agent_inputs(obs), all_actions(spec, obs)
        obs_rep = model.encode(x)
        torch.manual_seed(0)
        actions, logprobs = model.decode_autoregressive(obs_rep, avail, all_alive(obs), deterministic=False)
        torch.manual_seed(0)  # the same draws again: the head outputs those actions were drawn from
        _, _, outs = full_re_decode(model, obs_rep, avail, m.action_distribution)
        tf_logprobs, tf_entropy, _ = model.evaluate_actions(obs, actions, all_alive(obs), all_actions(spec, obs))
    torch.testing.assert_close(tf_logprobs, logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        tf_entropy, m.action_distribution(outs, avail, model.std_logit).entropy(), atol=1e-5, rtol=0
    )
    assert (tf_logprobs if continuous else tf_entropy).std() > 0.01


@pytest.mark.parametrize("n_agents,continuous", [(3, False), (8, False), (3, True)])
def test_cached_decoding_equals_full_re_decode(n_agents, continuous):
    model, spec = random_model(n_agents=n_agents, n_block=2, n_head=2, continuous_actions=continuous)
    obs = torch.randn(128, n_agents, spec.obs_dim)
    with torch.no_grad():  # each agent's turn under its own mask
        x, avail = model.agent_inputs(obs), random_masks(spec, obs)
        obs_rep = model.encode(x)
        results = []
        for decode in (
            lambda: model.decode_autoregressive(obs_rep, avail, all_alive(obs), False),
            lambda: full_re_decode(model, obs_rep, avail, m.action_distribution),
        ):
            torch.manual_seed(7)  # the same random draws, so both paths see the same earlier actions
            results.append(decode())
    (cached_actions, cached_logprobs), (full_actions, full_logprobs, _) = results
    torch.testing.assert_close(cached_actions, full_actions, atol=1e-5 if continuous else 0, rtol=0)
    torch.testing.assert_close(cached_logprobs, full_logprobs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("env_id", SCENARIOS)
def test_model_shapes(env_id):
    n_agents, obs_dim, action_dim, state_dim = SCENARIOS[env_id]
    model, spec = random_model(env_id, n_agents)
    assert (spec.obs_dim, spec.action_dim, spec.state_dim) == (obs_dim, action_dim, state_dim)
    obs, state = torch.randn(7, n_agents, obs_dim), torch.randn(7, state_dim)
    actions, logprobs = model.act(obs, all_alive(obs), all_actions(spec, obs))
    assert actions.shape == logprobs.shape == (7, n_agents) and actions.dtype == torch.long
    logprob, entropy, _ = model.evaluate_actions(obs, actions, all_alive(obs), all_actions(spec, obs))
    assert logprob.shape == entropy.shape == model.get_value(obs, state).shape == (7, n_agents)


@pytest.mark.parametrize("continuous", [False, True])
def test_first_ppo_epoch_starts_on_policy(continuous):
    """At lr 0 the update's teacher-forced pass gives every stored action the log-prob it was drawn with (ratio 1);
    the critic's values are the old ones, the value clip's centre.
    The weights are drawn large, so that each agent's outputs depend strongly on the tokens of the agents before it:
    an untrained model hardly reacts to them, and would pass with the tokens shifted wrongly."""
    torch.manual_seed(0)
    spec = env_spec(continuous_actions=continuous)
    args = m.Args(ppo_epoch=1, num_mini_batch=1, lr=0.0, continuous_actions=continuous)
    agent, value_norm, optimizer = m.build_agent(spec, args, CPU)
    with torch.no_grad():
        for weight in agent.parameters():
            weight.normal_(0.0, 0.5)
    buffer = random_rollout(agent, spec, 5, 2)
    if not continuous:
        assert_no_unavailable_action(buffer)
    stats = m.ppo_update(agent, optimizer, value_norm, buffer, torch.randn(5, 2, 3), torch.randn(5, 2, 3), args)
    assert stats["ratio"] == pytest.approx(1.0, abs=1e-6)
    assert stats["clipfrac"] == 0.0 and stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert_the_value_clip_is_centred_on_the_values_acted_with(m, agent, value_norm, optimizer, buffer, args)


# ----------------------------------------------------------------------------------------------------
# The script end to end
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env_id,continuous",  # spread's discrete actions: test_save_model_then_test_mode_with_video
    [(env_id, False) for env_id in SCENARIOS if env_id != "simple_spread_v3"] + [("simple_speaker_listener_v4", True)],
)
def test_script_end_to_end(tmp_path, run_script, env_id, continuous):
    flags = ["--env-id", env_id, *TINY] + (["--continuous-actions"] if continuous else [])
    if env_id == "simple_speaker_listener_v4":
        flags += ["--no-team-reward"]
    result = run_script(tmp_path, *flags)
    assert "step       200/200" in result.stdout
    runs = os.listdir(tmp_path / "runs")
    assert len(runs) == 1 and runs[0].startswith(f"{env_id}__mat_mpe_ep_critic__1__")


def test_linear_lr_decay_takes_each_rate_down_from_its_own_start(tmp_path, monkeypatch):
    """Two iterations: the second runs at half of each group's starting rate, which a resume would also use."""
    monkeypatch.chdir(tmp_path)
    m.main(m.parse_args([*TINY, "--linear-lr-decay", "--lr", "1e-3", "--critic-lr", "3e-3"]))
    (run_dir,) = (tmp_path / "runs").iterdir()
    groups = torch.load(run_dir / "checkpoint.pt", weights_only=True)["optimizer"]["param_groups"]
    assert [group["lr"] for group in groups] == [1e-3 * 0.5, 3e-3 * 0.5]


@pytest.mark.parametrize("env", ["dying_discrete", "multiwalker", "kaz"])
def test_generic_env_end_to_end(tmp_path, run_script, env):
    result = run_script(tmp_path, *GENERIC_ENVS[env], *TINY)
    assert "step       200/200" in result.stdout


def test_one_agent_trains(tmp_path, run_script):
    """Spread with a single agent: a sequence of one, no teammate to observe or collide with."""
    result = run_script(tmp_path, "--n-agents", "1", "--preset", "tuned", *TINY)
    assert "step       200/200" in result.stdout


def test_the_envs_action_masks_are_obeyed(tmp_path, run_script):
    assert_action_masks_are_obeyed(run_script, tmp_path)


def test_save_model_then_test_mode_with_video(tmp_path, run_script):
    _, result = save_then_test_mode(run_script, tmp_path, "--n-agents", "4")
    assert result.stdout.count("agent_") == 4


def test_continuous_actions_save_model_then_test_mode_with_video(tmp_path, run_script):
    save_then_test_mode(run_script, tmp_path, "--continuous-actions")


def test_ctrl_c_ends_the_run_with_one_line(tmp_path, stop_script):
    assert_stops_cleanly(stop_script, tmp_path)


def test_evaluations_of_a_continuing_task_end(tmp_path, stop_script, run_script):
    assert_evaluations_of_a_continuing_task_end(stop_script, run_script, tmp_path)


def test_resume_goes_on_exactly_as_an_uninterrupted_run(tmp_path, run_script):
    assert_resume_is_exact(run_script, tmp_path)


def test_sigterm_leaves_a_checkpoint_that_resumes(tmp_path, stop_script, run_script):
    assert_sigterm_checkpoint_resumes(stop_script, run_script, tmp_path)


def test_a_fault_of_the_users_env_keeps_the_last_update_and_resumes(tmp_path, run_script):
    assert_an_env_fault_keeps_the_last_update(run_script, tmp_path)


def test_bad_resumes_are_refused_in_one_line(tmp_path, run_script):
    assert_bad_resumes_are_refused(run_script, tmp_path, m)


def test_script_reports_bad_input_in_one_line(tmp_path, run_script):
    (tmp_path / "bad.pt").write_bytes(b"garbage")
    for flags, message in [
        (["--n-head", "5", *TINY], "does not divide --n-embd"),
        (["--eval-checkpoint", str(tmp_path / "bad.pt")], "is a text file"),
    ]:
        assert_one_line_error(run_script(tmp_path, *flags, check=False), message)


@pytest.mark.parametrize("n_agents", [2, 6, 10])
def test_nearest_k_gives_the_encoder_one_input_size_at_any_team_size(n_agents):
    assert_the_encoder_takes_any_team_size(m, env_spec(n_agents=n_agents))


def test_a_resume_after_a_fault_in_the_final_evaluation_finishes_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_a_resume_finishes_the_final_evaluation(m, tmp_path)
