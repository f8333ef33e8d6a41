"""Train the EAGLE draft head for the offline default (SmolLM2-135M-Instruct), reproducibly, on one CPU core.

    python -m bench.train_eagle generate --out /tmp/eagle    # the target's own responses + final hidden states
    python -m bench.train_eagle train --data /tmp/eagle      # fit the head, write spec_engine/drafters/weights/ + JSON
    python -m bench.train_eagle evaluate                     # held-out acceptance with the real engine
    python -m bench.train_eagle extract --out /tmp/eagle-corpus  # optional: teacher-forced features of local text
    # prompts the target writes itself:
    python -m bench.train_eagle generate --out /tmp/eagle-self --self-prompts 850 --seed 4000
    python -m bench.train_eagle relayer --data /tmp/eagle --out /tmp/eagle-ml --layers 2 15 27 -1  # EAGLE-3 features

Prompts come from bench/data/eagle_prompts.json (bench/eagle_prompts.py; held-out topics never appear in training).
`generate` answers every training prompt with the target itself (left-padded batched `generate`, 3 of 4 greedy,
1 of 4 sampled at T=0.7 / top-p 0.9), then runs one clean forward over prompt + response and keeps the final
hidden states (post-norm: what the LM head reads) in fp16 shards. With `--self-prompts N` the prompts are N user
messages the target writes itself (Magpie), minus any that mention a held-out topic or a benchmark prompt's
subject. `--layers` (on generate, extract, relayer and train) keeps the states of lower layers beside the final
ones, side by side, for a head that fuses them (EAGLE-3); `relayer` recomputes them for shards written without.
Transformers' `generate` samples from the global RNG, so that step seeds it; everything else uses explicit
generators.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.eagle_prompts import PATH as PROMPTS, excluded_phrases

DEFAULT_OUT = Path(__file__).parent.parent / "spec_engine" / "drafters" / "weights" / "eagle-smollm2-135m.safetensors"


def eagle_loss(head, tokens: torch.Tensor, features: torch.Tensor, mask: torch.Tensor, embed: torch.Tensor,
               rows: torch.Tensor, noise: float = 0.0, generator: torch.Generator | None = None,
               distill_weight: float = 0.5, unroll: int = 1,
               loss_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Teacher-forced training loss on right-padded sequences, plus optional unrolled steps.

    tokens [B, L] ids, features [B, L, F] the target's hidden states of the head's feature_layers (the final,
    post-norm ones last: F = len(feature_layers) * H), mask [B, L] 1 on real positions,
    embed [vocab, H] the target's input embedding, rows [N, H] the reduced LM-head rows; loss_mask [B, L] (default
    `mask`) marks the positions whose feature is a training target (e.g. only those that predict response tokens).
    Step 1 feeds pairs (f_t + noise, e(x_{t+1})) and predicts f_{t+1}; step s > 1 feeds the previous step's own
    (detached) predictions instead, as drafting does past the first token. Loss per step: smooth L1 to the true
    final feature + distill_weight * cross-entropy of the head's reduced logits to the target's (softmax of rows @ f).
    Noise goes on the final states only: they are what the head's own predictions stand in for.
    """
    batch, length, hidden = *features.shape[:2], head.config.hidden_size
    features = features.float()
    inputs = features[:, :-1]                                                          # [B, L - 1, F]
    if noise:
        inputs = inputs.clone()
        inputs[..., -hidden:] += (torch.rand(inputs[..., -hidden:].shape, generator=generator) * 2 - 1) * noise
    final = features[..., -hidden:]                                                    # [B, L, H]
    losses, stats = [], {}
    for step in range(1, unroll + 1):
        n = length - step
        if n <= 0:
            break
        next_embeds = embed[tokens[:, step:]]                                          # [B, n, H]
        target = final[:, step:]                                                       # [B, n, H]
        valid = ((mask if loss_mask is None else loss_mask)[:, step:] * mask[:, :n]).float()   # [B, n]
        position_ids = torch.arange(n)[None].expand(batch, n)
        predicted = head(inputs[:, :n], next_embeds, position_ids, attention_mask=mask[:, :n].long())   # [B, n, H]
        weight = valid / valid.sum().clamp(min=1.0)
        feature_loss = (F.smooth_l1_loss(predicted, target, reduction="none").mean(-1) * weight).sum()
        with torch.no_grad():
            teacher_logits = target @ rows.T                                           # [B, n, N]
        student_logits = predicted @ rows.T                                            # [B, n, N]
        teacher = torch.softmax(teacher_logits, dim=-1)
        distill_loss = (-(teacher * torch.log_softmax(student_logits, dim=-1)).sum(-1) * weight).sum()
        losses.append(feature_loss + distill_weight * distill_loss)
        with torch.no_grad():
            agree = (student_logits.argmax(-1) == teacher_logits.argmax(-1)).float()
            stats[f"step{step}"] = {"feature": float(feature_loss), "distill": float(distill_loss),
                                    "top1": float((agree * weight).sum())}
        inputs = predicted.detach()
    return torch.stack(losses).mean(), stats


def encode_chat(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@torch.inference_mode()
def respond(model, tokenizer, prompts: list[list[int]], new_tokens: int, sampled: bool, seed: int) -> list[list[int]]:
    """The target's responses (up to and including the first EOS) to a batch of prompts, left-padded."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])                  # [B, width]
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])             # [B, width]
    torch.manual_seed(seed)
    extra = {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 0} if sampled else {"do_sample": False}
    out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=new_tokens, pad_token_id=pad, **extra)
    responses = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t == tokenizer.eos_token_id), len(row))
        responses.append(row[:cut])
    return responses


@torch.inference_mode()
def layer_features(model, sequences: list[list[int]], layers: tuple[int, ...] = (-1,)) -> list[torch.Tensor]:
    """One right-padded forward; each sequence's hidden states [len, len(layers) * hidden] in fp16: those of
    `layers` (indices into transformers' hidden_states, -1 = post-norm final, what the LM head reads), side by side."""
    width = max(len(s) for s in sequences)
    input_ids = torch.tensor([s + [0] * (width - len(s)) for s in sequences])                  # [B, width]
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])           # [B, width]
    states = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=1).hidden_states
    hidden = torch.cat([states[layer] for layer in layers], dim=-1)                            # [B, width, F]
    return [hidden[i, :len(s)].to(torch.float16).clone() for i, s in enumerate(sequences)]


def pending_shards(out: Path, items: list, batch: int, digits: int):
    """(offset, shard path, batch of items) for every shard not written yet, so a stopped run resumes."""
    for b in range(0, len(items), batch):
        shard = out / f"shard{b // batch:0{digits}d}.pt"
        if not shard.exists():
            yield b, shard, items[b:b + batch]


def query_prefix(tokenizer) -> list[int]:
    """The chat template up to where a user's message begins (system turn included)."""
    marker = "\u2063QUERY\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], add_generation_prompt=False,
                                         tokenize=False)
    return tokenizer(text.split(marker)[0], add_special_tokens=False)["input_ids"]


def query_key(text: str) -> str:
    """What makes two prompts the same: their words, lower-cased."""
    return " ".join(text.lower().split())


def keep_query(text: str, ended: bool, n_tokens: int, excluded: list[str], seen: set[str], min_tokens: int = 6) -> bool:
    """A self-written prompt is kept when the target closed its turn, it is long enough, new, and it mentions no
    held-out or benchmark topic."""
    key = query_key(text)
    return ended and n_tokens >= min_tokens and key not in seen and not any(e in key for e in excluded)


@torch.inference_mode()
def self_prompts(model, tokenizer, n: int, seed: int, batch: int = 64, max_tokens: int = 64,
                 also_excluded: tuple[str, ...] = ()) -> list[str]:
    """n user messages written by the target itself (Magpie, Xu et al. 2024): sample from the chat template cut
    just before the user's text, at T=1 / top-p 0.95, and keep the turns `keep_query` accepts. Broader than the
    template prompts, and from the target's own idea of what users ask. `also_excluded`: more lower-case stems to
    drop (`generate --exclude`), beside the held-out topics and `EXCLUDED_STEMS`."""
    excluded, seen, queries = excluded_phrases() + [e.lower() for e in also_excluded], set(), []
    prefix = torch.tensor([query_prefix(tokenizer)] * batch)                                   # [B, P]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stops = {tokenizer.eos_token_id, im_end}
    round_ = 0
    while len(queries) < n:
        torch.manual_seed(seed + round_)
        out = model.generate(input_ids=prefix, attention_mask=torch.ones_like(prefix), max_new_tokens=max_tokens,
                             do_sample=True, temperature=1.0, top_p=0.95, top_k=0, pad_token_id=im_end)
        for row in out[:, prefix.shape[1]:].tolist():
            cut = next((i for i, t in enumerate(row) if t in stops), None)
            text = tokenizer.decode(row[:cut] if cut is not None else row).strip()
            if keep_query(text, cut is not None, cut or len(row), excluded, seen):
                seen.add(query_key(text))
                queries.append(text)
        round_ += 1
        print(f"self-prompts: {len(queries)}/{n} after {round_ * batch} samples", flush=True)
    return queries[:n]


def cmd_generate(args) -> None:
    from spec_engine.models import load_model
    torch.set_num_threads(args.threads)
    target = load_model(args.model, dtype="float32")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.self_prompts:            # written once, then reused: a stopped run resumes on the same prompts
        written = out / "prompts.json"
        if not written.exists():
            texts = self_prompts(target.model, target.tokenizer, args.self_prompts, args.seed,
                                 also_excluded=tuple(args.exclude))
            written.write_text(json.dumps([{"kind": "self", "text": t} for t in texts], indent=0) + "\n")
        prompts = json.loads(written.read_text())[:args.limit]
    else:
        prompts = json.loads(PROMPTS.read_text())["train"][:args.limit]
    encoded = [encode_chat(target.tokenizer, p["text"]) for p in prompts]
    start = time.perf_counter()
    for b, shard, batch in pending_shards(out, encoded, args.batch, digits=3):
        sampled = args.all_sampled or (b // args.batch) % 4 == 3
        responses = respond(target.model, target.tokenizer, batch, args.new_tokens, sampled, seed=args.seed + b)
        sequences = [p + r for p, r in zip(batch, responses)]
        features = layer_features(target.model, sequences, tuple(args.layers))
        torch.save({"tokens": sequences, "prompt_lens": [len(p) for p in batch], "features": features,
                    "sampled": sampled, "feature_layers": list(args.layers)}, shard)
        print(f"shard {shard.name}: {len(batch)} prompts, {sum(map(len, responses))} response tokens, "
              f"{time.perf_counter() - start:.0f} s", flush=True)


def corpus_files(limit_bytes: int = 400_000) -> dict[str, list[Path]]:
    """Text already on this machine, in a fixed order: the Python standard library's modules (code) and the
    Markdown / reStructuredText documentation of the installed packages (prose). Licences and changelogs skipped."""
    import sysconfig
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code = sorted(p for p in stdlib.glob("*.py") if 2_000 < p.stat().st_size < limit_bytes)
    site = Path(sysconfig.get_paths()["purelib"])
    skip = ("licen", "changelog", "changes", "history", "authors", "notice", "copying")
    prose = sorted(p for ext in ("*.md", "*.rst") for p in site.rglob(ext)
                   if 2_000 < p.stat().st_size < limit_bytes and not any(w in p.name.lower() for w in skip))
    return {"code": code, "prose": prose}


def cmd_extract(args) -> None:
    """Teacher-forced training pairs from local text (EAGLE trains on fixed text, not only the target's own
    answers): chunks of --length tokens, the target's final hidden states for each, in shards like `generate`'s
    (prompt_len 1: every position is a training target). --max-tokens per kind, chunks drawn in a seeded order."""
    import random
    from spec_engine.models import load_model
    torch.set_num_threads(args.threads)
    target = load_model(args.model, dtype="float32")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chunks: list[list[int]] = []
    for kind, files in corpus_files().items():
        pieces = []
        for path in files:
            ids = target.tokenizer(path.read_text(errors="ignore"), add_special_tokens=False)["input_ids"]
            pieces += [ids[i:i + args.length] for i in range(0, len(ids) - args.length + 1, args.length)]
        random.Random(args.seed).shuffle(pieces)
        take = pieces[:args.max_tokens // args.length]
        print(f"{kind}: {len(files)} files, {len(pieces)} chunks of {args.length} tokens, using {len(take)}",
              flush=True)
        chunks += take
    random.Random(args.seed + 1).shuffle(chunks)
    start = time.perf_counter()
    for b, shard, batch in pending_shards(out, chunks, args.batch, digits=4):
        torch.save({"tokens": batch, "prompt_lens": [1] * len(batch),
                    "features": layer_features(target.model, batch, tuple(args.layers)), "sampled": False,
                    "corpus": True, "feature_layers": list(args.layers)}, shard)
        if (b // args.batch) % 10 == 0:
            print(f"{shard.name}: {b + len(batch)}/{len(chunks)} chunks, {time.perf_counter() - start:.0f} s",
                  flush=True)


def cmd_relayer(args) -> None:
    """Recompute the features of existing shards (`generate` or `extract` output) with --layers: same tokens, one
    forward per --batch sequences; a stopped run resumes."""
    from spec_engine.models import load_model
    torch.set_num_threads(args.threads)
    target = load_model(args.model, dtype="float32")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for shard in sorted(Path(args.data).glob("shard*.pt")):
        if (out / shard.name).exists():
            continue
        blob = torch.load(shard)
        sequences = blob["tokens"]
        blob["features"] = [f for b in range(0, len(sequences), args.batch)
                            for f in layer_features(target.model, sequences[b:b + args.batch], tuple(args.layers))]
        blob["feature_layers"] = list(args.layers)
        torch.save(blob, out / shard.name)
        print(f"{shard.name}: {len(sequences)} sequences, {time.perf_counter() - start:.0f} s", flush=True)


def load_shards(data: Path) -> list[dict]:
    """[{tokens, prompt_len, features [len, F] fp16, feature_layers}] from every shard, in shard order."""
    samples = []
    for shard in sorted(Path(data).glob("shard*.pt")):
        blob = torch.load(shard)
        layers = tuple(blob.get("feature_layers", (-1,)))
        samples += [{"tokens": t, "prompt_len": n, "features": f, "feature_layers": layers}
                    for t, n, f in zip(blob["tokens"], blob["prompt_lens"], blob["features"])]
    return samples


def data_hash(samples: list[dict]) -> str:
    return hashlib.sha256(json.dumps([s["tokens"] for s in samples]).encode()).hexdigest()


def choose_vocab(samples: list[dict], size: int, always: list[int], vocab_total: int) -> torch.Tensor:
    """`always` (EOS and friends), then the most frequent ids of the training text (ties by id), then unseen ids
    in id order, `size` in all."""
    counts = torch.zeros(max(max(s["tokens"]) for s in samples) + 1, dtype=torch.long)
    for s in samples:
        counts += torch.bincount(torch.tensor(s["tokens"]), minlength=counts.numel())
    order = sorted(range(counts.numel()), key=lambda i: (-int(counts[i]), i))
    seen = [i for i in order if counts[i] > 0 and i not in always]
    # Past the ids seen in the data, fill by id: BPE ids follow merge order, a proxy for corpus frequency.
    unseen = [i for i in range(vocab_total) if i not in set(always) and (i >= counts.numel() or counts[i] == 0)]
    return torch.tensor(sorted((always + seen + unseen)[:size]))


def coverage(samples: list[dict], vocab_index: torch.Tensor) -> float:
    """Share of response tokens inside the reduced vocabulary."""
    member = set(vocab_index.tolist())
    response = [t for s in samples for t in s["tokens"][s["prompt_len"]:]]
    return sum(t in member for t in response) / max(len(response), 1)


def batches(samples: list[dict], batch: int, generator: torch.Generator):
    """Right-padded (tokens [B, L], features [B, L, H], mask [B, L]) in a seeded random order."""
    order = torch.randperm(len(samples), generator=generator).tolist()
    for b in range(0, len(order) - batch + 1, batch):
        chunk = [samples[i] for i in order[b:b + batch]]
        width = max(len(s["tokens"]) for s in chunk)
        hidden = chunk[0]["features"].shape[-1]
        tokens = torch.zeros(len(chunk), width, dtype=torch.long)
        features = torch.zeros(len(chunk), width, hidden)
        mask = torch.zeros(len(chunk), width)
        loss_mask = torch.zeros(len(chunk), width)
        for i, s in enumerate(chunk):
            n = len(s["tokens"])
            tokens[i, :n] = torch.tensor(s["tokens"])
            features[i, :n] = s["features"].float()
            mask[i, :n] = 1
            loss_mask[i, s["prompt_len"] - 1:n] = 1          # features that predict response tokens
        yield tokens, features, mask, loss_mask


def cmd_train(args) -> None:
    from spec_engine.drafters.eagle import EagleHead, head_config
    from spec_engine.models import load_model
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)          # module initialisation only; data order and noise use explicit generators
    target = load_model(args.model, dtype="float32")
    samples = load_shards(Path(args.data))
    generator = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(len(samples), generator=generator).tolist()
    n_val = max(1, len(samples) // 20)
    # Validation: the same 5% of the target's own answers whatever --extra-data adds (extra data only trains).
    val, train = [samples[i] for i in order[:n_val]], [samples[i] for i in order[n_val:]]
    answers = list(train)
    for extra in args.extra_data:
        train += load_shards(Path(extra))
    samples = answers + val + train[len(answers):]
    tok = target.tokenizer
    always = sorted({tok.eos_token_id, *[tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")]})
    # The reduced vocabulary only indexes the target's own LM-head rows (the head has no output weights of its
    # own), so --revocab may re-choose it for a trained head: from every training answer, corpus chunks excluded.
    vocab_source = [s for s in train if s["prompt_len"] > 1] if args.revocab else answers
    layers = tuple(args.layers)
    if args.init:          # continue from a trained head (and keep its vocabulary unless --revocab)
        from spec_engine.drafters.eagle import load_head
        head, vocab_index = load_head(Path(args.init), dtype=torch.float32)
        if head.feature_layers != layers:        # e.g. a single-layer head learning to read lower layers too
            head = widen_head(head, layers)
        head.train().requires_grad_(True)
        if args.revocab:
            vocab_index = choose_vocab(vocab_source, len(vocab_index), always, target.model.config.vocab_size)
    else:
        vocab_index = choose_vocab(vocab_source, args.vocab, always, target.model.config.vocab_size)
        head = EagleHead(head_config(target.model.config, args.intermediate, layers))
        with torch.no_grad():
            head.body.norm.weight.copy_(target.model.model.norm.weight)
    stale = sorted({str(s["feature_layers"]) for s in samples if s["feature_layers"] != layers})
    if stale:
        raise SystemExit(f"the data holds features of layers {', '.join(stale)}, the head reads {layers}: "
                         f"recompute them with `relayer --layers {' '.join(map(str, layers))}`")
    embed = target.model.get_input_embeddings().weight.detach()
    rows = embed[vocab_index] if target.model.config.tie_word_embeddings else \
        target.model.get_output_embeddings().weight.detach()[vocab_index]
    params = [p for n, p in head.named_parameters() if not n.startswith("body.embed_tokens")]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    steps_per_epoch = (len(train) // args.batch)
    total = steps_per_epoch * args.epochs
    schedule = lambda s: min(1.0, (s + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    print(f"{len(train)} train / {len(val)} val sequences, {sum(len(s['tokens']) for s in train)} train positions, "
          f"vocab {len(vocab_index)} covers {coverage(train, vocab_index):.3f} (train) "
          f"{coverage(val, vocab_index):.3f} (val) of response tokens; {total} steps", flush=True)
    start, step, history = time.perf_counter(), 0, []
    for epoch in range(args.epochs):
        head.train()
        for tokens, features, mask, loss_mask in batches(train, args.batch, generator):
            loss, stats = eagle_loss(head, tokens, features, mask, embed, rows, args.noise, generator,
                                     args.distill_weight, args.unroll, loss_mask)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            if step % 10 == 0:
                print(f"step {step}/{total} epoch {epoch} loss {float(loss):.3f} {json.dumps(stats)} "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
        val_stats = evaluate_loss(head, val, embed, rows, args)
        history.append({"epoch": epoch, "val": val_stats, "seconds": round(time.perf_counter() - start)})
        print(f"epoch {epoch} val {json.dumps(val_stats)}", flush=True)
        save(head, vocab_index, samples, train, val, history, start, args)     # every epoch: a stopped run still ships
        if args.stop_after and epoch + 1 >= args.stop_after:
            break           # the schedule still spans --epochs: the shipped head stopped early for time


def widen_head(head, layers: tuple[int, ...]):
    """The same head reading `layers`: its trained weights, plus a fusion layer that starts by passing the final
    states through (so it begins exactly where the trained head is)."""
    from spec_engine.drafters.eagle import EagleHead
    config = head.config.__class__(**head.config.to_dict())
    config.eagle_feature_layers = list(layers)
    wide = EagleHead(config)
    missing, unexpected = wide.load_state_dict(head.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("fuse") for k in missing), (missing, unexpected)
    return wide


def save(head, vocab_index, samples, train, val, history, start, args) -> None:
    from spec_engine.drafters.eagle import save_head
    record = {"target": args.model, "command": "python -m bench.train_eagle " + " ".join(args.argv),
              "prompts_sha256": hashlib.sha256(PROMPTS.read_bytes()).hexdigest(), "data_sha256": data_hash(samples),
              "train_sequences": len(train), "val_sequences": len(val),
              "train_positions": sum(len(s["tokens"]) for s in train), "vocab": len(vocab_index),
              "feature_layers": list(head.feature_layers),
              "vocab_coverage_val": round(coverage(val, vocab_index), 4),
              "train_seconds": round(time.perf_counter() - start),
              "epochs_done": len(history), "history": history}
    if args.init:          # the chain of commands that reproduces these weights
        previous = json.loads(Path(args.init).with_suffix(".json").read_text())
        record["init"] = {k: previous.get(k) for k in ("command", "sha256", "data_sha256", "train_positions", "init")}
    record = save_head(head, vocab_index, Path(args.out), record)
    print(json.dumps({k: v for k, v in record.items() if k != "history"}, indent=1))


@torch.no_grad()
def evaluate_loss(head, samples, embed, rows, args) -> dict:
    head.eval()
    totals: dict = {}
    generator = torch.Generator().manual_seed(0)
    chunks = list(batches(samples, min(args.batch, len(samples)), generator))
    for tokens, features, mask, loss_mask in chunks:
        _, stats = eagle_loss(head, tokens, features, mask, embed, rows, 0.0, None, args.distill_weight,
                              max(args.unroll, 3), loss_mask)
        for step, values in stats.items():
            for key, value in values.items():
                totals.setdefault(step, {}).setdefault(key, 0.0)
                totals[step][key] += value / len(chunks)
    return {step: {k: round(v, 4) for k, v in values.items()} for step, values in totals.items()}


def cmd_evaluate(args) -> None:
    """Held-out acceptance: the real engine, greedy, on held-out prompts (topics never seen in training)."""
    import spec_engine as se
    from spec_engine.drafters.eagle import load_eagle_drafter
    torch.set_num_threads(args.threads)
    target = se.load_model(args.model, dtype="float32")
    prompts = json.loads(PROMPTS.read_text())["held_out"][:args.limit]
    results = {}
    for params in (se.SamplingParams(0.0), se.SamplingParams(0.7, top_p=0.9)):
        accepted = drafted = emitted = rounds = 0
        for i, p in enumerate(prompts):
            decoder = se.SpeculativeDecoder(target.model, load_eagle_drafter(target.model, Path(args.weights)))
            r = decoder.generate(target.encode_prompt(p["text"]), k=args.k, max_new_tokens=args.tokens, sampling=params,
                                 seed=i, eos_token_id=target.tokenizer.eos_token_id)
            accepted += r.stats.accepted
            drafted += r.stats.drafted
            emitted += r.stats.new_tokens
            rounds += r.stats.rounds
        key = "greedy" if params.greedy else "T0.7-p0.9"
        results[key] = {"acceptance": round(accepted / max(drafted, 1), 4),
                        "tokens_per_forward": round(emitted / rounds, 3), "prompts": len(prompts), "k": args.k,
                        "tokens": args.tokens}
        print(key, results[key], flush=True)
    record_path = Path(args.weights).with_suffix(".json")
    record = json.loads(record_path.read_text())
    record["held_out"] = results
    record["held_out_command"] = "python -m bench.train_eagle " + " ".join(args.argv)
    record_path.write_text(json.dumps(record, indent=1) + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.train_eagle", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--model", default="smollm2-135m-instruct")
    g.add_argument("--out", required=True)
    g.add_argument("--batch", type=int, default=32)
    g.add_argument("--new-tokens", type=int, default=96)
    g.add_argument("--limit", type=int, default=None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--threads", type=int, default=1)
    g.add_argument("--all-sampled", action="store_true",
                   help="sample every answer at T=0.7 / top-p 0.9 (a second pass with another --seed adds new answers)")
    g.add_argument("--layers", type=int, nargs="+", default=[-1], help="hidden_states kept as features (end with -1)")
    g.add_argument("--self-prompts", type=int, default=0, metavar="N",
                   help="answer N prompts the target writes itself (kept in OUT/prompts.json) instead of the "
                        "template set")
    g.add_argument("--exclude", nargs="+", default=[], metavar="STEM",
                   help="with --self-prompts: also drop self-written prompts that contain one of these (lower case)")
    t = sub.add_parser("train")
    t.add_argument("--model", default="smollm2-135m-instruct")
    t.add_argument("--data", required=True, help="shards of `generate` (the target's answers; 5%% held for validation)")
    t.add_argument("--extra-data", nargs="*", default=[], help="more shards for training only (e.g. `extract`)")
    t.add_argument("--stop-after", type=int, default=None, help="stop after this many epochs (schedule unchanged)")
    t.add_argument("--init", default=None, help="continue from these head weights (their vocabulary is kept)")
    t.add_argument("--revocab", action="store_true",
                   help="choose the reduced vocabulary from all training answers (default: --data's), also with --init")
    t.add_argument("--out", default=str(DEFAULT_OUT))
    t.add_argument("--vocab", type=int, default=8192)
    t.add_argument("--layers", type=int, nargs="+", default=[-1],
                   help="target hidden states the head reads (EAGLE-3: e.g. 2 15 27 -1); the data must hold them")
    t.add_argument("--intermediate", type=int, default=None, help="head MLP width (default: the target's)")
    t.add_argument("--epochs", type=int, default=12)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=20)
    t.add_argument("--noise", type=float, default=0.2, help="uniform noise on input features (EAGLE)")
    t.add_argument("--distill-weight", type=float, default=0.5)
    t.add_argument("--unroll", type=int, default=3, help="steps trained on the head's own predictions (1 = EAGLE-1)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=1)
    x = sub.add_parser("extract")
    x.add_argument("--model", default="smollm2-135m-instruct")
    x.add_argument("--out", required=True)
    x.add_argument("--length", type=int, default=256)
    x.add_argument("--layers", type=int, nargs="+", default=[-1], help="hidden_states kept as features (end with -1)")
    x.add_argument("--max-tokens", type=int, default=150_000, help="per kind (code, prose)")
    x.add_argument("--batch", type=int, default=8)
    x.add_argument("--seed", type=int, default=0)
    x.add_argument("--threads", type=int, default=1)
    r = sub.add_parser("relayer")
    r.add_argument("--model", default="smollm2-135m-instruct")
    r.add_argument("--data", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--layers", type=int, nargs="+", required=True, help="hidden_states indices; end with -1 (final)")
    r.add_argument("--batch", type=int, default=8)
    r.add_argument("--threads", type=int, default=1)
    e = sub.add_parser("evaluate")
    e.add_argument("--model", default="smollm2-135m-instruct")
    e.add_argument("--weights", default=str(DEFAULT_OUT))
    e.add_argument("--limit", type=int, default=24)
    e.add_argument("--k", type=int, default=4)
    e.add_argument("--tokens", type=int, default=64)
    e.add_argument("--threads", type=int, default=1)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    if hasattr(args, "layers"):          # before any compute: a wrong list would waste a whole data pass
        from spec_engine.drafters.eagle import check_feature_layers
        try:
            check_feature_layers(args.layers)
        except ValueError as error:
            parser.error(str(error))
    {"generate": cmd_generate, "train": cmd_train, "evaluate": cmd_evaluate, "extract": cmd_extract,
     "relayer": cmd_relayer}[args.cmd](args)


if __name__ == "__main__":
    main()
