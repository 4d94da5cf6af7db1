"""Learning curves and a results table of a benchmark grid, read from the runs' TensorBoard event files.

Every run folder is named `{env_id}__{exp_name}__{seed}__{time}`, as the scripts name them; runs with the same
scenario and experiment name are seeds of one setting. For each scenario this draws the mean return per agent
over the seeds (a 10-log moving average, as the tables) with the range over the seeds shaded, once against env
steps and once against wall-clock time, with the hand-written policies as lines. It writes a Markdown table of the
final numbers in the evaluation protocol of Gorsane et al. 2022 (arXiv:2209.10485): the absolute metric (a run's
best model re-evaluated greedily on 320 episodes, `absolute_metric.json` in its folder, as `benchmark.py grid`
writes it) and the training return as IQM, mean and optimality gap with 95% stratified bootstrap confidence
intervals, and the probability that one script improves on another, all computed with `rliable` (Agarwal et al.
2021); and the same runs as JSON in marl-eval's layout (github.com/instadeepai/marl-eval), for marl-eval or for a
comparison with BenchMARL's output. With `--records DIR` it first keeps a small record of each finished run in DIR
and draws everything from the records, so that a grid can go on in another sitting, on another machine.

    python benchmark_plot.py bench/grid_quick/runs --env-info bench/grid_quick/env_info.json --out docs/benchmark
"""

import dataclasses
import itertools
import json
import os
import re
from collections import defaultdict

import numpy as np
import tyro
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter
from rliable import library, metrics
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

SCENARIO_NAMES = {
    "simple_spread_v3": "spread",
    "simple_speaker_listener_v4": "speaker-listener",
    "simple_reference_v3": "reference",
}
# Hand-written policies on mpe2 (reference_policies.py) drawn as lines, with their line styles; the best of them in a
# scenario is the target of its optimality gap
REFERENCE_POLICY_STYLES = {
    "random": ":",
    "nearest landmark": (0, (3, 1, 1, 1)),
    "scripted": "--",
    "planner": (0, (5, 1)),
    "oracle": "--",
}
SCALING_POLICIES = ("random", "nearest landmark", "scripted", "planner")  # spread's, in the scaling table and figure
GRID_N_AGENTS = {"simple_spread_v3": "3", "simple_speaker_listener_v4": "2", "simple_reference_v3": "2"}
# The best per-agent return of a peer implementation measured on the same mpe2 task, with its source: JaxMARL's
# MAPPO-RNN (github.com/FLAIROx/JaxMARL, baselines/MAPPO/mappo_rnn_mpe.py with its repository's settings,
# config/mappo_homogenous_rnn_mpe.yaml), 2M env steps, one seed, on the 2-core CPU of docs/benchmark.md.
PEER_RETURNS = {"simple_spread_v3": (-13.6, "JaxMARL MAPPO-RNN, 2M steps")}
SMOOTHING = 10  # logs averaged into one point of a curve and into the final return
RECORD_POINTS = 500  # points of a run record's curve at most
BOOTSTRAP_REPS = 2000  # resamples of each stratified bootstrap confidence interval


@dataclasses.dataclass
class Args:
    runs: tyro.conf.Positional[str]
    """folder holding the run folders (the `runs` folder the scripts write)"""
    env_info: str | None = None
    """JSON with each scenario's single-process random-action `steps_per_s` (as `benchmark.py grid` writes
    it); without it the table has no SPS ratio"""
    reference_policies: str = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "docs/benchmark/reference_policies.json"
    )
    """JSON of the hand-written policies' returns per agent on mpe2, as `reference_policies.py --out` writes it"""
    scaling: bool = False
    """the runs are spread at several team sizes, experiments named SCRIPT_nN (`benchmark.py scaling`):
    draw the final return per agent against N, with the hand-written policies, and write scaling.md and scaling.json;
    points of an earlier OUT/scaling.json stay where these runs have no script and N of theirs"""
    out: str = "benchmark"
    """folder for returns_vs_steps.png, returns_vs_time.png, results.md and marl_eval.json"""
    records: str | None = None
    """folder of run records (ENV__EXP__SEED.json, `run_record`): each run of RUNS with its absolute metric is added
    to it (one already there is kept), and the grid is read from the records alone, so that a grid goes on across
    machines and sessions without its event files"""
    records_only: bool = False
    """only add the records (the grid does after each run), no figures or tables"""


@dataclasses.dataclass
class Run:
    seed: int
    steps: np.ndarray  # (n_logs,) env steps at which charts/episodic_return was logged
    returns: np.ndarray  # (n_logs,) mean episode return per agent
    eval_steps: np.ndarray  # (n_evals,) env steps of the greedy evaluations
    eval_returns: np.ndarray  # (n_evals,) greedy policy's mean episode return per agent, on mpe2
    absolute: np.ndarray  # (n_episodes,) per-agent returns of the best model's re-evaluation; empty if not made
    minutes: np.ndarray  # (n_logs,) wall-clock minutes since the run started, the pauses before resumes left out
    sps: float  # env steps per second since the run (or its last resume) started, as the script logged it last
    final_return: float  # the mean of the last SMOOTHING logged returns
    logs_per_point: int = 1  # a record's curve holds means of this many consecutive logs
    cpu: str = ""  # a record's: the CPU kernels torch ran (AVX2, AVX512, ...); runs repeat value for value only on one


def read_run(path: str) -> Run:
    """The run of a run folder (its event files and absolute_metric.json), or of a run record (`run_record`)."""
    if path.endswith(".json"):
        with open(path) as f:
            record = json.load(f)
        arrays = {k: np.array(v) for k, v in record.items() if isinstance(v, list)}
        return Run(**{**record, **arrays})
    events = EventAccumulator(path, size_guidance={"scalars": 0})
    events.Reload()
    returns, evals = events.Scalars("charts/episodic_return"), events.Scalars("eval/episodic_return")
    absolute = []
    if os.path.exists(os.path.join(path, "absolute_metric.json")):
        with open(os.path.join(path, "absolute_metric.json")) as f:
            absolute = json.load(f)["returns"]
    return Run(
        seed=int(os.path.basename(path).split("__")[2]),
        steps=np.array([e.step for e in returns]),
        returns=np.array([e.value for e in returns]),
        eval_steps=np.array([e.step for e in evals]),
        eval_returns=np.array([e.value for e in evals]),
        absolute=np.array(absolute),
        minutes=training_seconds(path, np.array([e.wall_time for e in returns]), events.FirstEventTimestamp()) / 60,
        sps=events.Scalars("charts/SPS")[-1].value,
        final_return=float(np.mean([e.value for e in returns[-SMOOTHING:]])),
    )


def run_record(run: Run) -> dict:
    """The run as a small JSON-able record: its curve as at most RECORD_POINTS means of consecutive logs (at their
    last step and minute, rounded), its evaluations, absolute metric, SPS and final return as they are."""
    per_point = -(-len(run.steps) // RECORD_POINTS)  # logs per point, rounded up
    first = len(run.steps) % per_point or per_point  # the first point takes what does not divide
    means = [run.returns[:first].mean(), *run.returns[first:].reshape(-1, per_point).mean(axis=1)]
    ends = np.arange(first - 1, len(run.steps), per_point)  # the last log of each point
    return dict(
        seed=run.seed,
        steps=run.steps[ends].tolist(),
        returns=[round(float(x), 4) for x in means],
        eval_steps=run.eval_steps.tolist(),
        eval_returns=run.eval_returns.tolist(),
        absolute=run.absolute.tolist(),
        minutes=[round(float(x), 2) for x in run.minutes[ends]],
        sps=float(run.sps),
        final_return=run.final_return,
        logs_per_point=per_point,
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
    """{env_id: {exp_name: [one Run per seed]}} of the run folders (ENV__EXP__SEED__TIME) or records (ENV__EXP__SEED
    .json) in `runs_dir`: the scenarios in the order of SCENARIO_NAMES (others after them), the experiments and seeds
    in sorted order of the names."""
    grid = defaultdict(lambda: defaultdict(list))
    for name in sorted(os.listdir(runs_dir)):
        parts = name.removesuffix(".json").split("__")
        if len(parts) == 4 or len(parts) == 3 and name.endswith(".json"):
            env_id, exp_name = parts[:2]
            grid[env_id][exp_name].append(read_run(os.path.join(runs_dir, name)))
    order = list(SCENARIO_NAMES)
    return {env_id: grid[env_id] for env_id in sorted(grid, key=lambda e: order.index(e) if e in order else len(order))}


def smooth(values: np.ndarray, window: int = SMOOTHING) -> np.ndarray:
    """Mean of the last `window` values up to each point (fewer at the start)."""
    trailing_sums = np.convolve(values, np.ones(window))[: len(values)]
    return trailing_sums / np.minimum(np.arange(1, len(values) + 1), window)


def seed_curves(runs: list[Run], x: str) -> tuple[np.ndarray, np.ndarray]:
    """The seeds' smoothed returns interpolated onto the x (`steps` or `minutes`) of the shortest run:
    x (n_points,), returns (n_seeds, n_points)."""
    shortest = min(runs, key=lambda run: getattr(run, x)[-1])
    grid_x = getattr(shortest, x)
    smoothed = [smooth(run.returns, max(1, round(SMOOTHING / run.logs_per_point))) for run in runs]  # SMOOTHING logs
    return grid_x, np.stack([np.interp(grid_x, getattr(run, x), curve) for run, curve in zip(runs, smoothed)])


def reference_returns(env_id: str, policies: dict) -> dict[str, float]:
    """{policy: return per agent} of the hand-written policies measured in the grid's setting of `env_id`."""
    measured = policies.get(env_id, {}).get(GRID_N_AGENTS.get(env_id, ""), {})
    return {name: mean for name, (mean, _error) in measured.items()}


def interval_estimates(scores: dict[str, np.ndarray], target: float) -> dict[str, np.ndarray]:
    """{script: (3, 3)}: rows IQM, mean and optimality gap to `target` (how far the runs' scores fall short of it,
    those above counted as reaching it) of the scripts' per-run scores (n_runs,), columns the point estimate and
    the 95% stratified bootstrap confidence interval."""

    def aggregates(x):  # x: (n_runs, 1 task)
        return np.array(
            [metrics.aggregate_iqm(x), metrics.aggregate_mean(x), metrics.aggregate_optimality_gap(x, target)]
        )

    np.random.seed(0)  # rliable 1.2 resamples with numpy's global generator, whatever its random_state says
    points, intervals = library.get_interval_estimates(
        {name: x[:, None] for name, x in scores.items()}, aggregates, reps=BOOTSTRAP_REPS
    )
    return {name: np.column_stack([points[name], intervals[name].T]) for name in scores}


def improvement_probabilities(scores: dict[str, np.ndarray]) -> dict[tuple[str, str], np.ndarray]:
    """{(x, y): (3,)}: for every pair of scripts, the probability that a run of x scores above a run of y
    (ties count half) and its 95% stratified bootstrap confidence interval."""
    pairs = {(x, y): (scores[x][:, None], scores[y][:, None]) for x, y in itertools.combinations(scores, 2)}
    np.random.seed(0)  # as `interval_estimates`
    points, intervals = library.get_interval_estimates(pairs, metrics.probability_of_improvement, reps=BOOTSTRAP_REPS)
    return {pair: np.array([points[pair], *intervals[pair][:, 0]]) for pair in pairs}


def cell(estimate: np.ndarray) -> str:
    """ "point [low, high]" of a (3,) estimate."""
    return f"{estimate[0]:.2f} [{estimate[1]:.2f}, {estimate[2]:.2f}]"


def results_table(grid: dict[str, dict[str, list[Run]]], env_info: dict, policies: dict) -> str:
    """Per scenario and script: the absolute metric (each run's mean over its re-evaluation episodes) as IQM, mean
    and optimality gap to the scenario's best hand-written policy, and the training return (each run's mean of its
    last SMOOTHING logs) as IQM, all with 95% confidence intervals over the runs; SPS and its ratio to the
    single-process random-action env step rate, wall-clock time. Then the probability of improvement between the
    scripts on the absolute metric."""
    columns = ["scenario", "script", "seeds", "env steps", "absolute metric: IQM", "mean", "optimality gap"]
    columns += ["train: IQM", "SPS", "SPS / env rate", "wall-clock"]
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    improvements = []
    for env_id, settings in grid.items():
        references = reference_returns(env_id, policies)
        best = max((name for name in references if name != "random"), key=references.get, default=None)
        target = references[best] if best else np.nan
        absolute = {  # the scripts whose every run was re-evaluated
            name: np.array([run.absolute.mean() for run in runs])
            for name, runs in settings.items()
            if all(len(run.absolute) for run in runs)
        }
        measured = interval_estimates(absolute, target) if absolute else {}
        train = interval_estimates({n: np.array([r.final_return for r in rs]) for n, rs in settings.items()}, target)
        for exp_name, runs in settings.items():
            sps = np.mean([run.sps for run in runs])
            rate = env_info.get(env_id, {}).get("steps_per_s")
            scores = [cell(x) for x in measured[exp_name]] if exp_name in measured else ["n/a"] * 3
            lines.append(
                f"| {SCENARIO_NAMES.get(env_id, env_id)} | {exp_name} | {len(runs)} "
                f"| {min(run.steps[-1] for run in runs):,} | " + " | ".join(scores) + f" | {cell(train[exp_name][0])} "
                f"| {sps:,.0f} | {f'{sps / rate:.2f}' if rate else 'n/a'} "
                f"| {np.mean([run.minutes[-1] for run in runs]):.1f} min |"
            )
        if len(measured) > 1:
            for (x, y), p in improvement_probabilities(absolute).items():
                improvements.append(f"| {SCENARIO_NAMES.get(env_id, env_id)} | {x} | {y} | {cell(p)} |")
    if improvements:
        lines += ["", "| scenario | X | Y | P(X > Y) on the absolute metric |", "|---|---|---|---|", *improvements]
    return "\n".join(lines) + "\n"


def reference_lines(env_id: str, policies: dict) -> list[tuple[str, float, str]]:
    """(label, return per agent, line style) of the horizontal lines in a scenario's panel: the hand-written
    policies' returns (`policies`, as reference_policies.py writes them) and the best peer's, those that are known."""
    lines = [
        (name, value, REFERENCE_POLICY_STYLES[name]) for name, value in reference_returns(env_id, policies).items()
    ]
    peer_return, peer = PEER_RETURNS.get(env_id, (None, None))
    return lines + ([(peer, peer_return, "-.")] if peer else [])


def marl_eval_data(grid: dict[str, dict[str, list[Run]]]) -> dict:
    """The runs in marl-eval's layout: {"mpe2": {env_id: {script: {"seed_S": {"step_K": {"step_count": env steps,
    "return": [greedy return per agent]}, ..., "absolute_metrics": {"return": [one per episode]}}}}}}. The scripts
    log each evaluation's mean over its episodes, so a step's list holds that one number."""
    data = {}
    for env_id, settings in grid.items():
        for exp_name, runs in settings.items():
            for run in runs:
                seed = {
                    f"step_{k}": {"step_count": int(step), "return": [float(value)]}
                    for k, (step, value) in enumerate(zip(run.eval_steps, run.eval_returns))
                }
                seed["absolute_metrics"] = {"return": run.absolute.tolist()}
                data.setdefault("mpe2", {}).setdefault(env_id, {}).setdefault(exp_name, {})[f"seed_{run.seed}"] = seed
    return data


def plot_curves(grid: dict[str, dict[str, list[Run]]], policies: dict, x: str, path: str) -> None:
    """One panel per scenario: each script's mean over seeds and the range over seeds, with the hand-written
    policies' and the best peer's returns as horizontal lines where known."""
    fig = Figure(figsize=(5 * len(grid), 4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(grid)))
    exp_names = sorted({exp_name for settings in grid.values() for exp_name in settings})
    colors = {exp_name: f"C{i}" for i, exp_name in enumerate(exp_names)}  # one color per script in every panel
    for ax, (env_id, settings) in zip(axes, grid.items()):
        for exp_name, runs in settings.items():
            grid_x, curves = seed_curves(runs, x)
            ax.plot(grid_x, curves.mean(axis=0), color=colors[exp_name], label=f"{exp_name} ({len(runs)} seeds)")
            ax.fill_between(grid_x, curves.min(axis=0), curves.max(axis=0), color=colors[exp_name], alpha=0.2)
        for label, value, style in reference_lines(env_id, policies):
            ax.axhline(value, color="gray", linestyle=style, label=label)
        ax.set_title(SCENARIO_NAMES.get(env_id, env_id))
        ax.set_xlabel("env steps" if x == "steps" else "wall-clock minutes")
        if x == "steps":
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 200k, 1M: raw step counts overlap
        ax.set_ylabel("episode return per agent")
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=100)


def team_size_runs(grid: dict[str, dict[str, list[Run]]]) -> dict[str, dict[int, list[Run]]]:
    """{script: {N: runs}} of the spread experiments named SCRIPT_nN, N ascending; another name is one error line."""
    experiments = grid.get("simple_spread_v3", {})
    misnamed = [name for name in experiments if not re.fullmatch(r".+_n[0-9]+", name)]
    if misnamed:
        raise SystemExit(
            f"error: --scaling reads spread experiments named SCRIPT_nN (as benchmark.py scaling "
            f"names them), not {misnamed[0]}"
        )
    runs = defaultdict(dict)
    for exp_name, seeds in sorted(experiments.items(), key=lambda e: int(e[0].rsplit("_n", 1)[1])):
        script, n = exp_name.rsplit("_n", 1)
        runs[script][int(n)] = seeds
    return runs


def final_returns(seeds: list[Run]) -> tuple[float, float]:
    """Train and greedy return per agent at the end, each the mean over the seeds: train is the mean of a run's last
    10% of logged returns (steadier than its last logs), greedy its last evaluation on mpe2."""
    train = [run.returns[-max(1, len(run.returns) // 10) :].mean() for run in seeds]
    return float(np.mean(train)), float(np.mean([run.eval_returns[-1] for run in seeds]))


def scaling_points(runs: dict[str, dict[int, list[Run]]], earlier: dict) -> dict:
    """{script: {N: {seeds, env_steps, train, eval}}} of the runs, added to the points of an earlier scaling.json
    (runs whose folders were not kept); a run replaces the earlier point of its script and N."""
    points = {script: dict(sizes) for script, sizes in earlier.items()}
    for script, sizes in runs.items():
        for n, seeds in sizes.items():
            train, greedy = final_returns(seeds)
            steps = min(int(run.steps[-1]) for run in seeds)
            points.setdefault(script, {})[str(n)] = {
                "seeds": len(seeds),
                "env_steps": steps,
                "train": train,
                "eval": greedy,
            }
    return {script: dict(sorted(sizes.items(), key=lambda e: int(e[0]))) for script, sizes in sorted(points.items())}


def scaling_table(points: dict, policies: dict) -> str:
    """One row per script and team size: the final train and greedy returns per agent (mean over seeds), the
    hand-written policies' returns, and the share of the gap from random to the strongest of them that each closes."""
    measured = policies.get("simple_spread_v3", {})
    columns = ["script", "N", "seeds", "env steps", "train", "eval on mpe2", *SCALING_POLICIES]
    lines = ["| " + " | ".join([*columns, "gap closed, train / eval"]) + " |"]
    lines.append("|---" * (len(columns) + 1) + "|")
    for script, sizes in points.items():
        for n, point in sizes.items():
            ref = {name: measured.get(n, {}).get(name, [np.nan])[0] for name in SCALING_POLICIES}
            strongest = max((ref[name] for name in SCALING_POLICIES[1:] if np.isfinite(ref[name])), default=np.nan)
            closed = [(point[x] - ref["random"]) / (strongest - ref["random"]) for x in ("train", "eval")]
            lines.append(
                f"| {script} | {n} | {point['seeds']} | {point['env_steps']:,} | {point['train']:.2f} | "
                f"{point['eval']:.2f} | "
                + " | ".join(f"{v:.2f}" for v in ref.values())
                + f" | {closed[0]:.0%} / {closed[1]:.0%} |"
            )
    return "\n".join(lines) + "\n"


def plot_scaling(points: dict, policies: dict, path: str) -> None:
    """Final return per agent against the team size: each script's train (solid) and greedy (dashed) returns, the
    hand-written policies as gray lines."""
    fig = Figure(figsize=(6, 4.5), layout="constrained")
    ax = fig.subplots()
    for i, (script, sizes) in enumerate(points.items()):
        n_agents = [int(n) for n in sizes]
        ax.plot(n_agents, [p["train"] for p in sizes.values()], "o-", color=f"C{i}", label=f"{script}, train")
        ax.plot(n_agents, [p["eval"] for p in sizes.values()], "s--", color=f"C{i}", label=f"{script}, greedy on mpe2")
    measured = policies.get("simple_spread_v3", {})
    sizes = sorted(int(n) for n in measured)
    for name in [name for name in SCALING_POLICIES if all(name in measured[str(n)] for n in sizes)]:
        ax.plot(
            sizes,
            [measured[str(n)][name][0] for n in sizes],
            color="gray",
            linestyle=REFERENCE_POLICY_STYLES[name],
            label=name,
        )
    ax.set_xlabel("agents (and landmarks), N")
    ax.set_ylabel("episode return per agent")
    ax.set_title("spread: final return against team size")
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=100)


def save_records(runs_dir: str, records_dir: str) -> None:
    """A record (`run_record`) of each run folder of `runs_dir` that has its absolute metric, unless one is there."""
    import torch  # only here: the CPU kernels torch picks on this machine, where the grid ran

    os.makedirs(records_dir, exist_ok=True)
    for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []:
        path = os.path.join(records_dir, name.rsplit("__", 1)[0] + ".json")
        if name.count("__") == 3 and os.path.exists(os.path.join(runs_dir, name, "absolute_metric.json")):
            if not os.path.exists(path):
                with open(f"{path}.{os.getpid()}.tmp", "w") as f:
                    record = run_record(read_run(os.path.join(runs_dir, name)))
                    json.dump(record | {"cpu": torch.backends.cpu.get_cpu_capability()}, f)
                os.replace(f"{path}.{os.getpid()}.tmp", path)  # whole or not at all, beside another grid job


def read_json(path: str | None, default: dict) -> dict:
    if path is None or not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def main(args: Args) -> None:
    if args.records:
        save_records(args.runs, args.records)
    if args.records_only:
        return
    source = args.records or args.runs
    grid = read_grid(source) if os.path.isdir(source) else {}
    if not grid:
        raise SystemExit(
            f"error: no run folders named ENV__EXP__SEED__TIME (or records ENV__EXP__SEED.json) in {source}"
        )
    policies = read_json(args.reference_policies, {})
    os.makedirs(args.out, exist_ok=True)
    if args.scaling:
        points_path = os.path.join(args.out, "scaling.json")
        points = scaling_points(team_size_runs(grid), read_json(points_path, {}))
        write(points_path, json.dumps(points, indent=1))
        plot_scaling(points, policies, os.path.join(args.out, "returns_vs_agents.png"))
        table = scaling_table(points, policies)
    else:
        plot_curves(grid, policies, "steps", os.path.join(args.out, "returns_vs_steps.png"))
        plot_curves(grid, policies, "minutes", os.path.join(args.out, "returns_vs_time.png"))
        table = results_table(grid, read_json(args.env_info, {}), policies)
        write(os.path.join(args.out, "marl_eval.json"), json.dumps(marl_eval_data(grid)))
    write(os.path.join(args.out, "scaling.md" if args.scaling else "results.md"), table)
    print(table, end="")


if __name__ == "__main__":
    main(tyro.cli(Args))
