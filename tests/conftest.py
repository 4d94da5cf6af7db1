"""What the test files share: running a script end to end on a tiny budget, and checking its output."""

import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = [
    "--total-timesteps",
    "200",
    "--n-rollout-threads",
    "4",
    "--n-eval-episodes",
    "2",
    "--eval-interval",
    "100",
    "--log-interval",
    "100",
    "--ppo-epoch",
    "2",
]


@pytest.fixture
def run_script(request):
    """`run_script(cwd, *flags, check=True)` runs the script named by the test module's SCRIPT."""
    script = os.path.join(ROOT, request.module.SCRIPT)

    def run(cwd, *flags, check=True) -> subprocess.CompletedProcess:
        env = {**os.environ, "SDL_VIDEODRIVER": "dummy"}
        result = subprocess.run(
            [sys.executable, script, *flags], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
        )
        if check:
            assert result.returncode == 0, result.stderr[-3000:]
        return result

    return run


@pytest.fixture
def stop_script(request):
    """`stop_script(cwd, target, *flags)` starts the test module's SCRIPT, waits for its first progress line, then
    sends `target` ("SIGINT" or "SIGTERM" to the main process, "kill-worker": SIGKILL to its first env worker).
    Returns the exit code, stdout and stderr, after checking that no process of the run is left."""
    script = os.path.join(ROOT, request.module.SCRIPT)

    def run(cwd, target, *flags) -> tuple[int, str, str]:
        env = {**os.environ, "SDL_VIDEODRIVER": "dummy"}
        command = [sys.executable, script, *flags]
        proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        first_line = proc.stdout.readline()
        assert first_line.startswith("step"), first_line + proc.stderr.read()[-2000:]
        workers = sorted(int(pid) for pid in subprocess.check_output(["pgrep", "-P", str(proc.pid)]).split())
        if target == "kill-worker":
            os.kill(workers[0], signal.SIGKILL)
        else:
            proc.send_signal(getattr(signal, target))
        out, err = proc.communicate(timeout=120)
        deadline = time.time() + 10
        while any(is_running(pid) for pid in workers) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(is_running(pid) for pid in workers)
        return proc.returncode, first_line + out, err

    return run


def is_running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


STOP_FLAGS = ["--total-timesteps", "1000000", "--n-rollout-threads", "4", "--n-workers", "2", "--n-eval-episodes", "2"]
STOP_FLAGS += ["--log-interval", "100", "--eval-interval", "10000000"]


def assert_stops_cleanly(stop_script, cwd):
    """Ctrl-C ends a run with exit code 130 and one line saying where the run and its model are; a killed env
    worker ends it with exit code 1 and one error line naming the worker."""
    code, out, err = stop_script(cwd, "SIGINT", *STOP_FLAGS, "--save-model")
    assert code == 130 and err == "", err[-2000:]
    (last,) = [line for line in out.splitlines() if not line.startswith("step")]
    (run_name,) = os.listdir(cwd / "runs")
    assert last.startswith("stopped by SIGINT at step ") and f"runs/{run_name}, with model.pt" in last
    assert os.path.exists(cwd / "runs" / run_name / "model.pt")
    code, out, err = stop_script(cwd, "kill-worker", *STOP_FLAGS)
    assert code == 1 and err.strip() == "error: training env worker 0 died (exit code -9)", err[-2000:]


def assert_one_line_error(result: subprocess.CompletedProcess, message: str):
    """The script failed with exit code 1 and a single `error: ...` line that contains `message`."""
    assert result.returncode == 1
    assert result.stderr.strip().startswith("error:") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def save_then_test_mode(run_script, cwd, *train_flags) -> tuple[str, subprocess.CompletedProcess]:
    """Trains with --save-model, then evaluates model.pt in test mode with a video; returns the run name
    and the test-mode result, after checking both checkpoints and the video were written."""
    run_script(cwd, *TINY, "--save-model", *train_flags)
    (run_name,) = os.listdir(cwd / "runs")
    run_dir = cwd / "runs" / run_name
    assert {"model.pt", "best_model.pt"} <= set(os.listdir(run_dir))
    result = run_script(
        cwd, "--eval-checkpoint", str(run_dir / "model.pt"), "--n-eval-episodes", "3", "--capture-video"
    )
    assert "trained 200 steps on simple_spread_v3" in result.stdout and "over 3 episodes" in result.stdout
    (video,) = os.listdir(cwd / "videos" / run_name)
    assert video == "test_200.mp4" and os.path.getsize(cwd / "videos" / run_name / video) > 1000
    return run_name, result
