#!/usr/bin/env python3
"""Builds the tiny Llama-architecture model the real-vLLM tests and benchmarks serve.

Run with the vLLM venv's python (install.sh does, and caches the result):

    make_model.py [--size small|large] [--seed N] MODEL_DIR [--lora N LORA_DIR]

- MODEL_DIR gets a byte-level BPE tokenizer (vocab 8192, Llama-3-style special tokens, a Jinja
  chat template) trained with `tokenizers` on corpus.txt (next to this script, in the repository:
  nothing of the machine's), and a Llama config with random weights (fixed seed) in bf16
  safetensors. `small`: 2 layers, hidden 256, 4 heads, MLP 512 (5.5 M parameters); `large`: the
  "slower GPU", 4 layers, hidden 512, 8 heads, MLP 1536 (~21 M parameters). Both allow 4,096
  positions.
- `--lora N LORA_DIR` adds N random rank-8 peft adapters for that model, LORA_DIR/adapter-0 …
  adapter-(N-1), each with its own fixed seed.
- Every output is deterministic: the same bytes on every machine (install.sh's README records
  the digests; MODEL_DIR/SHA256SUMS lists them per build).
"""

import argparse
import hashlib
import os
import sys
from pathlib import Path

# One thread everywhere: the tokenizer trainer and torch's init do not depend on it, but a build
# beside running engines should not take both cores.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus.txt"

VOCAB_SIZE = 8192
MAX_POSITIONS = 4096
SIZES = {
    "small": dict(num_hidden_layers=2, hidden_size=256, num_attention_heads=4, intermediate_size=512),
    "large": dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, intermediate_size=1536),
}

BOS, EOS, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
START_HEADER, END_HEADER = "<|start_header_id|>", "<|end_header_id|>"
# Llama 3's named special tokens first (so their ids are 0..), then reserved ones up to 16.
SPECIAL_TOKENS = [BOS, EOS, "<|finetune_right_pad_id|>", START_HEADER, END_HEADER, "<|eom_id|>", EOT,
                  "<|python_tag|>"] + [f"<|reserved_special_token_{i}|>" for i in range(8)]

# Llama 3's chat format: a header per message, <|eot_id|> after each, the assistant header to
# prompt a reply. Content given as OpenAI content parts is joined from its text parts.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set content = message['content'] %}"
    "{%- else %}{%- set content = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') %}{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + content | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = CORPUS.read_text(encoding="utf-8").splitlines(keepends=True)
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    if tok.get_vocab_size() != VOCAB_SIZE:
        sys.exit(f"make_model.py: the corpus gave {tok.get_vocab_size()} tokens, not {VOCAB_SIZE}: it needs more text")
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOT,
        pad_token=EOS,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return tok


def build_model(out: Path, size: str, seed: int, tok):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        max_position_embeddings=MAX_POSITIONS,
        num_key_value_heads=SIZES[size]["num_attention_heads"],
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=[tok.token_to_id(EOS), tok.token_to_id(EOT)],
        pad_token_id=tok.token_to_id(EOS),
        torch_dtype="bfloat16",
        **SIZES[size],
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(str(out), safe_serialization=True)
    return model


def build_loras(base, n: int, out: Path, seed: int):
    import torch
    from peft import LoraConfig, get_peft_model

    for i in range(n):
        torch.manual_seed(seed + 1000 + i)
        config = LoraConfig(
            r=8,
            lora_alpha=16,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            # Random A and B (peft's default B = 0 would make every adapter the base model).
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        )
        # A fresh copy of the base each time: get_peft_model wraps the model in place.
        peft_model = get_peft_model(copy_model(base), config)
        adapter = out / f"adapter-{i}"
        peft_model.save_pretrained(str(adapter), safe_serialization=True)
        # The model card peft writes names library versions only; the config names the base by
        # a fixed name, not by this machine's path, and lists the target modules in order.
        (adapter / "README.md").unlink(missing_ok=True)
        fix_adapter_config(adapter / "adapter_config.json")


def copy_model(model):
    import copy

    return copy.deepcopy(model)


def fix_adapter_config(path: Path):
    import json

    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = "llmr-tiny"
    # peft keeps target_modules as a set: its order would follow Python's hash seed.
    config["target_modules"] = sorted(config["target_modules"])
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_sums(out: Path):
    lines = []
    for f in sorted(p for p in out.rglob("*") if p.is_file() and p.name != "SHA256SUMS"):
        lines.append(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(out)}\n")
    (out / "SHA256SUMS").write_text("".join(lines))
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--lora", nargs=2, metavar=("N", "LORA_DIR"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    args.model_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(args.model_dir)
    model = build_model(args.model_dir, args.size, args.seed, tok)
    params = sum(p.numel() for p in model.parameters())
    print(f"    {args.model_dir.name}: {args.size}, {params:,} parameters")
    for line in write_sums(args.model_dir):
        sys.stdout.write(f"    {args.model_dir.name}: {line}")
    if args.lora:
        n, lora_dir = int(args.lora[0]), Path(args.lora[1])
        lora_dir.mkdir(parents=True, exist_ok=True)
        build_loras(model, n, lora_dir, args.seed)
        for line in write_sums(lora_dir):
            sys.stdout.write(f"    {lora_dir.name}: {line}")


if __name__ == "__main__":
    main()
