"""benchmark.py's modes and benchmark.sh's commands; benchmark_plot.py on synthetic TensorBoard runs: the table's
numbers, the curves' averaging and the figures."""

import concurrent.futures
import itertools
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from conftest import TINY  # noqa: E402

import benchmark  # noqa: E402
import benchmark_plot as bp  # noqa: E402

STEPS = np.arange(1, 31) * 800  # 30 logs, as 32 threads x 25 steps per iteration


@pytest.fixture(autouse=True)
def fewer_bootstrap_resamples(monkeypatch):
    """The intervals' checks hold for any number of resamples; fewer keep the tests quick."""
    monkeypatch.setattr(bp, "BOOTSTRAP_REPS", 200)


def write_run(runs_dir, env_id, exp_name, seed, returns, n_agents, sps, minutes_per_log, absolute=None):
    """A run folder as the scripts write it, with the tags that benchmark_plot.py reads, and the absolute metric's
    episode returns as benchmark.sh writes them, if given."""
    run_dir = os.path.join(runs_dir, f"{env_id}__{exp_name}__{seed}__{1000 + seed}")
    writer = SummaryWriter(run_dir)
    start = time.time()
    for i, (step, value) in enumerate(zip(STEPS, returns)):
        wall_time = start + 60 * minutes_per_log * (i + 1)
        writer.add_scalar("charts/SPS", sps, step, walltime=wall_time)
        writer.add_scalar("charts/episodic_return", value, step, walltime=wall_time)
        writer.add_scalar("charts/team_return", n_agents * value, step, walltime=wall_time)
        if i % 10 == 9:  # an evaluation every 10 logs, 1 above the training return
            writer.add_scalar("eval/episodic_return", value + 1, step, walltime=wall_time)
    writer.close()
    if absolute is not None:
        with open(os.path.join(run_dir, "absolute_metric.json"), "w") as f:
            json.dump({"returns": absolute}, f)


@pytest.fixture
def grid_dir(tmp_path):
    """Spread: two seeds of script a (returns rising linearly) and one of b, all with their absolute metric;
    reference: one seed of a, without it."""
    rng = np.random.default_rng(0)
    returns = {
        ("simple_spread_v3", "a", 1): np.linspace(-30, -12, 30),
        ("simple_spread_v3", "a", 2): np.linspace(-28, -14, 30),
        ("simple_spread_v3", "b", 1): rng.normal(-20, 2, 30),
        ("simple_reference_v3", "a", 1): np.linspace(-25, -10, 30),
    }
    for (env_id, exp_name, seed), values in returns.items():
        n_agents = 3 if env_id == "simple_spread_v3" else 2
        absolute = ABSOLUTE.get((exp_name, seed)) if env_id == "simple_spread_v3" else None
        write_run(tmp_path / "runs", env_id, exp_name, seed, values, n_agents, 1000.0 * seed, 0.5, absolute)
    return tmp_path, returns


ABSOLUTE = {("a", 1): [-9.0, -11.0], ("a", 2): [-12.0, -12.0], ("b", 1): [-20.0, -10.0]}
POLICIES = {
    "simple_spread_v3": {"3": {"random": [-27.0, 0.5], "nearest landmark": [-16.0, 0.5], "scripted": [-8.5, 0.2]}}
}


def test_smooth_is_the_mean_of_the_last_logs():
    values = np.random.default_rng(1).normal(size=25)
    expected = [values[max(0, i - bp.SMOOTHING + 1) : i + 1].mean() for i in range(len(values))]
    np.testing.assert_allclose(bp.smooth(values), expected, rtol=1e-12)


def test_read_grid_groups_seeds_by_scenario_and_experiment(grid_dir):
    tmp_path, returns = grid_dir
    grid = bp.read_grid(tmp_path / "runs")
    counts = [(env_id, {name: len(runs) for name, runs in s.items()}) for env_id, s in grid.items()]
    assert counts == [("simple_spread_v3", {"a": 2, "b": 1}), ("simple_reference_v3", {"a": 1})]  # spread first
    run = grid["simple_spread_v3"]["a"][1]  # seed 2
    assert run.seed == 2
    np.testing.assert_array_equal(run.steps, STEPS)
    np.testing.assert_allclose(run.returns, returns[("simple_spread_v3", "a", 2)], rtol=1e-6)
    np.testing.assert_array_equal(run.eval_steps, STEPS[9::10])
    np.testing.assert_allclose(run.eval_returns, returns[("simple_spread_v3", "a", 2)][9::10] + 1, rtol=1e-6)
    assert run.absolute.tolist() == [-12.0, -12.0]
    assert grid["simple_reference_v3"]["a"][0].absolute.size == 0
    np.testing.assert_allclose(run.minutes, 0.5 * np.arange(1, 31), atol=0.05)
    assert run.sps == 2000.0


def test_interval_estimates_known_answers():
    """Five runs scoring 1..5: the IQM trims one run at each end (3), the mean is 3, and the optimality gap to 4 is
    4 - mean(1, 2, 3, 4, 4) = 1.2; every interval holds its point and lies within the scores. Equal runs leave
    nothing to resample: a point interval."""
    estimates = bp.interval_estimates({"x": np.arange(1.0, 6.0), "same": np.full(4, 2.0)}, target=4.0)
    np.testing.assert_allclose(estimates["x"][:, 0], [3.0, 3.0, 1.2])
    assert np.all(estimates["x"][:, 1] <= estimates["x"][:, 0]) and np.all(estimates["x"][:, 0] <= estimates["x"][:, 2])
    assert np.all(estimates["x"][:2, 1:] >= 1.0) and np.all(estimates["x"][:2, 1:] <= 5.0)
    assert estimates["x"][0, 1] < estimates["x"][0, 2]  # a real interval
    np.testing.assert_allclose(estimates["same"], [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0]])
    np.random.seed(1)  # rliable resamples from numpy's global generator: the intervals must not depend on its state
    again = bp.interval_estimates({"x": np.arange(1.0, 6.0), "same": np.full(4, 2.0)}, target=4.0)
    assert all(np.array_equal(estimates[name], again[name]) for name in estimates)


def test_improvement_probabilities_known_answers():
    """x = 1..5 against y = x + 1.5: x wins 6 of the 25 pairs (3 > 2.5; 4 > 2.5, 3.5; 5 > 2.5, 3.5, 4.5); z, above
    every x, wins them all, so every resample gives 1."""
    x = np.arange(1.0, 6.0)
    p = bp.improvement_probabilities({"x": x, "y": x + 1.5, "z": x + 10})
    assert list(p) == [("x", "y"), ("x", "z"), ("y", "z")]
    assert p[("x", "y")][0] == pytest.approx(0.24) and p[("x", "y")][1] <= 0.24 <= p[("x", "y")][2]
    np.testing.assert_allclose(p[("x", "z")], [0.0, 0.0, 0.0])
    np.random.seed(1)  # the same intervals whatever state numpy's global generator is in
    assert all(np.array_equal(p[pair], q) for pair, q in bp.improvement_probabilities({"x": x, "y": x + 1.5}).items())


def test_results_table_numbers(grid_dir):
    """Spread a: absolute metrics -10 and -12 (the IQM of two runs keeps both: -11; the gap to scripted -8.5 is
    -8.5 - mean(-10, -12) = 2.5); reference a has no absolute metric; the improvement table compares a and b."""
    tmp_path, returns = grid_dir
    grid = bp.read_grid(tmp_path / "runs")
    env_info = {"simple_spread_v3": {"steps_per_s": 4000}}
    lines = bp.results_table(grid, env_info, POLICIES).splitlines()
    rows = {tuple(line.split(" | ")[:2]): line.split(" | ") for line in lines[2:] if line.count("|") == 12}
    assert [cell.split(" [")[0] for cell in rows[("| spread", "a")][4:7]] == ["-11.00", "-11.00", "2.50"]
    finals = [returns[("simple_spread_v3", "a", s)][-10:].mean() for s in (1, 2)]
    assert rows[("| spread", "a")][7].split(" [")[0] == f"{np.mean(finals):.2f}"  # two runs: IQM = mean
    assert rows[("| spread", "a")][2:4] == ["2", "24,000"] and rows[("| spread", "a")][8:] == [
        "1,500",
        "0.38",
        "15.0 min |",
    ]
    assert rows[("| spread", "b")][4:7] == ["-15.00 [-15.00, -15.00]", "-15.00 [-15.00, -15.00]", "6.50 [6.50, 6.50]"]
    assert rows[("| reference", "a")][4:7] == ["n/a"] * 3 and rows[("| reference", "a")][-2:] == ["n/a", "15.0 min |"]
    assert lines[-3:] == [
        "| scenario | X | Y | P(X > Y) on the absolute metric |",
        "|---|---|---|---|",
        "| spread | a | b | 1.00 [1.00, 1.00] |",
    ]


def test_resumed_run_counts_out_its_pause(tmp_path, monkeypatch):
    """A run stopped after log 17, resumed from its checkpoint at log 15 a day later: the two logs after the
    checkpoint are hidden, and the minutes go on from where the kept logs stopped."""
    run_dir = str(tmp_path / "simple_spread_v3__a__1__1000")
    writer = SummaryWriter(run_dir)
    started = time.time()
    for i in range(17):
        writer.add_scalar("charts/episodic_return", -20.0, STEPS[i], walltime=started + 30 * (i + 1))
    writer.close()
    resumed = float(int(started) + 86_400)  # event files are named with whole seconds
    monkeypatch.setattr(time, "time", lambda: resumed)
    writer = SummaryWriter(run_dir, purge_step=STEPS[14] + 1)
    monkeypatch.undo()
    for i in range(15, 30):
        writer.add_scalar("charts/episodic_return", -10.0, STEPS[i], walltime=resumed + 30 * (i - 14))
    writer.close()
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    returns = events.Scalars("charts/episodic_return")
    assert [e.step for e in returns] == list(STEPS)
    seconds = bp.training_seconds(run_dir, np.array([e.wall_time for e in returns]), started)
    np.testing.assert_allclose(seconds, 30 * np.arange(1, 31), atol=1e-3)


def test_seed_curves_average_on_the_shortest_run(grid_dir):
    tmp_path, returns = grid_dir
    runs = bp.read_grid(tmp_path / "runs")["simple_spread_v3"]["a"]
    runs[1].steps, runs[1].returns = runs[1].steps[:20], runs[1].returns[:20]  # seed 2 stopped early
    x, curves = bp.seed_curves(runs, "steps")
    np.testing.assert_array_equal(x, STEPS[:20])
    assert curves.shape == (2, 20)
    np.testing.assert_allclose(curves[0], bp.smooth(returns[("simple_spread_v3", "a", 1)])[:20], rtol=1e-6)


def test_reference_lines_are_the_known_returns():
    policies = {**POLICIES, "simple_reference_v3": {"2": {"random": [-28.0, 0.4], "oracle": [-7.7, 0.3]}}}
    assert bp.reference_lines("simple_spread_v3", policies) == [
        ("random", -27.0, ":"),
        ("nearest landmark", -16.0, (0, (3, 1, 1, 1))),
        ("scripted", -8.5, "--"),
        ("JaxMARL MAPPO-RNN, 2M steps", -13.6, "-."),
    ]
    assert bp.reference_lines("simple_reference_v3", policies) == [("random", -28.0, ":"), ("oracle", -7.7, "--")]
    assert bp.reference_lines("simple_speaker_listener_v4", policies) == []


def test_main_writes_figures_table_and_marl_eval_json(grid_dir, capsys):
    tmp_path, returns = grid_dir
    (tmp_path / "env.json").write_text(json.dumps({"simple_spread_v3": {"steps_per_s": 4000}}))
    (tmp_path / "policies.json").write_text(json.dumps(POLICIES))
    out = tmp_path / "out"
    runs = str(tmp_path / "runs")
    bp.main(
        bp.Args(
            runs=runs,
            env_info=str(tmp_path / "env.json"),
            reference_policies=str(tmp_path / "policies.json"),
            out=str(out),
        )
    )
    for name in ("returns_vs_steps.png", "returns_vs_time.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "results.md").read_text() == capsys.readouterr().out
    assert len((out / "results.md").read_text().splitlines()) == 2 + 3 + 4  # the table, then the improvements
    data = json.loads((out / "marl_eval.json").read_text())
    assert list(data) == ["mpe2"] and list(data["mpe2"]) == ["simple_spread_v3", "simple_reference_v3"]
    assert list(data["mpe2"]["simple_spread_v3"]) == ["a", "b"]
    assert list(data["mpe2"]["simple_spread_v3"]["a"]) == ["seed_1", "seed_2"]
    seed = data["mpe2"]["simple_spread_v3"]["a"]["seed_2"]
    assert list(seed) == ["step_0", "step_1", "step_2", "absolute_metrics"]
    values = returns[("simple_spread_v3", "a", 2)][9::10] + 1
    for k, (step, value) in enumerate(zip(STEPS[9::10], values)):
        assert seed[f"step_{k}"]["step_count"] == step and seed[f"step_{k}"]["return"] == [pytest.approx(value)]
    assert seed["absolute_metrics"] == {"return": [-12.0, -12.0]}
    assert data["mpe2"]["simple_reference_v3"]["a"]["seed_1"]["absolute_metrics"] == {"return": []}


def test_scaling_table_and_figure_from_runs_at_several_team_sizes(tmp_path, capsys):
    """Runs named SCRIPT_nN: ordered by N (10 after 3), the final train return is the mean of the last 10% of logs
    (3 of 30), greedy the last evaluation, and the gap closed is measured from random to the strongest hand-written
    policy measured at that N (the planner at N=3, scripted at N=10, where the planner is missing). The points of an
    earlier scaling.json stay beside them, except where a run replaces one."""
    write_run(tmp_path / "runs", "simple_spread_v3", "a_n10", 1, np.full(30, -40.0), 10, 1000.0, 0.5)
    write_run(tmp_path / "runs", "simple_spread_v3", "a_n3", 1, np.linspace(-30, -1, 30), 3, 1000.0, 0.5)
    write_run(tmp_path / "runs", "simple_spread_v3", "a_n3", 2, np.linspace(-32, -3, 30), 3, 1000.0, 0.5)
    policies = {
        "simple_spread_v3": {
            "3": {
                "random": [-27.0, 0.5],
                "nearest landmark": [-16.0, 0.5],
                "scripted": [-9.0, 0.2],
                "planner": [-7.0, 0.2],
            },
            "10": {"random": [-55.0, 0.5], "nearest landmark": [-33.0, 0.5], "scripted": [-20.0, 0.2]},
        }
    }
    (tmp_path / "policies.json").write_text(json.dumps(policies))
    runs = bp.team_size_runs(bp.read_grid(tmp_path / "runs"))
    assert list(runs) == ["a"] and list(runs["a"]) == [3, 10] and len(runs["a"][3]) == 2
    train, greedy = bp.final_returns(runs["a"][3])
    assert train == pytest.approx(-3.0)  # the last 3 logs: seed 1's -3, -2, -1 and seed 2's -5, -4, -3
    assert greedy == pytest.approx(-1.0)  # the last evaluations, 1 above the last logs: 0 and -2
    out = tmp_path / "out"
    out.mkdir()
    earlier = {
        "a": {"3": {"seeds": 1, "env_steps": 9, "train": 0.0, "eval": 0.0}},
        "b": {"6": {"seeds": 1, "env_steps": 2_000_000, "train": -20.0, "eval": -15.0}},
    }
    (out / "scaling.json").write_text(json.dumps(earlier))
    bp.main(
        bp.Args(
            runs=str(tmp_path / "runs"), reference_policies=str(tmp_path / "policies.json"), scaling=True, out=str(out)
        )
    )
    table = (out / "scaling.md").read_text()
    points = json.loads((out / "scaling.json").read_text())
    assert {script: list(sizes) for script, sizes in points.items()} == {"a": ["3", "10"], "b": ["6"]}
    assert points["a"]["3"] == {
        "seeds": 2,
        "env_steps": 24_000,
        "train": pytest.approx(-3.0),
        "eval": pytest.approx(-1.0),
    }
    write_run(tmp_path / "runs", "simple_spread_v3", "mappo_mpe", 1, np.full(30, -40.0), 3, 1000.0, 0.5)
    with pytest.raises(SystemExit, match="named SCRIPT_nN .*, not mappo_mpe$"):
        bp.team_size_runs(bp.read_grid(tmp_path / "runs"))
    assert table == capsys.readouterr().out and (out / "returns_vs_agents.png").read_bytes()[:4] == b"\x89PNG"
    assert (
        table.splitlines()[2]
        == "| a | 3 | 2 | 24,000 | -3.00 | -1.00 | -27.00 | -16.00 | -9.00 | -7.00 | 120% / 130% |"
    )
    assert (
        table.splitlines()[3]
        == "| a | 10 | 1 | 24,000 | -40.00 | -39.00 | -55.00 | -33.00 | -20.00 | nan | 43% / 46% |"
    )
    assert table.splitlines()[4] == "| b | 6 | 1 | 2,000,000 | -20.00 | -15.00 | nan | nan | nan | nan | nan% / nan% |"


def test_run_records_keep_the_grid_without_its_event_files(grid_dir, monkeypatch, capsys):
    """--records: a record of each run with its absolute metric (the reference run has none: not recorded), never
    rewritten; the table and marl_eval.json read from the records alone equal those of the event files. A record keeps
    at most RECORD_POINTS points (here 7 of 30 logs: means of 5), its final return from the logs themselves, and the
    curves of its script smoothed over SMOOTHING logs still (2 points of 5)."""
    tmp_path, returns = grid_dir
    bp.main(bp.Args(str(tmp_path / "runs"), out=str(tmp_path / "from_runs")))
    bp.main(bp.Args(str(tmp_path / "runs"), out=str(tmp_path / "from_records"), records=str(tmp_path / "records")))
    assert sorted(os.listdir(tmp_path / "records")) == [
        "simple_spread_v3__a__1.json",
        "simple_spread_v3__a__2.json",
        "simple_spread_v3__b__1.json",
    ]
    spread = {k: v for k, v in returns.items() if k[0] == "simple_spread_v3"}
    for name in ("results.md", "marl_eval.json"):
        from_runs = (tmp_path / "from_runs" / name).read_text()
        if name == "results.md":  # the reference row is not in the records' grid
            from_runs = "\n".join(line for line in from_runs.splitlines() if "| reference |" not in line) + "\n"
        else:
            from_runs = json.dumps({"mpe2": {"simple_spread_v3": json.loads(from_runs)["mpe2"]["simple_spread_v3"]}})
        assert (tmp_path / "from_records" / name).read_text() == from_runs, name
    only = bp.Args(
        str(tmp_path / "runs"), out=str(tmp_path / "none"), records=str(tmp_path / "only"), records_only=True
    )
    bp.main(only)  # what the grid runs after each run: the records, nothing else
    assert len(os.listdir(tmp_path / "only")) == 3 and not (tmp_path / "none").exists()
    saved = json.loads((tmp_path / "records" / "simple_spread_v3__a__1.json").read_text())
    assert saved["cpu"] == torch.backends.cpu.get_cpu_capability() and saved["logs_per_point"] == 1
    modified = (tmp_path / "records" / "simple_spread_v3__a__1.json").stat().st_mtime_ns
    monkeypatch.setattr(bp, "RECORD_POINTS", 7)
    bp.save_records(str(tmp_path / "runs"), str(tmp_path / "records"))  # kept as it was
    assert (tmp_path / "records" / "simple_spread_v3__a__1.json").stat().st_mtime_ns == modified
    run = bp.read_run(str(tmp_path / "runs" / os.listdir(tmp_path / "runs")[0]))
    values = spread[("simple_spread_v3", "a", 1)]
    record = bp.run_record(run)
    assert record["logs_per_point"] == 5 and record["steps"] == STEPS[4::5].tolist()
    np.testing.assert_allclose(record["returns"], values.reshape(6, 5).mean(axis=1), atol=1e-4)
    assert record["final_return"] == pytest.approx(values[-10:].mean(), abs=1e-4)
    thinned = bp.Run(**{**record, **{k: np.array(v) for k, v in record.items() if isinstance(v, list)}})
    _, curve = bp.seed_curves([thinned], "steps")
    np.testing.assert_allclose(curve[0], bp.smooth(values.reshape(6, 5).mean(axis=1), 2), atol=1e-4)
    capsys.readouterr()


def test_main_without_runs_is_one_error_line(tmp_path):
    with pytest.raises(SystemExit, match="^error: no run folders"):
        bp.main(bp.Args(runs=str(tmp_path)))


def harness(capsys, *argv: str) -> str:
    """What `python benchmark.py ARGV` prints, run in this process."""
    capsys.readouterr()
    benchmark.main(list(argv))
    return capsys.readouterr().out


SCRIPTS = ["mappo_mpe.py", "mappo_mpe_rnn.py", "mat_mpe.py", "mat_mpe_ep_critic.py"]
SCENARIOS = ["simple_spread_v3", "simple_speaker_listener_v4", "simple_reference_v3"]


@pytest.mark.parametrize(
    "options, seeds, budgets",
    [
        ([], [5, 3, 3], [2_000_000, 2_000_000, 3_000_000]),  # the default: the README's grid, five seeds on spread
        (["--budget", "quick", "--seeds", "2"], [2, 2, 2], [500_000, 500_000, 800_000]),
    ],
)
def test_print_commands_is_one_command_per_run(capsys, options, seeds, budgets):
    expected = [
        f"python {ROOT}/{script} --env-id {env_id} --preset tuned --seed {seed} --total-timesteps {steps} --save-model"
        for env_id, n_seeds, steps in zip(SCENARIOS, seeds, budgets)
        for script, seed in itertools.product(SCRIPTS, range(1, n_seeds + 1))
    ]
    assert harness(capsys, "grid", "--print-commands", *options).splitlines() == expected


def test_print_commands_subset(capsys):
    out = harness(capsys, "grid", "--print-commands", "--scripts", "mat", "--scenarios", "reference", "listener")
    mat = f"python {ROOT}/mat_mpe.py --env-id"
    assert out.splitlines() == [
        f"{mat} simple_reference_v3 --preset tuned --seed {seed} --total-timesteps 3000000 --save-model"
        for seed in (1, 2, 3)
    ] + [f"{mat} simple_speaker_listener_v4 --preset tuned --seed {seed} --total-timesteps 2000000 --save-model"
         for seed in (1, 2, 3)]  # fmt: skip


def test_absolute_metric_re_evaluates_the_best_model_on_320_episodes(tmp_path, capsys):
    """`benchmark.py absolute` on a tiny run: 320 per-agent episode returns, seeded 1,000 past the run's seed; a second
    call keeps what the first wrote."""
    train = [sys.executable, os.path.join(ROOT, "mappo_mpe.py"), "--seed", "2", "--save-model", *TINY]
    subprocess.run(train, cwd=tmp_path, check=True, capture_output=True)
    (run,) = (tmp_path / "runs").iterdir()
    harness(capsys, "absolute", str(run))
    written = json.loads((run / "absolute_metric.json").read_text())
    assert written["checkpoint"] == "best_model.pt" and written["seed"] == 1002 and len(written["returns"]) == 320
    assert len(set(written["returns"])) > 1 and all(-200 < r < 0 for r in written["returns"])
    modified = (run / "absolute_metric.json").stat().st_mtime_ns
    assert harness(capsys, "absolute", str(run)) == ""
    assert (run / "absolute_metric.json").stat().st_mtime_ns == modified


@pytest.mark.parametrize(
    "options, message",
    [
        (["grid", "--jobs", "0"], "error: --jobs must be at least 1, not 0"),
        (["grid", "--seeds", "-1"], "error: --seeds must be at least 0, not -1"),
        (["panel", "--budget", "0"], "error: --budget must be at least 1, not 0"),
        (["devices", "--iterations", "0"], "error: --iterations must be at least 1, not 0"),
    ],
)
def test_counts_out_of_range_are_one_error_line(options, message):
    with pytest.raises(SystemExit, match=f"^{message}$"):
        benchmark.main(options)


def test_every_line_of_benchmark_sh_is_a_command_the_harness_takes():
    """benchmark.sh is short, and each `python benchmark.py` line in it parses (the loops' variables set to their first
    value), so that a renamed mode or flag cannot leave it behind; each other python line names a file there is."""
    lines = open(os.path.join(ROOT, "benchmark.sh")).read().splitlines()
    assert len(lines) <= 100
    commands = [line.split(";")[0].split("do ")[-1].strip() for line in lines if not line.lstrip().startswith("#")]
    commands = [command for command in commands if command.startswith("python ")]
    for command in commands:
        words = command.replace('"$script"', "mappo").replace('"$scenario"', "spread").split()
        if words[1] == "benchmark.py":
            tyro.extras.subcommand_cli_from_dict(benchmark.MODES, args=words[2:])
        else:
            assert os.path.exists(os.path.join(ROOT, words[1])), command
    blocks = re.findall(r"^  ([a-z-]+)\)", "\n".join(lines), re.M)
    assert f"usage: bash benchmark.sh {'|'.join(blocks)}" in "\n".join(lines) and len(commands) >= len(blocks)


def test_devices_tables_known_speeds(tmp_path, capsys):
    """`benchmark.py devices`'s table from runs of known timings (no threads to run): per run, its env steps, last SPS,
    the medians of its later two thirds of rollout and update times, and the steady SPS of an iteration of 4 envs x
    25 steps in their sum (100 env steps in 40 ms: 2,500)."""
    with SummaryWriter(tmp_path / "runs/simple_spread_v3__mappo_devices_cpu_4_eager__1__1") as writer:
        for step, (sps, rollout, update) in enumerate([(900, 90.0, 50.0), (1000, 30.0, 10.0), (1234, 30.0, 12.0)]):
            writer.add_scalar("charts/SPS", sps, 100 * (step + 1))
            writer.add_scalar("perf/rollout_ms", rollout, 100 * (step + 1))
            writer.add_scalar("perf/update_ms", update, 100 * (step + 1))
    out = harness(capsys, "devices", "--devices", "cpu", "--threads", "--bench", str(tmp_path))
    assert "| cpu | 4 | eager | 300 | 1,234 | 2,439 | 30.0 | 11.0 |" in out.splitlines()


@pytest.mark.parametrize("mode, sizes", [("acting", ["3", "6", "12"]), ("critic", ["3", "12"])])
def test_mat_timings_table_every_team_size(capsys, mode, sizes):
    """`benchmark.py acting|critic` with short timings: a row per team size, positive times whose ratio is the last
    column; for the critic, what the measurement is for at 12 agents, whatever the load: one pass per env beats one
    per agent (12 rows of 864 numbers, about 11x on the 2-core CPU). The acting times of a short window swing past
    each other under load."""
    threads = torch.get_num_threads()
    out = harness(capsys, mode, "--timing-seconds", "0.01")
    torch.set_num_threads(threads)  # the mode takes one thread
    rows = [line.strip("| ").split(" | ") for line in out.splitlines() if line[2:3].isdigit()]
    assert [row[0] for row in rows] == sizes
    for row in rows:
        first, second, ratio = float(row[-3]), float(row[-2]), float(row[-1].rstrip("x"))
        assert min(first, second) > 0 and ratio == pytest.approx(second / first, abs=0.01 + 0.01 * ratio)
    assert mode == "acting" or float(rows[-1][-1].rstrip("x")) > 2.0, rows[-1]


SMOKE_MODES = {  # benchmark.py's arguments, and a line its output holds, each mode with --smoke
    "speed": (["speed"], "end-to-end SPS"),
    "env-rate": (["env-rate"], "| simple_speaker_listener_v4 |"),
    "learn": (["learn", "listener", "--preset", "official"], "final SPS"),
    "learn-partial": (["learn", "partial"], "final SPS"),
    "official-task": (["official-task"], "final SPS"),
    "resume": (["resume"], "parameters bit-identical: True; "),
    "sweep": (["sweep"], "| g95e3 | `--gamma 0.95 --ent-coef 0.003` |"),
    "scaling": (["scaling", "--n-agents", "2"], "| mappo_mpe | 2 | 1 | 400 |"),
    "threads": (["threads"], "| generic | 1 |"),
    "devices": (["devices", "--devices", "cpu", "--threads", "4"], "| cpu | 4 | eager | 400 |"),  # --smoke's 400
    "panel": (["panel", "--envs", "lbf8", "--scripts", "mappo"], "| lbf8 | "),  # through docs/envs.md's wrapper
    "grid": (
        ["grid", "--scripts", "mappo", "--scenarios", "spread", "--seeds", "1"],
        "| spread | mappo_mpe | 1 | 400 |",
    ),
    "random-envs": (["random-envs"], "2 configurations, 0 defects"),
    "update-graph": (["update-graph", "--threads", "4"], "| `mappo_mpe.py` | 4 | "),  # the eager way: no GPU here
}


@pytest.mark.parametrize("mode", SMOKE_MODES)
def test_every_mode_runs_on_a_tiny_budget(tmp_path, capsys, mode):
    """Each mode of benchmark.py ends well with --smoke and prints its table (resume: a stopped and resumed run equal
    to one straight, parameters and logs), its runs in their own folder."""
    argv, line = SMOKE_MODES[mode]
    out = harness(capsys, *argv, "--smoke", "--bench", str(tmp_path))
    assert line in out, out[-3000:]
    if mode == "resume":
        assert "identical at every step: True []" in out


def test_the_panels_random_policy_is_seeded():
    """The random column of the panel is the same number at every measurement (it once moved by about 0.5)."""
    flags = benchmark.PANEL_ENVS["spread"].split()
    assert benchmark.random_return(flags) == benchmark.random_return(flags)


def test_a_stopped_run_resumes_from_its_newest_checkpoint(tmp_path):
    """The grid and the panel resume a run a sitting's end stopped: its newest checkpoint, never another run's."""
    names = [
        "epymarl_env__panel_lbf8_mat_1__1__100",
        "epymarl_env__panel_lbf8_mat_1__1__200",
        "x__panel_lbf8_mat_10__1__3",
    ]
    for age, name in enumerate(names):
        os.makedirs(tmp_path / name)
        (tmp_path / name / "checkpoint.pt").write_text("")
        os.utime(tmp_path / name / "checkpoint.pt", (1000 + age, 1000 + age))
    newest = str(tmp_path / names[1] / "checkpoint.pt")
    assert benchmark.resume_flags(str(tmp_path), "__panel_lbf8_mat_1") == ["--resume", newest]
    assert benchmark.resume_flags(str(tmp_path), "epymarl_env__panel_lbf8_mat_1__1") == ["--resume", newest]
    assert benchmark.resume_flags(str(tmp_path), "__panel_lbf8_mappo_1") == []


def test_a_runs_log_shows_each_line_while_it_runs(tmp_path):
    """A Python child's first line is in its log while the child still runs (a pipe buffers 8 kB unless told not to)."""
    log, go_on = tmp_path / "run.log", tmp_path / "go_on"
    child = f"import os, time\nprint('step 1')\nwhile not os.path.exists({str(go_on)!r}): time.sleep(0.05)"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        status = pool.submit(benchmark.run, [sys.executable, "-c", child], str(log), str(tmp_path))
        deadline = time.time() + 30
        while not (log.exists() and "step 1" in log.read_text()) and time.time() < deadline:
            time.sleep(0.05)
        seen = log.read_text() if log.exists() else ""
        go_on.touch()
        assert status.result(timeout=30) == 0
    assert seen == "step 1\n"


def test_the_readme_results_are_the_benchmark_tables():
    """Every cell of the README's results table (absolute metric IQM / train IQM, with their intervals) is the row of
    its script and scenario in the results.md of the grid at one commit, and the reference policies the quick start
    names are reference_policies.json's at N = 3."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    table = open(os.path.join(ROOT, "docs/benchmark/grid/results.md")).read()
    grid = {(c[0].strip("| "), c[1]): c for c in (line.split(" | ") for line in table.splitlines()) if len(c) > 8}
    rows = [line.strip("| ").split(" | ") for line in readme.splitlines() if line.startswith("| `") and " / " in line]
    rows = {row[0].strip("`")[: -len(".py")]: row for row in rows if "[" in row[1]}  # the results table's rows
    assert set(rows) == {"mappo_mpe", "mappo_mpe_rnn", "mat_mpe", "mat_mpe_ep_critic"}
    for script, row in rows.items():
        for column, scenario in enumerate(("spread", "speaker-listener", "reference"), start=1):
            source = grid[scenario, script]  # absolute metric IQM, train IQM
            assert row[column] == f"{source[4]} / {source[7]}", (script, scenario)
    policies = json.load(open(os.path.join(ROOT, "docs/benchmark/reference_policies.json")))["simple_spread_v3"]["3"]
    quoted = {"random": "random actions", "nearest landmark": "the nearest landmark", "scripted": "optimal assignment"}
    quoted["planner"] = "steers clear of the others"
    for name, words in quoted.items():
        assert f"{words} {policies[name][0]:.1f}" in " ".join(readme.split()), name
    assert f"(planner {policies['planner'][0]:.2f})" in readme


@pytest.mark.parametrize(
    "returncode,stdout,stderr,outcome",
    [
        (0, "run in runs/x\n", "", "clean"),
        (
            1,
            "step 1\n",
            "error: --env-id x: its step() raised ValueError('forbidden action 2 of a')\n",
            "forbidden action",
        ),
        (1, "", "error: --env-id x: unsupported actions\n", "one error line"),
        (
            1,
            "",
            "x.py:3: RuntimeWarning: invalid value\n  y = a + b\nerror: --env-id x: unsupported actions\n",
            "error line with other lines before it",
        ),
        (1, "", "Traceback (most recent call last):\n  File ...\nValueError: x\n", "traceback"),
        (0, "run in runs/x\n", "x.py:3: RuntimeWarning: invalid value in cast\n", "exit 0"),
    ],
)
def test_the_random_env_runner_classifies_what_happened(returncode, stdout, stderr, outcome):
    assert benchmark.classify(returncode, stdout, stderr)[0] == outcome


@pytest.mark.parametrize("seed,script", [(0, "mat"), (4, "mappo")])
def test_random_envs_of_seeds_keep_the_readmes_promise(seed, script):
    """Two drawn configurations of the random-env check (one that trains with masks and deaths, one a refused kind),
    each as the README promises: a clean run, or exactly one `error:` line that names what is wrong."""
    config = benchmark.random_env_config(seed)
    assert benchmark.promised_outcome(config)[0] == ["clean", "error"][seed > 0]
    outcome, last = benchmark.run_random_env(script, config)
    assert benchmark.random_env_verdict(config, outcome, last), (config, outcome, last)
