"""Build the tiny random-weight Llama and its tokenizer, entirely locally.

The CPU engine serves this model so that the embedded default and the tests
exercise a real vLLM without any model hub. The tokenizer is a small BPE
trained on generated text; the weights are random. Nothing here downloads.
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import sys
from pathlib import Path
from typing import Any

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]

_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "tu",
    "ra",
    "si",
    "po",
    "de",
    "fa",
    "gu",
    "hi",
    "jo",
    "be",
    "vu",
    "zy",
    "qua",
    "tri",
    "spo",
    "gle",
    "xen",
    "omb",
    "ild",
    "urt",
    "ash",
    "eph",
    "ion",
    "ent",
]


def _corpus(lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = []
        for _ in range(rng.randint(5, 30)):
            word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
            words.append(word)
        sentence = " ".join(words)
        out.append(sentence.capitalize() + rng.choice([".", "?", "!", ","]) + f" {rng.randint(0, 9999)}")
    return out


# A plain chat template (Jinja, as Hugging Face tokenizers carry it): BOS, then each message as
# "<|role|>" on its own line, its text and EOS, then the assistant's opener when asked. vLLM
# renders /v1/chat/completions with it, and tailtune counts chat prompts with the same one
# (apps/workloads/chat_template.py), both through transformers' apply_chat_template.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def build_tokenizer(out_dir: Path, *, vocab_size: int = VOCAB_SIZE, seed: int = 7) -> Path:
    """Train a byte-level BPE on generated text and save it as a fast tokenizer.

    Writes tokenizer.json, tokenizer_config.json (with the chat template) and
    special_tokens_map.json, which is what transformers' AutoTokenizer (and so vLLM) loads.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(4000, seed), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}, indent=2
        )
    )
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "add_bos_token": True,
                "add_eos_token": False,
                "model_max_length": 8192,
                "clean_up_tokenization_spaces": False,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    return out_dir


MODEL_REVISION = "tiny-llama-local-v1"
REVISION_FILE = "tailtune-revision.json"

# Shape of the tiny Llama: small enough to build in seconds and to serve on two
# CPU cores, long enough a context (8192) for the seed sweep's long class.
HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 256
NUM_LAYERS = 2
NUM_HEADS = 4
MAX_POSITION_EMBEDDINGS = 8192


def _bf16_bytes(values: Any) -> bytes:
    """Round float32 values to bfloat16 (round to nearest even) and return the raw bytes.

    numpy has no bfloat16 dtype; bfloat16 is the upper half of a float32, so
    rounding the lower half away is the whole conversion.
    """
    import numpy as np

    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return rounded.astype("<u2").tobytes()


def _write_safetensors(path: Path, tensors: dict[str, Any]) -> None:
    """Write bf16 tensors in the safetensors layout: 8-byte header length, JSON header, raw data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, values in tensors.items():
        blob = _bf16_bytes(values)
        header[name] = {
            "dtype": "BF16",
            "shape": list(values.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    # The format wants the data to start 8-byte aligned; pad the header with spaces.
    header_bytes += b" " * (-len(header_bytes) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(header_bytes)))
        fh.write(header_bytes)
        for blob in blobs:
            fh.write(blob)


def build_model(
    out_dir: Path,
    *,
    revision: str = MODEL_REVISION,
    tokenizer_revision: str | None = None,
    seed: int = 0,
) -> Path:
    """Build the tiny random-weight Llama (weights, config, tokenizer) into out_dir.

    1. Train the tokenizer (build_tokenizer) and read its special token ids.
    2. Write config.json and generation_config.json for LlamaForCausalLM.
    3. Write random bf16 weights (std 0.02, norms at 1) as model.safetensors.
    4. Write the revision file, which the engine checks the configured
       model/tokenizer revisions against.
    """
    import numpy as np
    from tokenizers import Tokenizer

    out_dir = Path(out_dir)
    build_tokenizer(out_dir)
    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    ids = {
        name: tok.token_to_id(token) for name, token in [("bos", "<s>"), ("eos", "</s>"), ("pad", "<pad>")]
    }
    head_dim = HIDDEN_SIZE // NUM_HEADS
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_HEADS,
        "head_dim": head_dim,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["pad"]}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")

    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> Any:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)

    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal(VOCAB_SIZE, HIDDEN_SIZE)}
    for layer in range(NUM_LAYERS):
        prefix = f"model.layers.{layer}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[f"{prefix}.self_attn.{proj}.weight"] = normal(HIDDEN_SIZE, HIDDEN_SIZE)
        tensors[f"{prefix}.mlp.gate_proj.weight"] = normal(INTERMEDIATE_SIZE, HIDDEN_SIZE)
        tensors[f"{prefix}.mlp.up_proj.weight"] = normal(INTERMEDIATE_SIZE, HIDDEN_SIZE)
        tensors[f"{prefix}.mlp.down_proj.weight"] = normal(HIDDEN_SIZE, INTERMEDIATE_SIZE)
        tensors[f"{prefix}.input_layernorm.weight"] = np.ones(HIDDEN_SIZE, dtype=np.float32)
        tensors[f"{prefix}.post_attention_layernorm.weight"] = np.ones(HIDDEN_SIZE, dtype=np.float32)
    tensors["model.norm.weight"] = np.ones(HIDDEN_SIZE, dtype=np.float32)
    tensors["lm_head.weight"] = normal(VOCAB_SIZE, HIDDEN_SIZE)
    _write_safetensors(out_dir / "model.safetensors", tensors)

    revision_record = {
        "model_revision": revision,
        "tokenizer_revision": tokenizer_revision or revision,
        "builder": "workers.engine.tinymodel",
        "seed": seed,
    }
    (out_dir / REVISION_FILE).write_text(json.dumps(revision_record, indent=2, sort_keys=True) + "\n")
    return out_dir


def read_revisions(model_dir: Path) -> dict[str, str] | None:
    """The revisions recorded in a model directory's revision file, or None if it has none."""
    path = Path(model_dir) / REVISION_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return {key: str(data[key]) for key in ("model_revision", "tokenizer_revision") if key in data}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the tiny local Llama the CPU engine serves.")
    parser.add_argument("--out", type=Path, required=True, help="model directory to (re)write")
    parser.add_argument("--revision", default=MODEL_REVISION, help="model revision to record")
    parser.add_argument("--tokenizer-revision", default=None, help="tokenizer revision (default: --revision)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed")
    args = parser.parse_args(argv)
    out = build_model(
        args.out, revision=args.revision, tokenizer_revision=args.tokenizer_revision, seed=args.seed
    )
    print(f"built {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
