"""The machine's faults and a review's findings, in every script: a full disk (also in TensorBoard's thread), durable
writes, W&B without a usable key or a network, a run folder given to --resume, a stop after the final save and while
model.pt is written, MAT's passes, and an env with no state. (A final evaluation owed
by a resume: conftest's `assert_a_resume_finishes_the_final_evaluation`; the weights in the memory estimate:
test_memory.py.)"""

import errno
import importlib
import os
import resource
import signal
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from conftest import TINY  # noqa: E402

SCRIPTS = ["mappo_mpe", "mappo_mpe_rnn", "mat_mpe", "mat_mpe_ep_critic"]


@pytest.mark.parametrize("script", ["mappo_mpe", "mappo_mpe_rnn"])  # TrainingRun's two versions; the rest is shared
def test_a_full_disk_is_one_error_line_that_names_the_checkpoint_kept(script, tmp_path, monkeypatch):
    """Every file over half a checkpoint's size fails to be written (EFBIG, as a full disk's ENOSPC): the resumed run
    ends with one line naming the file, the cause and the checkpoint to resume from, which is the one before, whole,
    and leaves no temporary file. The run folder is given to --resume as users type it."""
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(script)
    module.main(module.parse_args(TINY))
    (run_dir,) = (tmp_path / "runs").iterdir()
    limit = os.path.getsize(run_dir / "checkpoint.pt") // 2
    flags = [*TINY[2:], "--total-timesteps", "400", "--save-model", "--resume", f"runs/{run_dir.name}"]
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, f"{script}.py"), *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-3000:]
    kept = f"{run_dir}/checkpoint.pt is kept: once that is mended, add --resume {run_dir}"
    assert result.stderr.startswith(f"error: {run_dir}/") and f".pt: File too large; {kept}" in result.stderr
    assert not [name for name in os.listdir(run_dir) if name.endswith(".tmp")]
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"] == 200


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_failed_write_in_tensorboards_thread_is_the_runs_one_line(script, tmp_path):
    """TensorBoard writes its events in a thread of its own; when the file cannot grow (past 48 KiB here, as on a full
    disk) that thread's traceback is not printed: the run's one line says it."""
    limit, flags = 48 * 1024, ["--n-rollout-threads", "1", "--episode-length", "1", "--ppo-epoch", "1"]
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, f"{script}.py"),
            *flags,
            "--total-timesteps",
            "300",
            "--n-eval-episodes",
            "1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert result.returncode == 1 and result.stderr == f"error: runs/{run_dir.name}: File too large\n", result.stderr
    assert [name.startswith("events.out.tfevents") for name in os.listdir(run_dir)] == [True]  # before any checkpoint


def test_a_write_is_synced_around_its_rename_and_a_ctrl_c_in_it_leaves_no_temporary_file(tmp_path, monkeypatch):
    """As databases write: the file's data synced to the disk before the rename, the folder's entry after it (where
    the filesystem can, and no descriptor left open where it cannot)."""
    module = importlib.import_module("mappo_mpe")  # write_file: the same in every script
    calls, fsync, replace = [], os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(os.readlink(f"/proc/self/fd/{fd}")) or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda old, new: calls.append(f"rename to {new}") or replace(old, new))
    path = str(tmp_path / "checkpoint.pt")
    module.write_file(path, b"weights")
    assert calls == [f"{path}.tmp", f"rename to {path}", str(tmp_path)]

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        module.write_file(path, b"other weights")
    assert os.listdir(tmp_path) == ["checkpoint.pt"] and open(path, "rb").read() == b"weights"

    def no_folder_sync(fd):  # as on a filesystem that cannot sync a folder: the file is written all the same
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    monkeypatch.setattr(os, "fsync", no_folder_sync)
    open_files = sorted(os.listdir("/proc/self/fd"))
    module.write_file(path, b"new weights")
    assert sorted(os.listdir("/proc/self/fd")) == open_files and open(path, "rb").read() == b"new weights"


@pytest.mark.parametrize("script", SCRIPTS)
def test_track_without_a_usable_wandb_key_is_one_error_line_before_the_run(script, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    module = importlib.import_module(script)
    needed = r"^error: --track needs a W&B API key \({}\): run `wandb login`, or set WANDB_MODE=offline$"
    with pytest.raises(SystemExit, match=needed.format("none found")):
        module.check_args(module.Args(track=True))
    monkeypatch.setenv("WANDB_API_KEY", "abc")  # wandb raises on a malformed key
    with pytest.raises(
        SystemExit, match=needed.format(r"WANDB_API_KEY invalid: API key must have 40\+ characters, has 3\.")
    ):
        module.check_args(module.Args(track=True))
    monkeypatch.setenv("WANDB_MODE", "offline")
    module.check_args(module.Args(track=True))


@pytest.mark.parametrize("script", SCRIPTS)
def test_track_without_a_network_goes_on_with_wandb_offline(script, tmp_path, monkeypatch, capsys):
    """wandb.init's CommError (its answer without a network, after its timeout): one line, then W&B offline."""
    import wandb

    calls = []

    def init(**kwargs):
        calls.append(kwargs.get("mode", "online"))
        if calls[-1] == "online":
            raise wandb.errors.CommError("Timed out while retrying: no route to host\nConsider increasing init_timeout")

    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.setattr(wandb, "teardown", lambda: calls.append("teardown"))
    module = importlib.import_module(script)
    module.start_logging(str(tmp_path / "run"), module.Args(track=True), None).close()
    assert calls == ["online", "teardown", "offline"]
    warning = "warning: W&B unreachable (Timed out while retrying: no route to host); logging offline, `wandb sync`"
    assert capsys.readouterr().out == warning + " it later\n"


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_stop_after_the_final_save_reports_a_finished_run(script, tmp_path, monkeypatch, capsys):
    """SIGTERM as the final checkpoint is written, and again while model.pt is (which the handler from before the run
    would act on): the run finished, so it says so (exit 0, the summary line), model.pt whole. MAT prints the passes it
    chose: 3 at a discount of 0.95."""
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(script)
    save, write_file = module.save_checkpoint, module.write_file

    def save_then_stop(path, *args, **training):
        save(path, *args, **training)
        if path.endswith("checkpoint.pt"):
            os.kill(os.getpid(), signal.SIGTERM)

    def stopped_while_writing(path, data):
        if os.path.basename(path) == "model.pt":
            os.kill(os.getpid(), signal.SIGTERM)
        write_file(path, data)

    monkeypatch.setattr(module, "save_checkpoint", save_then_stop)
    monkeypatch.setattr(module, "write_file", stopped_while_writing)
    flags = [*TINY, "--gamma", "0.95", "--save-model"] + ["--ppo-epoch", "0"] * script.startswith("mat")
    before = signal.signal(signal.SIGTERM, lambda *_: pytest.fail("a SIGTERM reached the handler from before the run"))
    try:
        summary = module.main(module.parse_args(flags))
    finally:
        signal.signal(signal.SIGTERM, before)
    assert summary["global_step"] == 200 and summary["eval_step"] == 200
    model = torch.load(tmp_path / "runs" / summary["run_name"] / "model.pt", weights_only=False)
    assert model["global_step"] == 200 and "progress" not in model
    out = capsys.readouterr().out
    assert "stopped by" not in out and out.splitlines()[-1].startswith("run in runs/")
    assert ("PPO passes over each rollout: 3\n" in out) == script.startswith("mat")


@pytest.mark.parametrize("script", ["mat_mpe", "mat_mpe_ep_critic"])
def test_the_official_preset_runs_mats_10_passes_whatever_the_discount(script):
    module = importlib.import_module(script)
    for env_id in ("simple_spread_v3", "simple_reference_v3", "simple_speaker_listener_v4"):
        assert module.parse_args(["--preset", "official", "--env-id", env_id, "--gamma", "0.95"]).ppo_epoch == 10


@pytest.mark.parametrize("script", ["mappo_mpe", "mappo_mpe_rnn"])
def test_without_a_state_the_run_records_the_local_critic_it_trains(script, tmp_path, monkeypatch):
    """Three 1,500-number observations joined exceed the 4,096 inputs: no state, so the critic is local whatever
    --state-type says; the checkpoint says so, and a resume with --state-type local goes on. A checkpoint that says EP
    (as the scripts wrote before issue 108) is refused in one line, as any other mismatch."""
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(script)
    flags = [*TINY, "--env-id", "tests.random_env", "--env-kwargs", "obs", "long", "n_agents", "3"]
    module.main(module.parse_args(flags))
    (run_dir,) = (tmp_path / "runs").iterdir()
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert saved["args"]["state_type"] == "local"
    resumed = [*flags, "--state-type", "local", "--total-timesteps", "400", "--resume", str(run_dir / "checkpoint.pt")]
    torch.save({**saved, "args": {**saved["args"], "state_type": "EP"}}, run_dir / "old.pt")
    with pytest.raises(
        SystemExit, match=r"^error: \S+old.pt was trained with other settings: --state-type \('EP' there"
    ):
        module.main(module.parse_args([*resumed[:-1], str(run_dir / "old.pt")]))
    assert module.main(module.parse_args(resumed))["global_step"] == 400


def test_a_full_disk_after_the_final_checkpoint_says_the_run_is_complete(tmp_path, monkeypatch):
    """model.pt, written after the final checkpoint, meets a full disk: nothing to resume, the line says so."""
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module("mappo_mpe")  # TrainingRun, write_file: the same in every script
    write_file = module.write_file

    def full_for_the_model(path, data):
        if os.path.basename(path) == "model.pt":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        write_file(path, data)

    monkeypatch.setattr(module, "write_file", full_for_the_model)
    end = r"model.pt: No space left on device; the run is complete in runs/\S+/checkpoint.pt$"
    with pytest.raises(SystemExit, match=r"^error: runs/\S+/" + end):
        module.main(module.parse_args([*TINY, "--save-model"]))


def test_a_stop_in_the_owed_final_evaluation_prints_and_saves_nothing(tmp_path, monkeypatch, capsys):
    """A resume owes its final evaluation (eval_step 0 at the last step); a SIGTERM cuts it short: no result is
    printed, the checkpoint still owes it, and the run says how to go on."""
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module("mappo_mpe")
    module.main(module.parse_args(TINY))
    (run_dir,) = (tmp_path / "runs").iterdir()
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    torch.save({**saved, "progress": {**saved["progress"], "eval_step": 0}}, run_dir / "checkpoint.pt")
    evaluate_and_record = module.evaluate_and_record

    def stopped_in_it(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        return evaluate_and_record(*args)

    monkeypatch.setattr(module, "evaluate_and_record", stopped_in_it)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        module.main(module.parse_args([*TINY, "--resume", str(run_dir)]))
    out = capsys.readouterr().out
    assert stop.value.code == 128 + signal.SIGTERM and "stopped by SIGTERM" in out and "final evaluation" not in out
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["progress"]["eval_step"] == 0
