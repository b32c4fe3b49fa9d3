"""rlreg follow on verl logs written while it reads them (a writer process appending records), its
resume after a restart, a trainer rewriting the file, and the verl logger adapter."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from registry import open_registry
from registry.cli.main import cli
from registry.integrations.follow import Follower, records_of, run_id_for
from registry.integrations.verl import RegistryLogger

REPO = Path(__file__).resolve().parents[1]

WRITER = textwrap.dedent("""
    import json, sys, time
    path, fmt, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    mode = "ab"
    with open(path, mode, buffering=0) as f:
        for step in range(first, last + 1):
            data = {"actor/ppo_kl": step / 1000, "critic/score/mean": step / 10, "val-core/gsm8k/acc/mean@4": 0.5}
            if fmt == "jsonl":
                f.write((json.dumps({"step": step, "data": data}) + "\\n").encode())
            else:
                line = "(TaskRunner pid=77) step:%d - " % step + " - ".join("%s:%s" % kv for kv in data.items())
                # a wrapped record: the second half on its own physical line
                f.write((line[:40] + "\\n").encode())
                time.sleep(0.01)
                f.write((line[40:] + "\\n").encode())
                f.write(b"(TaskRunner pid=77) Training Progress: 10%|#| some tqdm bar\\n")
            time.sleep(0.03)
""")


def write_in_background(path: Path, fmt: str, first: int, last: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), fmt, str(first), str(last)])


def check_run(db: str, path: Path, steps: list[int], status: str) -> dict:
    with open_registry(db) as reg:
        detail = reg.run_detail(run_id_for(path))
        assert detail["status"] == status and detail["framework"] == "verl"
        for key, scale in (("actor/ppo_kl", 1000), ("critic/score/mean", 10)):
            data = reg.read_series(detail["id"], key)
            assert list(data.steps) == steps, key
            assert np.allclose(data.values, [s / scale for s in steps])
        return detail


def test_follow_jsonl_while_written_until_the_final_step(tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    log = tmp_path / "grpo.jsonl"
    log.write_bytes(b"")
    writer = write_in_background(log, "jsonl", 1, 40)
    follower = Follower(log, db, project="math", final_step=40, idle_seconds=30, poll_seconds=0.05)
    seen_running = []

    def progress(f):
        with open_registry(db) as reg:
            seen_running.append(reg.run_detail(f.run_id)["status"])

    follower.run_until_done(progress)
    writer.wait(30)
    assert "running" in seen_running
    detail = check_run(db, log, list(range(1, 41)), "finished")
    assert detail["project"] == "math" and detail["name"] == "grpo"
    assert "val-core/gsm8k/acc/mean@4" in {s["key"] for s in detail["series"]}


def test_follow_console_log_with_wrapped_lines_and_resume_without_duplicates(tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    log = tmp_path / "verl_train.log"
    log.write_text("(TaskRunner pid=77) config: {...}\n")
    writer = write_in_background(log, "console", 1, 15)
    writer.wait(60)
    # the first follower stops when the file goes quiet (as if it was killed mid-training)
    Follower(log, db, idle_seconds=0.2, poll_seconds=0.05).run_until_done()
    check_run(db, log, list(range(1, 16)), "finished")
    # the trainer goes on; a second follower on the same file resumes after step 15
    writer = write_in_background(log, "console", 16, 25)
    result = CliRunner().invoke(cli, ["--db", db, "follow", str(log), "--final-step", "25", "--poll-seconds", "0.05",
                                      "--idle-seconds", "30", "--json"])
    writer.wait(60)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["last_step"] == 25 and answer["points"] == 10 * 3
    check_run(db, log, list(range(1, 26)), "finished")
    assert [step for step, _ in records_of(log)] == list(range(1, 26))


def test_a_restarted_trainer_rewriting_the_file_adds_only_new_steps(tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps({"step": s, "data": {"actor/ppo_kl": s / 1000, "critic/score/mean": s / 10}})
                           + "\n" for s in range(1, 11)))
    follower = Follower(log, db, idle_seconds=0.1, poll_seconds=0.05)
    assert follower.poll()
    # verl opens its file with "wb": after a restart from the step-6 checkpoint the file starts again
    log.write_text("".join(json.dumps({"step": s, "data": {"actor/ppo_kl": s / 1000, "critic/score/mean": s / 10}})
                           + "\n" for s in range(7, 13)))
    assert follower.poll()
    follower.finish()
    check_run(db, log, list(range(1, 13)), "finished")


def test_bad_jsonl_line_names_file_and_line(tmp_path):
    log = tmp_path / "run.jsonl"
    log.write_text('{"step": 1, "data": {"a": 1}}\n{"step": 2, "data": \n{"step": 3, "data": {"a": 3}}\n')
    result = CliRunner().invoke(cli, ["--db", f"sqlite:///{tmp_path / 'reg.db'}", "follow", str(log),
                                      "--idle-seconds", "0.1", "--poll-seconds", "0.05"])
    assert result.exit_code == 1 and "run.jsonl, line 2" in result.output


def test_verl_logger_adapter(tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    config = {"algorithm": {"adv_estimator": "grpo"}, "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}}},
              "trainer": {"project_name": "math", "experiment_name": "qwen-grpo", "logger": ["console", "rlregistry"]}}
    logger = RegistryLogger("math", "qwen-grpo", config, db=db)
    for step in range(1, 6):
        logger.log(data={"actor/ppo_kl": step / 1000, "critic/score/mean": step / 10, "timing_s/gen": 1.5},
                   step=step)
    logger.finish()
    with open_registry(db) as reg:
        detail = reg.run_detail(logger.run.id)
        assert detail["algorithm"] == "GRPO" and detail["framework"] == "verl" and detail["status"] == "finished"
        assert detail["params"]["actor_rollout_ref.actor.optim.lr"] == 1e-6
        series = {s["key"]: s for s in detail["series"]}
        assert series["actor/ppo_kl"]["definition"] is not None
        assert list(reg.read_series(detail["id"], "critic/score/mean").steps) == [1, 2, 3, 4, 5]
