"""What the test files share: running a script end to end on a tiny budget."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = ["--total-timesteps", "200", "--n-rollout-threads", "4", "--n-eval-episodes", "2", "--eval-interval", "100",
        "--log-interval", "100", "--ppo-epoch", "2"]


@pytest.fixture
def run_script(request):
    """`run_script(cwd, *flags, check=True)` runs the script named by the test module's SCRIPT."""
    script = os.path.join(ROOT, request.module.SCRIPT)

    def run(cwd, *flags, check=True) -> subprocess.CompletedProcess:
        env = {**os.environ, "SDL_VIDEODRIVER": "dummy"}
        result = subprocess.run([sys.executable, script, *flags], cwd=cwd, capture_output=True, text=True,
                                timeout=300, env=env)
        if check:
            assert result.returncode == 0, result.stderr[-3000:]
        return result

    return run
