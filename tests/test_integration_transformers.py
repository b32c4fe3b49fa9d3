"""RegistryCallback driven by a real transformers Trainer (and TRL's GRPOTrainer) on a tiny model
built from a config and a tokenizer built here with the tokenizers library: no downloads."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from registry import open_registry  # noqa: E402
from registry.integrations.transformers import RegistryCallback, split_logs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "park", "1", "2", "3", "4", "+", "="]


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<eos>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                                eos_token="<eos>")


def tiny_model(tokenizer):
    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=16, n_layer=1, n_head=2,
                                     bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                                     pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


class Sentences(torch.utils.data.Dataset):
    def __init__(self, tokenizer, n: int):
        import random

        rng = random.Random(0)
        self.items = []
        for _ in range(n):
            ids = tokenizer(" ".join(rng.choice(WORDS) for _ in range(8)))["input_ids"]
            self.items.append({"input_ids": torch.tensor(ids), "labels": torch.tensor(ids)})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def trainer_args(tmp_path: Path, **extra):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), run_name="tiny-lm", max_steps=6, per_device_train_batch_size=4,
        learning_rate=1e-3, logging_steps=1, eval_strategy="steps", eval_steps=3, save_steps=3,
        report_to=[], use_cpu=True, disable_tqdm=True, seed=0, **extra)


def test_split_logs_separates_eval_and_summary():
    metrics, summary = split_logs({"loss": 1.0, "eval_loss": 2.0, "test_acc": 0.5, "epoch": 1.0})
    assert metrics == {"loss": 1.0, "eval/loss": 2.0, "test/acc": 0.5, "epoch": 1.0} and summary == {}
    metrics, summary = split_logs({"train_runtime": 3.0, "train_loss": 1.5, "epoch": 2.0})
    assert metrics == {"epoch": 2.0} and summary == {"train_runtime": 3.0, "train_loss": 1.5}


def test_trainer_run_is_streamed_with_params_eval_checkpoints_and_status(tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    tokenizer = tiny_tokenizer()
    callback = RegistryCallback(project="lm", tags=["tiny"], db=db)
    trainer = transformers.Trainer(model=tiny_model(tokenizer), args=trainer_args(tmp_path),
                                   train_dataset=Sentences(tokenizer, 24), eval_dataset=Sentences(tokenizer, 8),
                                   callbacks=[callback])
    trainer.train()
    history = trainer.state.log_history

    with open_registry(db) as reg:
        detail = reg.run_detail(callback.run.id)
        assert detail["name"] == "tiny-lm" and detail["project"] == "lm" and detail["tags"] == ["tiny"]
        assert detail["status"] == "finished" and detail["framework"] == "transformers"
        params = detail["params"]
        assert params["learning_rate"] == pytest.approx(1e-3) and params["max_steps"] == 6
        assert params["model.n_embd"] == 16 and params["versions.transformers"] == transformers.__version__
        keys = {s["key"] for s in detail["series"]}
        assert {"loss", "grad_norm", "learning_rate", "eval/loss"} <= keys
        assert "eval_loss" not in keys and "train_runtime" not in keys
        # every training loss the Trainer logged, at its global step
        want = [(h["step"], h["loss"]) for h in history if "loss" in h]
        got = reg.read_series(callback.run.id, "loss")
        assert [(int(s), float(v)) for s, v in zip(got.steps, got.values)] == \
            [(s, pytest.approx(v, rel=1e-6)) for s, v in want]
        evals = reg.read_series(callback.run.id, "eval/loss")
        assert list(evals.steps) == [h["step"] for h in history if "eval_loss" in h] == [3, 6]
        summary = next(h for h in history if "train_runtime" in h)
        assert detail["scores"]["train_loss"] == pytest.approx(summary["train_loss"])
        ckpts = {c["step"]: c["uri"] for c in detail["checkpoints"]}
        assert set(ckpts) == {3, 6} and Path(ckpts[3]).is_dir() and ckpts[3].endswith("checkpoint-3")


def test_not_main_process_writes_nothing(tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    callback = RegistryCallback(db=db)
    state = transformers.TrainerState(is_world_process_zero=False)
    args = trainer_args(tmp_path)
    control = transformers.TrainerControl()
    callback.on_train_begin(args, state, control)
    callback.on_log(args, state, control, logs={"loss": 1.0})
    callback.on_train_end(args, state, control)
    assert callback.run is None
    with open_registry(db) as reg:
        assert reg.list_runs()[1] == 0
    # the same calls on the main process do write
    state.is_world_process_zero = True
    callback.on_train_begin(args, state, control)
    callback.on_log(args, state, control, logs={"loss": 1.0})
    callback.on_train_end(args, state, control)
    with open_registry(db) as reg:
        assert reg.list_runs()[1] == 1


CRASH_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import transformers
    from test_integration_transformers import tiny_tokenizer, tiny_model, Sentences, trainer_args
    from registry.integrations.transformers import RegistryCallback
    from pathlib import Path

    class Boom(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 4:
                raise RuntimeError("out of memory (simulated)")

    tok = tiny_tokenizer()
    cb = RegistryCallback(name="crashes", db={db!r})
    trainer = transformers.Trainer(model=tiny_model(tok), args=trainer_args(Path({tmp!r})),
                                   train_dataset=Sentences(tok, 24), eval_dataset=Sentences(tok, 8),
                                   callbacks=[cb, Boom()])
    print(cb, flush=True)
    trainer.train()
""")


def test_exception_in_training_marks_the_run_crashed_with_its_points(tmp_path):
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    script = CRASH_SCRIPT.format(tests=str(REPO / "tests"), db=db, tmp=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode != 0 and "out of memory (simulated)" in proc.stderr
    with open_registry(db) as reg:
        (run,) = reg.list_runs()[0]
        detail = reg.run_detail(run["id"])
        assert detail["status"] == "crashed"
        loss = reg.read_series(run["id"], "loss")
        assert list(loss.steps) == [1, 2, 3]  # step 4 raised in on_step_end, before its log


def test_registry_down_never_stops_training_and_the_spool_uploads_later(tmp_path, caplog):
    spool = tmp_path / "spool"
    # a database path inside a file: every open fails, as a missing mount would
    (tmp_path / "not-a-dir").write_text("x")
    bad_db = f"sqlite:///{tmp_path / 'not-a-dir' / 'reg.db'}"
    tokenizer = tiny_tokenizer()
    callback = RegistryCallback(db=bad_db, spool_dir=spool)
    trainer = transformers.Trainer(model=tiny_model(tokenizer), args=trainer_args(tmp_path),
                                   train_dataset=Sentences(tokenizer, 24), eval_dataset=Sentences(tokenizer, 8),
                                   callbacks=[callback])
    with caplog.at_level(logging.WARNING, logger="registry.integrations"):
        trainer.train()
    warnings = [r for r in caplog.records if r.name == "registry.integrations" and "unavailable" in r.getMessage()]
    assert len(warnings) == 1
    (spool_file,) = spool.glob("*.jsonl")
    records = [json.loads(line) for line in spool_file.read_text().splitlines()]
    assert records[0]["kind"] == "run" and records[-1] == {"kind": "status", "status": "finished"}

    good_db = f"sqlite:///{tmp_path / 'reg.db'}"
    from click.testing import CliRunner

    from registry.cli.main import cli

    for _ in range(2):  # a second upload adds nothing
        result = CliRunner().invoke(cli, ["--db", good_db, "follow", "--spool", str(spool_file)])
        assert result.exit_code == 0, result.output
    with open_registry(good_db) as reg:
        (run,) = reg.list_runs()[0]
        assert run["status"] == "finished"
        loss = reg.read_series(run["id"], "loss")
        assert list(loss.steps) == [h["step"] for h in trainer.state.log_history if "loss" in h]


def test_grpo_trainer_run_is_trl_with_its_config(tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    prompts = datasets.Dataset.from_dict({"prompt": ["1 + 2 =", "the cat", "a dog ran", "3 + 1 ="] * 2})

    def count_reward(completions, **kwargs):
        return [float(len(c.split())) for c in completions]

    config = trl.GRPOConfig(output_dir=str(tmp_path / "grpo"), run_name="tiny-grpo", max_steps=3,
                            per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
                            logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, beta=0.04,
                            disable_tqdm=True, seed=0)
    callback = RegistryCallback(project="math", db=db)
    # a local directory: with beta > 0 GRPOTrainer builds its reference model from the policy's path
    model_dir = tmp_path / "tiny-model"
    tiny_model(tokenizer).save_pretrained(model_dir)
    trainer = trl.GRPOTrainer(model=str(model_dir), reward_funcs=count_reward, args=config,
                              train_dataset=prompts, processing_class=tokenizer, callbacks=[callback])
    trainer.train()
    with open_registry(db) as reg:
        detail = reg.run_detail(callback.run.id)
        assert detail["framework"] == "trl" and detail["algorithm"] == "GRPO" and detail["status"] == "finished"
        assert detail["params"]["beta"] == pytest.approx(0.04) and detail["params"]["num_generations"] == 4
        assert detail["params"]["versions.trl"] == trl.__version__
        series = {s["key"]: s for s in detail["series"]}
        assert series["reward"]["definition"] is not None, "TRL's reward key binds to the dictionary"
        rewards = reg.read_series(callback.run.id, "reward")
        assert list(rewards.steps) == [h["step"] for h in trainer.state.log_history if "reward" in h]
