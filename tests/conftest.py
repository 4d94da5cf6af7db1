"""What the test files share: running a script end to end on a tiny budget, and checking its output."""

import os
import subprocess
import sys

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
