"""Tiny random causal LMs (no network) for exactness tests: small vocabularies make exact enumeration and
chi-square tests cheap. Weights are scaled up so distributions are far from uniform and drafts disagree."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spec_engine.core import speed


def tiny_llama(vocab: int = 10, layers: int = 2, seed: int = 0, hidden: int = 32,
               scale: float = 4.0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    for p in model.parameters():
        p.requires_grad_(False)
    speed.use_from_env().adopt(model)      # as load_model does: the CPU speed layer's paths, unless SPEC_ENGINE_ACCEL=0
    return model


class ToyTokenizer:
    """A greedy longest-match tokenizer over a fixed list of pieces: enough of the tokenizer interface
    (`encode`, `decode`) for the cross-tokenizer drafter, with merges so boundaries can move."""

    def __init__(self, pieces: list[str]):
        self.pieces = pieces
        self.ids = {piece: i for i, piece in enumerate(pieces)}
        self.longest = max(len(p) for p in pieces)

    def __len__(self) -> int:
        return len(self.pieces)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for size in range(min(self.longest, len(text) - i), 0, -1):
                if text[i:i + size] in self.ids:
                    ids.append(self.ids[text[i:i + size]])
                    i += size
                    break
            else:
                raise ValueError(f"cannot encode {text[i]!r}")
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(self.pieces[int(i)] for i in ids)


# Target pieces merge "ab" and "cd"; the draft merges other pairs and orders its ids differently.
TARGET_PIECES = ["a", "b", "c", "d", "e", "f", "ab", "cd"]
DRAFT_PIECES = ["f", "e", "ba", "d", "c", "b", "a", "ef", "abc", "cd", "da", "fa"]


def greedy_identity_runs(target, make_drafter, prompt, ks=(1, 3, 8), tokens: int = 30):
    """Plain greedy decoding and, for each k, a speculative run with a fresh drafter: (plain, {k: result})."""
    import spec_engine as se
    greedy = se.SamplingParams(0.0)
    plain = se.autoregressive_generate(target, prompt, max_new_tokens=tokens, sampling=greedy)
    runs = {k: se.SpeculativeDecoder(target, make_drafter()).generate(prompt, k=k, max_new_tokens=tokens,
                                                                       sampling=greedy)
            for k in ks}
    return plain, runs
