"""Build the tiny random-weight Llama and its tokenizer, entirely locally.

The CPU engine serves this model so that the embedded default and the tests
exercise a real vLLM without any model hub. The tokenizer is a small BPE
trained on generated text; the weights are random. Nothing here downloads.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

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


def build_tokenizer(out_dir: Path, *, vocab_size: int = VOCAB_SIZE, seed: int = 7) -> Path:
    """Train a byte-level BPE on generated text and save it as a fast tokenizer.

    Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json,
    which is what transformers' AutoTokenizer (and so vLLM) loads.
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
            },
            indent=2,
        )
    )
    return out_dir
