"""Prompts of exact token length, built with the pinned tokenizer.

Pure: ``tokenizers`` and numpy only. A prompt is a list of token ids drawn at
random (from a seed) from the tokenizer's ordinary vocabulary, then settled
to a fixed point of decode -> encode: ``encode(decode(ids)) == ids``. So the
ids sent to the engine, and the text they stand for, both count exactly
``input_tokens`` with the model's own tokenizer; no character count anywhere.

Special tokens and BOS: ids exclude every added/special token, and counts are
taken with ``add_special_tokens=False``. The replay client sends the ids as
``prompt`` token lists, which vLLM uses verbatim (it adds BOS only when it
tokenizes text itself), so the engine prefills exactly ``input_tokens``. A
client that sent the decoded text instead would get one BOS more.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# Decode/encode rounds before giving up on one draw; random ids settle in 2-4
# rounds on byte-level BPE vocabularies, the cap only guards against a
# tokenizer that never settles.
_MAX_ROUNDS = 50
# Fresh draws tried when a prompt collides with an earlier one.
_MAX_REDRAWS = 100
# Enough word-initial tokens to draw distinct prompts from.
_MIN_WORD_POOL = 256
# Prompts checked per batched decode/encode call (parallel in the tokenizer).
_BATCH = 32


class PromptError(ValueError):
    """A prompt that cannot be built with this tokenizer."""


def canonical_json(value: object) -> str:
    """The one JSON spelling used for every hash in the trace format."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def corpus_sha256(prompts: Sequence[Sequence[int] | str]) -> str:
    """sha256 of the canonical JSON of the prompts (id lists or text) in index order."""
    normal = [p if isinstance(p, str) else [int(t) for t in p] for p in prompts]
    return hashlib.sha256(canonical_json(normal).encode("ascii")).hexdigest()


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from any JSON-able parts: the same on every machine.

    Python's ``hash`` is salted per process, so seeds are derived from a
    sha256 of the parts' canonical JSON instead.
    """
    digest = hashlib.sha256(canonical_json(["tailtune-seed-v1", *parts]).encode("ascii")).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class PromptTokenizer:
    """The pinned tokenizer (``tokenizer.json`` in the model directory)."""

    def __init__(self, tokenizer_dir: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(tokenizer_dir) / "tokenizer.json"
        if not path.is_file():
            raise PromptError(f"no tokenizer.json in {tokenizer_dir}")
        raw = path.read_bytes()
        # Pins the exact tokenizer: same file, same prompts, on any machine.
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self._tok = Tokenizer.from_str(raw.decode("utf-8"))
        added = set(self._tok.get_added_tokens_decoder())
        vocab = self._tok.get_vocab(with_added_tokens=False)
        candidates = sorted(i for i in vocab.values() if i not in added)
        # Only tokens that stand alone as text (decode then encode back to
        # themselves): lone UTF-8 byte fragments would decode to U+FFFD and
        # never settle.
        texts = self._tok.decode_batch([[i] for i in candidates], skip_special_tokens=False)
        again = self._tok.encode_batch(texts, add_special_tokens=False)
        keep = [(i, text) for i, text, enc in zip(candidates, texts, again, strict=True) if enc.ids == [i]]
        self.allowed = np.array([i for i, _ in keep], dtype=np.int64)
        if len(self.allowed) == 0:
            raise PromptError(f"tokenizer in {tokenizer_dir} has no ordinary tokens")
        # Draws come from word-initial tokens (" word") where the vocabulary
        # has enough of them: a pre-tokenizer splits their concatenation back
        # at every token, so random prompts are fixed points at the first
        # check instead of after several decode/encode rounds. Other
        # vocabularies (no leading-space tokens) draw from every allowed token.
        words = [i for i, text in keep if len(text) > 1 and text[0] == " " and not text[1].isspace()]
        self.pool = np.array(words, dtype=np.int64) if len(words) >= _MIN_WORD_POOL else self.allowed

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def decode_many(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return self._tok.decode_batch([list(ids) for ids in batch], skip_special_tokens=False)

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(enc.ids) for enc in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def _draw(self, rng: np.random.Generator, n: int) -> list[int]:
        if n <= 0:
            return []
        return [int(i) for i in rng.choice(self.pool, size=n)]

    def settle(self, *, n: int, rng: np.random.Generator, prefix: Sequence[int] = ()) -> list[int]:
        """Ids of length ``n`` starting with ``prefix`` that decode/encode to themselves.

        Steps: 1. draw the missing tail at random; 2. decode and re-encode;
        3. if the result is unchanged, done; 4. if the re-encoding crossed
        into the prefix, redraw the tail; otherwise keep the re-encoded tail
        cut or topped up to length (a new last token if that changed
        nothing) and go to 2.
        """
        prefix = list(prefix)
        need = n - len(prefix)
        if need < 0:
            raise PromptError(f"prefix of {len(prefix)} tokens is longer than the prompt ({n})")
        tail = self._draw(rng, need)
        last: list[int] = []
        for _ in range(_MAX_ROUNDS):
            ids = prefix + tail
            again = self.encode(self.decode(ids))
            if again == ids:
                return ids
            if again[: len(prefix)] != prefix:
                tail = self._draw(rng, need)
                continue
            rest = again[len(prefix) :]
            last, tail = tail, rest[:need] + self._draw(rng, need - len(rest))
            if tail == last:
                # Cutting the re-encoding split a character; a new last token
                # moves the cut.
                tail = tail[:-1] + self._draw(rng, 1)
        raise PromptError(f"could not settle a {n}-token prompt with this tokenizer in {_MAX_ROUNDS} rounds")


def build_prompts(
    *,
    tokenizer: PromptTokenizer,
    requests: Sequence[tuple[str, int, int]],
    seed: int,
) -> list[list[int]]:
    """One prompt per request, given as (class name, input_tokens, shared_prefix_tokens).

    Prompts are distinct across the trace (a collision is redrawn), except
    that all requests of a class with ``shared_prefix_tokens = N > 0`` start
    with the same N tokens: the class's shared prefix. Request i draws from
    its own stream (seed, i), so its prompt does not depend on the others'.
    """
    prefixes: dict[str, list[int]] = {}
    plans: list[tuple[int, list[int], np.random.Generator, bool]] = []
    for index, (klass, n, shared) in enumerate(requests):
        if n <= 0:
            raise PromptError(f"request {index}: input_tokens must be positive, got {n}")
        if shared > n:
            raise PromptError(f"request {index}: shared_prefix_tokens {shared} exceeds input_tokens {n}")
        prefix: list[int] = []
        if shared > 0:
            key = f"{klass}:{shared}"
            if key not in prefixes:
                prng = np.random.default_rng(stable_seed(seed, "prefix", klass, shared))
                prefixes[key] = tokenizer.settle(n=shared, rng=prng)
            prefix = prefixes[key]
        # A whole-prefix prompt is the one case that is shared on purpose.
        plans.append((n, prefix, np.random.default_rng(stable_seed(seed, "prompt", index)), shared == n))
    seen: set[tuple[int, ...]] = set()
    out: list[list[int]] = []
    for start in range(0, len(plans), _BATCH):
        chunk = plans[start : start + _BATCH]
        # First draws are checked in one batched call; the rare draw that is
        # not a fixed point continues in settle() with its own stream.
        drafts = [prefix + tokenizer._draw(rng, n - len(prefix)) for n, prefix, rng, _ in chunk]
        checked = tokenizer.encode_many(tokenizer.decode_many(drafts))
        for offset, ((n, prefix, rng, shared_whole), draft, again) in enumerate(
            zip(chunk, drafts, checked, strict=True)
        ):
            ids = draft if again == draft else tokenizer.settle(n=n, rng=rng, prefix=prefix)
            for _ in range(_MAX_REDRAWS):
                if shared_whole or tuple(ids) not in seen:
                    break
                ids = tokenizer.settle(n=n, rng=rng, prefix=prefix)
            else:
                raise PromptError(
                    f"request {start + offset}: no distinct {n}-token prompt left in this vocabulary"
                )
            seen.add(tuple(ids))
            out.append(ids)
    return out
