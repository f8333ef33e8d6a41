"""A readable toy model pair for the classroom: a tiny Llama target and a different tiny Llama draft over a
ten-word vocabulary ("the cat sat on the mat ."), built from code in milliseconds, with no files or network.

Both are real `LlamaForCausalLM`s (attention, MLP, KV cache) whose weights are set so that the next-word
distribution is mostly a hand-written bigram table, nudged by the context through the attention and MLP
layers (seeded random weights, scaled down). The target has a few clear favourites after each word; the
draft's table prefers other words, so a speculative run rejects often enough for a wrong verification rule
to show its drift after a thousand or so samples. Both run in float64, so exact enumeration over the ten
words agrees with itself to rounding (1e-15), not to float32's 1e-7.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

WORDS = ("the", "a", "cat", "dog", "sat", "ran", "on", "mat", "and", ".")
DEFAULT_PROMPT = "the cat"
NAME = "toy-words"
HIDDEN = 16
CONTEXT_SCALE = 0.35     # how much attention and MLP may move the residual stream away from the bigram
FLOOR = 0.01             # probability weight of every word not listed in a row of a table

# Next-word weights after each word (normalised per row; unlisted words get FLOOR).
TARGET_BIGRAMS = {
    "the": {"cat": 0.45, "dog": 0.3, "mat": 0.2},
    "a": {"cat": 0.35, "dog": 0.45, "mat": 0.15},
    "cat": {"sat": 0.55, "ran": 0.25, "and": 0.1, ".": 0.05},
    "dog": {"ran": 0.5, "sat": 0.3, "and": 0.1, ".": 0.05},
    "sat": {"on": 0.75, "and": 0.1, ".": 0.1},
    "ran": {"on": 0.4, ".": 0.3, "and": 0.2},
    "on": {"the": 0.6, "a": 0.35},
    "mat": {".": 0.6, "and": 0.3},
    "and": {"the": 0.4, "a": 0.25, "ran": 0.15, "sat": 0.15},
    ".": {"the": 0.55, "a": 0.35},
}
# The draft is a plausible but different speaker: it likes dogs, running and "a".
DRAFT_BIGRAMS = {
    "the": {"dog": 0.55, "mat": 0.25, "cat": 0.15},
    "a": {"dog": 0.6, "mat": 0.2, "cat": 0.15},
    "cat": {"ran": 0.6, "sat": 0.2, ".": 0.15},
    "dog": {"ran": 0.7, "and": 0.2},
    "sat": {"on": 0.45, ".": 0.3, "and": 0.2},
    "ran": {"and": 0.45, "on": 0.3, ".": 0.2},
    "on": {"a": 0.65, "the": 0.3},
    "mat": {"and": 0.55, ".": 0.4},
    "and": {"a": 0.4, "ran": 0.3, "the": 0.2},
    ".": {"a": 0.6, "the": 0.3},
}


class WordTokenizer:
    """Whitespace-separated words over a fixed vocabulary: `encode`/`decode` like a Hugging Face tokenizer,
    and a readable error for a word outside the vocabulary."""

    eos_token_id = None
    all_special_ids: list[int] = []

    def __init__(self, words=WORDS):
        self.words = tuple(words)
        self.ids = {word: i for i, word in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        unknown = [w for w in text.split() if w not in self.ids]
        if unknown:
            raise ValueError(f"the toy vocabulary has no word {unknown[0]!r}; use only: {' '.join(self.words)}")
        return [self.ids[w] for w in text.split()]

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        return " ".join(self.words[int(i)] for i in ids)

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return self.words[int(token_id)]


def bigram_logits(table: dict[str, dict[str, float]], words=WORDS) -> torch.Tensor:
    """[vocab (previous word), vocab (next word)] log-probabilities of a bigram table (rows sum to 1)."""
    index = {w: i for i, w in enumerate(words)}
    weights = torch.full((len(words), len(words)), FLOOR, dtype=torch.float64)
    for prev, row in table.items():
        for nxt, weight in row.items():
            weights[index[prev], index[nxt]] = weight
    return torch.log(weights / weights.sum(dim=1, keepdim=True))


def word_llama(table: dict[str, dict[str, float]], layers: int, seed: int, words=WORDS) -> LlamaForCausalLM:
    """A float64 Llama whose next-word logits are the table's, plus a context-dependent nudge.

    Embeddings are one-hot in the first `vocab` hidden dimensions, so the final RMSNorm sees e_i scaled by
    sqrt(hidden) when the layers add nothing, and the LM head column i holds the table row of word i.
    """
    vocab = len(words)
    assert vocab <= HIDDEN, (vocab, HIDDEN)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, :vocab] = torch.eye(vocab, dtype=torch.float64)       # [vocab, hidden]
        model.lm_head.weight.normal_(0.0, 0.5)                                                     # [vocab, hidden]
        model.lm_head.weight[:, :vocab] = bigram_logits(table, words).T / math.sqrt(HIDDEN)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(CONTEXT_SCALE)
            layer.mlp.down_proj.weight.mul_(CONTEXT_SCALE)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@dataclass(frozen=True)
class ToyPair:
    """The lab's default models. `target` and `draft` are LoadedModel-like (`.model`, `.tokenizer`, `.name`)."""

    target: "ToyModel"
    draft: "ToyModel"

    def encode(self, text: str) -> torch.Tensor:
        """Prompt text -> ids [1, T]; ValueError names a word outside the vocabulary."""
        ids = self.target.tokenizer.encode(text)
        if not ids:
            raise ValueError(f"the toy prompt is empty: type a few of these words: {' '.join(WORDS)}")
        return torch.tensor([ids], dtype=torch.long)


@dataclass(frozen=True)
class ToyModel:
    name: str
    model: LlamaForCausalLM
    tokenizer: WordTokenizer

    @property
    def device(self) -> torch.device:
        return self.model.device


DESCRIPTION = (f"toy pair: target = Llama, 2 layers, hidden {HIDDEN}; draft = Llama, 1 layer, other weights; "
               f"vocabulary of {len(WORDS)} words ({' '.join(WORDS)}); float64, built in spec_engine/classroom/toy.py")


def toy_pair() -> ToyPair:
    """Build the two toy models (a few milliseconds; same weights every call)."""
    tokenizer = WordTokenizer()
    return ToyPair(ToyModel(f"{NAME}-target", word_llama(TARGET_BIGRAMS, layers=2, seed=0), tokenizer),
                   ToyModel(f"{NAME}-draft", word_llama(DRAFT_BIGRAMS, layers=1, seed=1), tokenizer))
