"""Helpers for tests of loading from the Hugging Face cache with no network: a repository written into a cache folder
in huggingface_hub's own layout, and a tiny random GPT-2 with a byte-level BPE tokenizer of its own (a model with
another tokenizer than SmolLM2's, like the `gpt2` preset, that needs no download)."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

FAKE_REVISION = "0123456789abcdef0123456789abcdef01234567"     # a commit sha's shape; no such commit exists


def fill_hub_cache(cache: Path, repo_id: str, source: Path, revision: str = FAKE_REVISION) -> Path:
    """Put the files of the model directory `source` into the hub cache `cache` as huggingface_hub keeps a download:
    models--<org>--<name>/blobs/<name of the content>, snapshots/<revision>/<file> a relative link to its blob, and
    refs/main holding the revision. Blobs are hard links to `source`'s files where the file system allows (the
    weights are hundreds of MB), else copies. Returns the snapshot folder."""
    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    snapshot, blobs = repo / "snapshots" / revision, repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir(exist_ok=True)
    for file in sorted(Path(source).iterdir()):
        if not file.is_file() or file.name == "spec_engine_cache.json":      # the engine's own marker: not a Hub file
            continue
        # The Hub names a blob by its content's hash; a name from the file's name and size keeps this cheap and is
        # just as opaque to huggingface_hub, which only follows the links.
        blob = blobs / hashlib.sha256(f"{file.name}:{file.stat().st_size}".encode()).hexdigest()
        try:
            os.link(file, blob)
        except OSError:
            shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return snapshot


TOKENIZER_TEXT = ("The capital of France is Paris. Madrid is the capital of Spain, and Rome the capital of Italy. "
                  "Write one sentence about the sea: the sea is wide, blue and deep. def f(x): return x * 2\n")


def tiny_gpt2(folder: Path, vocab: int = 400, seed: int = 0) -> Path:
    """A random 2-layer GPT-2 (GPT2LMHeadModel, the `gpt2` preset's architecture) and a byte-level BPE tokenizer
    trained on a few sentences (any text encodes: bytes are the base alphabet), saved with save_pretrained
    (safetensors) into `folder`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([TOKENIZER_TEXT] * 8, trainer)
    tokenizer = GPT2TokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                  unk_token="<|endoftext|>")
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=512, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)
