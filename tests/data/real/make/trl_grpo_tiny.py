"""Produce a small GRPO run with TRL's own GRPOTrainer and transformers' TensorBoard callback.

Everything is built locally: a character-level tokenizer, a 2-layer Qwen2 model with random
weights, and an in-memory prompt dataset of one-digit additions. Nothing is downloaded.

Usage: python trl_grpo_tiny.py OUT_DIR [--beta 0.04] [--num-iterations 1] [--max-steps 20]
       [--learning-rate 1e-3] [--epsilon 0.2] [--save-steps 10] [--eval-steps 0] [--seed 0]
Writes OUT_DIR/runs/<time>_<host>/events.out.tfevents.* (TensorBoard callback),
OUT_DIR/checkpoint-*/trainer_state.json (Trainer checkpoints), OUT_DIR/config.json (GRPOConfig used)
and OUT_DIR/trainer_state_after_train.json (trainer.state saved after train() returned).
The random model is saved to OUT_DIR.model and loaded from there by path.
Run with HF_HUB_OFFLINE=1.
"""

import argparse
import json
import random
import sys

import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

import trl
from trl import GRPOConfig, GRPOTrainer

SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>"]
CHARS = list("0123456789+=? abcdefghijklmnopqrstuvwxyzW")


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # one token per character, so a random model emits digits often enough to score sometimes
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>"
    )


def build_model(tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return Qwen2ForCausalLM(config)


def build_dataset(n: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 4), rng.randint(0, 4)
        rows.append({"prompt": f"what is {a}+{b}? ", "answer": str(a + b)})
    return Dataset.from_list(rows)


def accuracy_reward(completions, answer, **kwargs):
    """1.0 when the expected sum appears in the completion."""
    return [1.0 if ans in c else 0.0 for c, ans in zip(completions, answer)]


def length_reward(completions, **kwargs):
    """Prefers completions of about 6 characters."""
    return [-abs(len(c) - 6) / 6.0 for c in completions]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--num-iterations", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--save-steps", type=int, default=10)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--epsilon", type=float, default=0.2)
    p.add_argument("--eval-steps", type=int, default=0, help="evaluate every N steps on 8 held-out prompts (0: no eval)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    torch.manual_seed(a.seed)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    # with beta > 0 the trainer loads its reference model from the policy's path, so the random
    # model is saved to a local directory and passed by path (no hub access)
    model_dir = f"{a.out_dir}.model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    dataset = build_dataset(64, a.seed)
    eval_dataset = build_dataset(8, a.seed + 1) if a.eval_steps else None

    args = GRPOConfig(
        output_dir=a.out_dir,
        report_to=["tensorboard"],
        logging_steps=1,
        max_steps=a.max_steps,
        save_strategy="steps",
        save_steps=a.save_steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=12,
        learning_rate=a.learning_rate,
        epsilon=a.epsilon,
        beta=a.beta,
        num_iterations=a.num_iterations,
        temperature=1.0,
        use_cpu=True,
        bf16=False,
        seed=a.seed,
        dataloader_num_workers=0,
        eval_strategy="steps" if a.eval_steps else "no",
        eval_steps=a.eval_steps or None,
        per_device_eval_batch_size=4,
    )
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=[accuracy_reward, length_reward],
        args=args,
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    # the end-of-training entry is appended to trainer.state after the last checkpoint was written
    trainer.state.save_to_json(f"{a.out_dir}/trainer_state_after_train.json")
    with open(f"{a.out_dir}/config.json", "w") as f:
        json.dump(json.loads(args.to_json_string()), f, indent=2, sort_keys=True)
    print("trl", trl.__version__, file=sys.stderr)


if __name__ == "__main__":
    main()
