"""'Run this elsewhere': the playground's settings as copyable code for the libraries people deploy.

Why: a learner who found a setting that pays here needs the same behaviour in Hugging Face transformers, vLLM or
llama.cpp, and the option names differ in each (and drift between versions). `snippets(settings)` returns the
three texts and a list of plain notes; nothing here runs a model or imports one of those libraries.

Where there is no equivalent, the snippet says so and falls back to what gives the same *output distribution*
(plain decoding: speculative decoding with the exact rule never changes what is sampled, only the speed):
- the rules other than `exact` (`strict`, `typical`, the deliberate mistakes): each library verifies with its own
  default rule (`library_rules_text`, from spec_engine.core.rule.LIBRARY_RULES), which is what these snippets run;
- this project's trained EAGLE head (`eagle`, `eagle+lookup`): its weights are in this project's own format;
  vLLM and llama.cpp take EAGLE heads trained and exported for them;
- layer-skip self-drafting: no library here skips a set of middle layers to draft. Early exit does have one in
  transformers (`assistant_early_exit`), none in vLLM or llama.cpp.

Option names were checked against:
- transformers 5.24.0 (the installed package: `GenerationConfig`, `generate()`); TRANSFORMERS_VERSION;
- vLLM main, read on 2026-12-01: vllm/config/speculative.py at commit 002e77c1 and vllm/sampling_params.py at
  commit 00388f65 (VLLM_CHECKED); older releases spelled some differently (e.g. top_k=-1 to disable);
- llama.cpp main, read on 2026-12-01: common/arg.cpp at commit 0017d6fb (LLAMA_CPP_CHECKED), where the older
  `--draft-max` / `--draft-min` are removed in favour of `--spec-draft-n-max` / `--spec-draft-n-min`.
The option names each snippet may use are recorded below (VLLM_*_OPTIONS, LLAMA_CPP_OPTIONS) and
tests/test_equivalent_code.py holds every generated snippet against them.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass


import spec_engine as se

TRANSFORMERS_VERSION = "5.24.0"
VLLM_CHECKED = ("vLLM main (read 2026-12-01): vllm/config/speculative.py @ 002e77c1, "
                "vllm/sampling_params.py @ 00388f65")
LLAMA_CPP_CHECKED = "llama.cpp main (read 2026-12-01): common/arg.cpp @ 0017d6fb"

# The option names the snippets may use, as the checked sources spell them.
VLLM_LLM_OPTIONS = frozenset({"model", "speculative_config"})
VLLM_SPECULATIVE_OPTIONS = frozenset({"method", "model", "num_speculative_tokens", "prompt_lookup_max",
                                      "prompt_lookup_min", "use_heterogeneous_vocab"})
VLLM_SPECULATIVE_METHODS = frozenset({"ngram", "draft_model", "eagle", "eagle3"})
VLLM_SAMPLING_OPTIONS = frozenset({"temperature", "top_p", "top_k", "seed", "max_tokens"})
LLAMA_CPP_OPTIONS = {      # program -> the options it takes (arg.cpp's set_examples for that program)
    "llama-speculative": frozenset({"-m", "-md", "-p", "-n", "--spec-draft-n-max", "--spec-draft-n-min",
                                    "--spec-draft-p-min", "--temp", "--top-k", "--top-p", "--min-p", "--seed"}),
    "llama-lookup": frozenset({"-m", "-p", "-n", "--spec-draft-n-max", "--spec-draft-n-min", "--temp",
                               "--top-k", "--top-p", "--min-p", "--seed"}),
    "llama-server": frozenset({"-m", "-md", "--spec-type", "--spec-draft-n-max", "--spec-draft-n-min",
                               "--spec-draft-p-min", "--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m",
                               "--temp", "--top-k", "--top-p", "--min-p", "--seed"}),
}
LLAMA_CPP_SPEC_TYPES = frozenset({"draft-simple", "draft-eagle3", "ngram-simple"})



def library_rules_text() -> str:
    """One line per library: the verification rule it uses by default (spec_engine.core.rule.LIBRARY_RULES)."""
    return "\n".join(f"{library}: {rule} ({'exact' if se.RULE_INFO[rule].exact else 'not exact'}): {how}."
                     for library, (rule, how) in se.LIBRARY_RULES.items())


@dataclass(frozen=True)
class Snippets:
    transformers: str         # Python
    vllm: str                 # Python
    llama_cpp: str            # shell: one command per paragraph, comments start with '#'
    notes: tuple[str, ...]    # plain sentences (no markup): where something has no equivalent


def model_id(name: str) -> str:
    """A preset's Hugging Face id (what every library loads), or the name itself (a custom Hub id)."""
    try:
        preset = se.resolve_preset(name)
    except (KeyError, ValueError):
        return name
    return preset.hub_id or name


def gguf_name(name: str) -> str:
    """The GGUF file llama.cpp reads for a preset: the packaged one where this app has it, else a placeholder."""
    try:
        preset = se.resolve_preset(name)
    except (KeyError, ValueError):
        return f"{name.replace('/', '_')}.gguf"
    return preset.gguf_file or f"{(preset.hub_id or name).split('/')[-1]}.gguf"


@dataclass(frozen=True)
class DraftPlan:
    """What the draft name means for the three libraries."""
    kind: str                    # lookup | model | cross | early-exit | none
    draft_model: str | None = None
    max_ngram: int = se.PROMPT_LOOKUP_MAX_NGRAM
    min_ngram: int = se.PROMPT_LOOKUP_MIN_NGRAM
    exit_after: int | None = None
    why_none: str = ""


def plan(draft: str, exit_after: int = 0) -> DraftPlan:
    spec = se.parse_draft(draft)
    if spec.mode == "prompt-lookup":
        longest = spec.arg or se.PROMPT_LOOKUP_MAX_NGRAM
        return DraftPlan("lookup", max_ngram=longest,
                         min_ngram=min(spec.min_ngram or se.PROMPT_LOOKUP_MIN_NGRAM, longest))
    if spec.mode == "same-tokenizer":
        return DraftPlan("model", draft_model=spec.model)
    if spec.mode == "cross-tokenizer":
        return DraftPlan("cross", draft_model=spec.model)
    if spec.mode == "early-exit":
        return DraftPlan("early-exit", exit_after=exit_after or spec.arg or None)
    why = {
        "layer-skip": "Layer-skip self-drafting (the target minus some middle layers) has no equivalent in "
                      "transformers, vLLM or llama.cpp.",
        "eagle": "This project's trained EAGLE head is stored in its own format; no library here loads it. vLLM and "
                 "llama.cpp run EAGLE heads trained and exported for them (shown where they exist).",
        "eagle+lookup": "This project's EAGLE head (with prompt lookup where the text repeats) has no equivalent; "
                        "vLLM and llama.cpp run EAGLE heads trained and exported for them.",
        "layer-skip-tree": "A layer-skip draft tree has no equivalent in transformers, vLLM or llama.cpp (no "
                           "layer-skip draft there, and transformers' and llama.cpp's assisted decoding verify chains, "
                           "not trees).",
        "lookup-tree": "Prompt lookup as a draft tree has no equivalent here: transformers' prompt_lookup_num_tokens, "
                       "vLLM's ngram method and llama.cpp's lookup decoding verify one copied chain per round.",
        "naive-ids": "Naive ids are the tokenizer-mismatch mistake, shown on purpose: no library does it (they "
                     "refuse a draft with another vocabulary, or translate between tokenizers).",
    }.get(spec.mode, f"The draft {draft!r} has no equivalent in these libraries.")
    return DraftPlan("none", why_none=why)


def snippets(settings, target_path: str | None = None, draft_path: str | None = None,
             chat_prompt: str | None = None) -> Snippets:
    """The three snippets for `settings` (a RunSettings: target, draft, k, temperature, top_p, top_k, max_new_tokens,
    seed, rule, chat, prompt, exit_after). `target_path` / `draft_path` replace the models' Hub ids in the transformers
    code (the local checkpoint the playground loaded, when the Hub id cannot load here: see share.local_checkpoint; the
    offline test runs it so), with a comment and a note naming the Hub id; `chat_prompt` is the chat-templated prompt
    text, for llama.cpp's programs, which take raw text."""
    draft_plan = plan(settings.draft, getattr(settings, "exit_after", 0))
    notes = []
    info = se.RULE_INFO[settings.rule]
    if info.kind == "mistake":
        notes.append(f"The '{info.label}' rule is wrong on purpose, to show what exactness costs; each library here "
                     "verifies with its default rule (below), which is what these snippets run.")
    elif info.kind == "lossy":
        notes.append(f"The '{info.label}' rule is lossy: none of these snippets' defaults is (SGLang's accept "
                     "thresholds below 1.0 are); they run each library's default rule.")
    elif settings.rule != "exact":
        notes.append(f"The '{info.label}' rule is exact, and it is vLLM's and llama.cpp's default.")
    if settings.rule != "exact":
        notes.extend(library_rules_text().split("\n"))
    if draft_plan.why_none:
        notes.append(draft_plan.why_none + " The snippets decode without that draft: the same output "
                                           "distribution (for greedy, the same text), without its speed-up.")
    if draft_plan.kind == "lookup" and draft_plan.min_ngram > 1:
        notes.append(f"transformers' prompt lookup has no shortest n-gram: it also proposes after matches shorter "
                     f"than {draft_plan.min_ngram} tokens (vLLM's prompt_lookup_min does carry it).")
    if not settings.greedy:
        notes.append("Sampled runs follow the same distribution everywhere, but each library draws its own random "
                     "numbers: the seed reproduces a run within one library, not across them.")
    hub_target = model_id(settings.target)
    hub_draft = None if draft_plan.draft_model is None else model_id(draft_plan.draft_model)
    target = target_path or hub_target
    draft = None if hub_draft is None else (draft_path or hub_draft)
    local = [(role, path, hub)
             for role, path, hub in (("TARGET", target_path, hub_target), ("DRAFT", draft_path, hub_draft))
             if path and hub and path != hub]
    if local:
        notes.append("Offline here: the transformers code loads " + " and ".join(
            f"{hub} from the checkpoint this playground made from its packaged GGUF ({path})" for _, path, hub in local)
            + ", so it runs on this machine as shown; elsewhere use the Hub id (the comment in the code).")
    return Snippets(transformers_code(settings, draft_plan, target, draft, local),
                    vllm_code(settings, draft_plan, hub_target, hub_draft, notes),
                    llama_cpp_code(settings, draft_plan, chat_prompt, notes),
                    tuple(notes))


# ------------------------------------------------------------------------------------------- transformers

def transformers_code(settings, draft_plan: DraftPlan, target: str, draft: str | None,
                      local: list[tuple[str, str, str]] = ()) -> str:
    """`local`: (TARGET or DRAFT, local directory, Hub id) for each model loaded from a local checkpoint here."""
    lines = ["# Hugging Face transformers generate(): option names checked against transformers "
             f"{TRANSFORMERS_VERSION}",
             "import torch",
             "from transformers import AutoModelForCausalLM, AutoTokenizer",
             ""]
    for role, _, hub in local:
        lines.append(f"# {role}: offline here, the checkpoint the playground made from its packaged GGUF. "
                     f"Elsewhere: {role} = {hub!r}")
    lines.append(f"TARGET = {target!r}")
    if draft is not None:
        lines.append(f"DRAFT = {draft!r}")
    lines += [f"PROMPT = {settings.prompt!r}",
              "",
              "tokenizer = AutoTokenizer.from_pretrained(TARGET)",
              "model = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()"]
    if draft is not None:
        lines.append("assistant = AutoModelForCausalLM.from_pretrained(DRAFT, dtype=torch.float32).eval()")
    if draft_plan.kind == "cross":
        lines.append("assistant_tokenizer = AutoTokenizer.from_pretrained(DRAFT)")
    if settings.chat:
        lines.append('inputs = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], '
                     'add_generation_prompt=True, return_dict=True, return_tensors="pt")')
    else:
        lines.append('inputs = tokenizer(PROMPT, return_tensors="pt")')
    args = ["**inputs", f"max_new_tokens={settings.max_new_tokens}",
            "eos_token_id=tokenizer.eos_token_id",
            "pad_token_id=tokenizer.eos_token_id"]
    if settings.greedy:
        args.append("do_sample=False")
    else:
        lines.append(f"torch.manual_seed({settings.seed})")
        args += ["do_sample=True", f"temperature={settings.temperature!r}", f"top_p={settings.top_p!r}",
                 f"top_k={settings.top_k}"]    # top_k=0 is off; left unset, generate() would apply its default 50
    args += transformers_draft_args(settings, draft_plan)
    lines += ["output = model.generate(", *[f"    {a}," for a in args], ")",
              'new_tokens = output[0, inputs["input_ids"].shape[1]:]',
              "print(tokenizer.decode(new_tokens, skip_special_tokens=True))"]
    return "\n".join(lines) + "\n"


def transformers_draft_args(settings, draft_plan: DraftPlan) -> list[str]:
    if draft_plan.kind == "lookup":
        args = [f"prompt_lookup_num_tokens={settings.k}", f"max_matching_ngram_size={draft_plan.max_ngram}"]
        return args
    if draft_plan.kind in ("model", "cross"):
        args = ["assistant_model=assistant", f"num_assistant_tokens={settings.k}",
                'num_assistant_tokens_schedule="constant"',   # k every round, as here (no heuristic growth)
                "assistant_confidence_threshold=0.0"]           # no early stop of a draft by its confidence
        if draft_plan.kind == "cross":
            args += ["tokenizer=tokenizer", "assistant_tokenizer=assistant_tokenizer"]
        return args
    if draft_plan.kind == "early-exit":
        layers = (str(draft_plan.exit_after) if draft_plan.exit_after
                  else f"min({se.EARLY_EXIT_AFTER}, model.config.num_hidden_layers - 1)")
        return [f"assistant_early_exit={layers}", f"num_assistant_tokens={settings.k}",
                'num_assistant_tokens_schedule="constant"']
    return []


# ---------------------------------------------------------------------------------------------------- vLLM

def vllm_code(settings, draft_plan: DraftPlan, target: str, draft: str | None, notes: list[str]) -> str:
    config: list[tuple[str, str]] = []
    if draft_plan.kind == "lookup":
        config = [("method", repr("ngram")), ("num_speculative_tokens", str(settings.k)),
                  ("prompt_lookup_max", str(draft_plan.max_ngram)), ("prompt_lookup_min", str(draft_plan.min_ngram))]
    elif draft_plan.kind in ("model", "cross"):
        config = [("method", repr("draft_model")), ("model", repr(draft)), ("num_speculative_tokens", str(settings.k))]
        if draft_plan.kind == "cross":
            config.append(("use_heterogeneous_vocab", "True"))
            notes.append("vLLM's draft with another vocabulary (use_heterogeneous_vocab) keeps only the tokens both "
                         "vocabularies share; it does not re-tokenize the draft's text as this playground does.")
    elif se.parse_draft(settings.draft).mode in ("eagle", "eagle+lookup"):
        config = [("method", repr("eagle")), ("model", repr("<an EAGLE head trained for this target>")),
                  ("num_speculative_tokens", str(settings.k))]
    elif draft_plan.kind == "early-exit":
        notes.append("Early-exit self-drafting has no vLLM or llama.cpp equivalent; transformers has "
                     "assistant_early_exit (made for models trained with LayerSkip).")
    lines = [f"# vLLM speculative decoding: option names checked against {VLLM_CHECKED}",
             "from vllm import LLM, SamplingParams",
             "",
             f"PROMPT = {settings.prompt!r}",
             "llm = LLM(",
             f"    model={target!r},"]
    if config:
        lines.append("    speculative_config={")
        lines += [f"        {key!r}: {value}," for key, value in config]
        lines.append("    },")
    lines.append(")")
    sampling = [f"temperature={settings.temperature!r}", f"top_p={settings.top_p!r}", f"top_k={settings.top_k}",
                f"seed={settings.seed}", f"max_tokens={settings.max_new_tokens}"]
    lines.append(f"params = SamplingParams({', '.join(sampling)})   # temperature 0 is greedy; top_k 0 is off")
    if settings.chat:
        lines.append('outputs = llm.chat([{"role": "user", "content": PROMPT}], params)')
    else:
        lines.append("outputs = llm.generate(PROMPT, params)")
    lines.append("print(outputs[0].outputs[0].text)")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ llama.cpp

def sampling_flags(settings) -> list[str]:
    """--min-p 0: llama.cpp's default min-p (0.05) would cut the distribution further than this playground does."""
    return ["--temp", f"{settings.temperature:g}", "--top-k", str(settings.top_k), "--top-p", f"{settings.top_p:g}",
            "--min-p", "0", "--seed", str(settings.seed)]


def command(words: list[str]) -> str:
    """One shell command, quoted (the prompt included), cut into lines of a flag and its value."""
    parts, i = [shlex.quote(words[0])], 1
    while i < len(words):
        take = 2 if words[i].startswith("-") and i + 1 < len(words) and not words[i + 1].startswith("--") else 1
        parts.append(" ".join(shlex.quote(w) for w in words[i:i + take]))
        i += take
    return " \\\n  ".join(parts)


def llama_cpp_code(settings, draft_plan: DraftPlan, chat_prompt: str | None, notes: list[str]) -> str:
    target = gguf_name(settings.target)
    prompt = chat_prompt if settings.chat and chat_prompt else settings.prompt
    head = [f"# llama.cpp: option names checked against {LLAMA_CPP_CHECKED}",
            f"# {target}: the target as a GGUF file (convert a Hugging Face model with convert_hf_to_gguf.py)."]
    if settings.chat:
        head.append("# These programs take raw text: the prompt below is " +
                    ("the chat-templated text, as the playground encodes it." if chat_prompt else
                     "the plain prompt; wrap it in the target's chat template for the same input as here."))
    generate = ["-p", prompt, "-n", str(settings.max_new_tokens)]
    if draft_plan.kind == "model":
        words = ["llama-speculative", "-m", target, "-md", gguf_name(draft_plan.draft_model), *generate,
                 "--spec-draft-n-max", str(settings.k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
                 *sampling_flags(settings)]
        return "\n".join(head) + "\n" + command(words) + "\n"
    if draft_plan.kind == "lookup":
        lookup = ["llama-lookup", "-m", target, *generate, "--spec-draft-n-max", str(settings.k),
                  *sampling_flags(settings)]
        server = ["llama-server", "-m", target, "--spec-type", "ngram-simple",
                  "--spec-ngram-simple-size-n", str(draft_plan.max_ngram), "--spec-ngram-simple-size-m",
                  str(settings.k), *sampling_flags(settings)]
        return ("\n".join(head) + "\n# llama-lookup: its n-gram sizes are fixed when it is built.\n" + command(lookup)
                + "\n\n# Or serve it: n-gram lookup of the last N tokens, k draft tokens.\n" + command(server) + "\n")
    if se.parse_draft(settings.draft).mode in ("eagle", "eagle+lookup"):
        server = ["llama-server", "-m", target, "-md", "eagle3-head-for-this-target.gguf", "--spec-type",
                  "draft-eagle3", "--spec-draft-n-max", str(settings.k), *sampling_flags(settings)]
        return ("\n".join(head) + "\n# The nearest: an EAGLE-3 head trained for the target, exported to GGUF "
                "(not this project's head).\n" + command(server) + "\n")
    why = {"cross": "llama.cpp's speculative programs need a draft with the target's vocabulary.",
           "early-exit": "llama.cpp has no early-exit self-draft."}.get(draft_plan.kind, "")
    if why:
        notes.append(why)
    return ("\n".join(head) + f"\n# No llama.cpp equivalent for the draft {settings.draft!r}. {why}".rstrip() + "\n"
            "# Plain decoding (any llama.cpp program without a draft) gives the same distribution.\n")
