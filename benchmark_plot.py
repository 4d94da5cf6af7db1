"""Learning curves and a results table of a benchmark grid, read from the runs' TensorBoard event files.

Every run folder is named `{env_id}__{exp_name}__{seed}__{time}`, as the scripts name them; runs with the same
scenario and experiment name are seeds of one setting. For each scenario this draws the mean return per agent
over the seeds (a 10-log moving average, as the tables) with the range over the seeds shaded, once against env
steps and once against wall-clock time, and writes a Markdown table of the final numbers.

    python benchmark_plot.py bench/grid_quick/runs --env-info bench/grid_quick/env_info.json --out docs/benchmark
"""

import dataclasses
import json
import os
from collections import defaultdict

import numpy as np
import tyro
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

SCENARIO_NAMES = {
    "simple_spread_v3": "spread",
    "simple_speaker_listener_v4": "speaker-listener",
    "simple_reference_v3": "reference",
}
# Per-agent return of a scripted near-optimal policy on mpe2 (optimal agent-landmark assignment, one-step
# lookahead; 300 episodes, measured for docs/tuning.md); none is known for the other scenarios.
SCRIPTED_RETURNS = {"simple_spread_v3": -9.0}
# The best per-agent return of a peer implementation measured on the same mpe2 task, with its source: JaxMARL's
# MAPPO-RNN (github.com/FLAIROx/JaxMARL, baselines/MAPPO/mappo_rnn_mpe.py with its repository's settings,
# config/mappo_homogenous_rnn_mpe.yaml), 2M env steps, one seed, on the 2-core CPU of docs/benchmark.md.
PEER_RETURNS = {"simple_spread_v3": (-13.6, "JaxMARL MAPPO-RNN, 2M steps")}
SMOOTHING = 10  # logs averaged into one point of a curve and into the final return


@dataclasses.dataclass
class Args:
    runs: tyro.conf.Positional[str]
    """folder holding the run folders (the `runs` folder the scripts write)"""
    env_info: str | None = None
    """JSON with each scenario's single-process random-action `steps_per_s` and `random_return` per agent (as
    `bash benchmark.sh grid` writes it); without it the table has no SPS ratio and the plots no random line"""
    out: str = "benchmark"
    """folder for returns_vs_steps.png, returns_vs_time.png and results.md"""


@dataclasses.dataclass
class Run:
    steps: np.ndarray  # (n_logs,) env steps at which charts/episodic_return was logged
    returns: np.ndarray  # (n_logs,) mean episode return per agent
    team_returns: np.ndarray  # (n_logs,) mean episode return summed over the agents
    eval_returns: np.ndarray  # (n_evals,) greedy policy's mean episode return per agent, on mpe2
    minutes: np.ndarray  # (n_logs,) wall-clock minutes since the run started, the pauses before resumes left out
    sps: float  # env steps per second since the run (or its last resume) started, as the script logged it last


def read_run(path: str) -> Run:
    events = EventAccumulator(path, size_guidance={"scalars": 0})
    events.Reload()
    returns = events.Scalars("charts/episodic_return")
    return Run(
        steps=np.array([e.step for e in returns]),
        returns=np.array([e.value for e in returns]),
        team_returns=np.array([e.value for e in events.Scalars("charts/team_return")]),
        eval_returns=np.array([e.value for e in events.Scalars("eval/episodic_return")]),
        minutes=training_seconds(path, np.array([e.wall_time for e in returns]), events.FirstEventTimestamp()) / 60,
        sps=events.Scalars("charts/SPS")[-1].value,
    )


def training_seconds(path: str, wall_times: np.ndarray, started: float) -> np.ndarray:
    """Seconds since `started` at each of `wall_times`, less each pause between a stop and its resume: a resumed
    run writes a new event file into its folder, named with the second it was opened."""
    opened = sorted(int(name.split(".")[3]) for name in os.listdir(path) if name.startswith("events.out.tfevents."))
    seconds = wall_times - started
    for opened_before, resumed in zip(opened, opened[1:]):
        stopped = wall_times[wall_times < resumed].max(initial=opened_before)  # its last log, as far as is known
        seconds[wall_times >= resumed] -= resumed - stopped
    return seconds


def read_grid(runs_dir: str) -> dict[str, dict[str, list[Run]]]:
    """{env_id: {exp_name: [one Run per seed]}}: the scenarios in the order of SCENARIO_NAMES (others after them),
    the experiments and seeds in sorted order of the folder names."""
    grid = defaultdict(lambda: defaultdict(list))
    for name in sorted(os.listdir(runs_dir)):
        parts = name.split("__")
        if len(parts) == 4:
            env_id, exp_name, _seed, _time = parts
            grid[env_id][exp_name].append(read_run(os.path.join(runs_dir, name)))
    order = list(SCENARIO_NAMES)
    return {env_id: grid[env_id] for env_id in sorted(grid, key=lambda e: order.index(e) if e in order else len(order))}


def smooth(values: np.ndarray) -> np.ndarray:
    """Mean of the last SMOOTHING values up to each point (fewer at the start)."""
    trailing_sums = np.convolve(values, np.ones(SMOOTHING))[: len(values)]
    return trailing_sums / np.minimum(np.arange(1, len(values) + 1), SMOOTHING)


def seed_curves(runs: list[Run], x: str) -> tuple[np.ndarray, np.ndarray]:
    """The seeds' smoothed returns interpolated onto the x (`steps` or `minutes`) of the shortest run:
    x (n_points,), returns (n_seeds, n_points)."""
    shortest = min(runs, key=lambda run: getattr(run, x)[-1])
    grid_x = getattr(shortest, x)
    return grid_x, np.stack([np.interp(grid_x, getattr(run, x), smooth(run.returns)) for run in runs])


def final(values: list[float]) -> str:
    """Mean ± sample standard deviation over the seeds (0 for one seed)."""
    return f"{np.mean(values):.2f} ± {np.std(values, ddof=1 if len(values) > 1 else 0):.2f}"


def results_table(grid: dict[str, dict[str, list[Run]]], env_info: dict) -> str:
    """One row per scenario and script: final training returns (`final` over the seeds of each run's mean of its
    last SMOOTHING logs), the greedy policy's return on mpe2 at the last evaluation, SPS and its ratio to the
    single-process random-action env step rate, wall-clock time."""
    columns = ["scenario", "script", "seeds", "env steps", "return per agent", "team return", "eval on mpe2"]
    columns += ["SPS", "SPS / env rate"]
    lines = ["| " + " | ".join([*columns, "wall-clock"]) + " |", "|---" * (len(columns) + 1) + "|"]
    for env_id, settings in grid.items():
        for exp_name, runs in settings.items():
            sps = np.mean([run.sps for run in runs])
            rate = env_info.get(env_id, {}).get("steps_per_s")
            env_steps = min(run.steps[-1] for run in runs)
            lines.append(
                f"| {SCENARIO_NAMES.get(env_id, env_id)} | {exp_name} | {len(runs)} | {env_steps:,} "
                f"| {final([run.returns[-SMOOTHING:].mean() for run in runs])} "
                f"| {final([run.team_returns[-SMOOTHING:].mean() for run in runs])} "
                f"| {final([run.eval_returns[-1] for run in runs])} "
                f"| {sps:,.0f} | {f'{sps / rate:.2f}' if rate else 'n/a'} "
                f"| {np.mean([run.minutes[-1] for run in runs]):.1f} min |"
            )
    return "\n".join(lines) + "\n"


def reference_lines(env_id: str, env_info: dict) -> list[tuple[str, float, str]]:
    """(label, return per agent, line style) of the horizontal lines in a scenario's panel: the random policy's,
    the scripted policy's and the best peer's returns, those that are known."""
    peer_return, peer = PEER_RETURNS.get(env_id, (None, None))
    lines = [
        ("random", env_info.get(env_id, {}).get("random_return"), ":"),
        ("scripted", SCRIPTED_RETURNS.get(env_id), "--"),
        (peer, peer_return, "-."),
    ]
    return [line for line in lines if line[1] is not None]


def plot_curves(grid: dict[str, dict[str, list[Run]]], env_info: dict, x: str, path: str) -> None:
    """One panel per scenario: each script's mean over seeds and the range over seeds, with the random, the
    scripted and the best peer's returns as horizontal lines where known."""
    fig = Figure(figsize=(5 * len(grid), 4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(grid)))
    exp_names = sorted({exp_name for settings in grid.values() for exp_name in settings})
    colors = {exp_name: f"C{i}" for i, exp_name in enumerate(exp_names)}  # one color per script in every panel
    for ax, (env_id, settings) in zip(axes, grid.items()):
        for exp_name, runs in settings.items():
            grid_x, curves = seed_curves(runs, x)
            ax.plot(grid_x, curves.mean(axis=0), color=colors[exp_name], label=f"{exp_name} ({len(runs)} seeds)")
            ax.fill_between(grid_x, curves.min(axis=0), curves.max(axis=0), color=colors[exp_name], alpha=0.2)
        for label, value, style in reference_lines(env_id, env_info):
            ax.axhline(value, color="gray", linestyle=style, label=label)
        ax.set_title(SCENARIO_NAMES.get(env_id, env_id))
        ax.set_xlabel("env steps" if x == "steps" else "wall-clock minutes")
        if x == "steps":
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 200k, 1M: raw step counts overlap
        ax.set_ylabel("episode return per agent")
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=100)


def main(args: Args) -> None:
    grid = read_grid(args.runs) if os.path.isdir(args.runs) else {}
    if not grid:
        raise SystemExit(f"error: no run folders named ENV__EXP__SEED__TIME in {args.runs}")
    env_info = {}
    if args.env_info:
        with open(args.env_info) as f:
            env_info = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    plot_curves(grid, env_info, "steps", os.path.join(args.out, "returns_vs_steps.png"))
    plot_curves(grid, env_info, "minutes", os.path.join(args.out, "returns_vs_time.png"))
    table = results_table(grid, env_info)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table)
    print(table, end="")


if __name__ == "__main__":
    main(tyro.cli(Args))
