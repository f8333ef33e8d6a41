"""The checks every public handler runs, in one place, and the wording of what users are shown.

API callers bypass the widgets, so nothing a handler receives is trusted: each `check_*` takes a raw value as
it arrives (a JSON number, string or bool) and returns the clean value or raises `InputError`, a `gr.Error`
whose message names the field, the allowed range and what was received. The same checks serve twice:

- as Gradio's `validator=` hook (`run_validator`, `mismatch_validator`, or `verdicts` for other tabs), which
  refuses a bad request before it takes a place in the queue, marks the field in the UI, and answers API
  callers with HTTP 422 listing every bad parameter;
- inside the handlers (`check_settings`), for direct calls and for what only a loaded model can tell (the
  prompt's length in tokens against the context, the layer count, the draft's vocabulary).

`public_message` removes local file paths from any message before a user sees it and caps its length;
`refusal` makes such a message a gr.Error that is inert as HTML and logs no traceback.

For lab tabs: `check_lab_n`, `check_k`, `check_temperature`, `check_top_p`, `check_top_k`, `check_seed`,
`check_max_new_tokens`, `check_int`, `check_number`, `check_prompt`, `check_target`, `check_draft`, `verdicts`.
"""
from __future__ import annotations

import html
import logging
import math
import re
from typing import Callable

import gradio as gr

import spec_engine as se

from ui.playground import limits
from ui.playground import registry as reg
from ui.playground import drafts
from ui.playground.state import RunSettings

MAX_TEMPERATURE = 2.0
MAX_TOP_K = 1_000_000          # larger than any vocabulary: the same as off
MAX_SEED = 2**63 - 1
MAX_NAME_CHARS = 200           # model and draft names, layer lists
MAX_PROMPT_LOOKUP_N = 16
MAX_EXIT_AFTER = 1000
MAX_MESSAGE_CHARS = 1000       # any message shown to a user (a value echoed back must not make it megabytes)
log = logging.getLogger(__name__)

# A Hub repository id: owner/name, letters, digits, '-', '_', '.' (no '..', no path, nothing HTML can read).
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
# An absolute path of two or more parts (not the '//' of a URL, not a relative path such as presets/x.yaml).
_ABS_PATH = re.compile(r"(?<![\w.~/-])~?/(?:[\w.@+-]+/)+([\w.@+-]*)")


class InputError(gr.Error):
    """A request the app refuses. `field` names the input; the message says what would be accepted."""

    def __init__(self, field: str, message: str):
        super().__init__(capped(message), print_exception=False)
        self.field = field


def capped(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def public_message(text) -> str:
    """`text` without local file paths and at most MAX_MESSAGE_CHARS long: '/home/u/.cache/x/model.safetensors is
    missing' -> 'model.safetensors is missing'. Users learn which file, not where this server keeps it."""
    return capped(_ABS_PATH.sub(lambda m: m.group(1) or "…", str(text)[:4 * MAX_MESSAGE_CHARS]))


def unexpected(field: str, exc: BaseException) -> str:
    log.warning("validating %s raised %s: %s", field, type(exc).__name__, shown(exc, 200))
    return f"{field}: this value cannot be checked ({type(exc).__name__}); send a plain value of the field's type."


def message_of(exc: BaseException) -> str:
    return public_message(exc.message if isinstance(exc, gr.Error) else exc)


def shown(value, limit: int = 40) -> str:
    """A received value for a message: repr, cut short (a caller may send a megabyte where a number goes), with
    '<', '>' and '&' as entities (Gradio renders error messages as HTML: '<img src=...>' would load)."""
    text = repr(value)
    return html.escape(text if len(text) <= limit else text[:limit] + "…", quote=False)


def refusal(text) -> gr.Error:
    """A gr.Error for a refusal: a sentence for the user (no local paths, capped, inert as HTML) and no
    traceback in the server's log."""
    return gr.Error(html.escape(public_message(text), quote=False), print_exception=False)


# ------------------------------------------------------------------------------------------- numbers

def check_number(field: str, value, lo: float | None = None, hi: float | None = None, label: str | None = None,
                 hint: str = "") -> float:
    """A finite number in [lo, hi] (a numeric string is accepted; bools and None are not)."""
    label = label or field
    number = _as_number(value)
    try:
        number = None if number is None else float(number)
    except OverflowError:             # a JSON integer with hundreds of digits
        number = math.inf
    if number is None or not math.isfinite(number):
        raise InputError(field, f"{label} must be a finite number{hint}, got {shown(value)}")
    if (lo is not None and number < lo) or (hi is not None and number > hi):
        if hi is None:
            raise InputError(field, f"{label} must be >= {lo:g}{hint}, got {number:g}")
        raise InputError(field, f"{label} must be >= {lo:g} and <= {hi:g}{hint}, got {number:g}")
    return number


def check_int(field: str, value, lo: int, hi: int, label: str | None = None) -> int:
    """A whole number in [lo, hi] (4.0 is 4; 4.5 is refused, not rounded)."""
    label = label or field
    number = _as_number(value)
    if number is None or (isinstance(number, float) and not number.is_integer()):
        raise InputError(field, f"{label} must be a whole number, got {shown(value)}")
    number = int(number)          # exact for ints (seeds reach 2**63), checked above for floats
    if not lo <= number <= hi:
        raise InputError(field, f"{label} must be between {lo} and {hi}, got {number}")
    return number


def _as_number(value) -> int | float | None:
    """An int or a float from a JSON number or a short numeric string; None for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, str) and len(value) <= 40:
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            return None
    return None


def check_bool(field: str, value, label: str | None = None) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    raise InputError(field, f"{label or field} must be true or false, got {shown(value)}")


def check_k(value) -> int:
    return check_int("k", value, 1, se.MAX_K)


def check_temperature(value) -> float:
    return check_number("temperature", value, 0.0, MAX_TEMPERATURE, hint=" (0 = greedy)")


def check_top_p(value) -> float:
    number = _as_number(value)
    if number is None or not 0 < number <= 1:          # NaN fails the comparison too
        raise InputError("top_p", f"top_p must be in (0, 1], got {shown(value)}")
    return float(number)


def check_top_k(value) -> int:
    return check_int("top_k", value, 0, MAX_TOP_K, label="top-k")


def check_max_new_tokens(value) -> int:
    return check_int("max_new_tokens", value, 1, limits.current().max_new_tokens, label="max new tokens")


def check_seed(value) -> int:
    return check_int("seed", value, 0, MAX_SEED)


def check_lab_n(value, lo: int = 1, hi: int | None = None, label: str = "N") -> int:
    """The sample count of a lab experiment: at most the server's `lab_max_n` (SPEC_LAB_MAX_N)."""
    hi = limits.current().lab_max_n if hi is None else min(hi, limits.current().lab_max_n)
    return check_int("n", value, lo, hi, label=label)


def check_rule(value) -> str:
    if value not in se.RULES:
        raise InputError("rule", f"Verification rule must be one of {', '.join(se.RULES)}, got {shown(value)}")
    return value


def check_rule_for(draft: str, rule: str) -> None:
    """A tree draft takes the rules that judge trees (exact, strict, typical: core/tree_rule.py); the wrong chain
    rules judge chains only (the wrong tree rule is the exactness lab's)."""
    kind = drafts.kind_by_key(se.parse_draft(draft).mode)
    takes = [name for name in se.TREE_RULES if name not in se.WRONG_TREE_RULES]
    if kind is not None and kind.tree and rule not in takes:
        raise InputError("rule", f"The rule {rule!r} judges chains of drafts; the tree draft {draft!r} takes "
                                 f"{', '.join(takes)} (the exactness lab shows a wrong rule for trees)")


def check_sampling(temperature: float, top_p: float, top_k: int) -> se.SamplingParams:
    try:
        return se.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    except ValueError as exc:
        raise InputError("temperature", f"Sampling: {exc}") from None


# -------------------------------------------------------------------------------------------- text

def check_prompt(value) -> str:
    """Non-empty text of at most `max_prompt_chars` characters (checked before anything tokenizes it)."""
    if not isinstance(value, str) or not value.strip():
        raise InputError("prompt", "The prompt is empty: type something for the model to continue.")
    cap = limits.current().max_prompt_chars
    if len(value) > cap:
        raise InputError("prompt", f"The prompt has {len(value):,} characters; this server takes at most {cap:,}: "
                                   "shorten it.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:       # a lone surrogate ('\ud800' in raw JSON): no tokenizer can take it
        raise InputError("prompt", f"The prompt is not valid text: character {exc.start + 1:,} is a lone UTF-16 "
                                   f"surrogate ({value[exc.start]!r}); send UTF-8 text.") from None
    return value


def check_prompt_fits(n_tokens: int, max_new_tokens: int, context: int | None, model: str) -> None:
    """The prompt's tokens plus the generation budget must fit the model's context."""
    if context is None or n_tokens + max_new_tokens <= context:
        return
    room = context - max_new_tokens
    fix = (f"shorten the prompt to {room:,} tokens or fewer, or lower max new tokens" if room > 0
           else f"lower max new tokens below {context:,}")
    raise InputError("prompt", f"The prompt is {n_tokens:,} tokens long and max new tokens reserves {max_new_tokens:,} "
                               f"more, but {reg.display_name(model)} reads at most {context:,} tokens: {fix}.")


def check_prompt_for(loaded, prompt: str, chat: bool, max_new_tokens: int) -> int:
    """Tokenize with the model's tokenizer (chat template included) and check the fit; returns the token count."""
    n_tokens = int(loaded.encode_prompt(prompt, chat=chat).shape[1])
    check_prompt_fits(n_tokens, max_new_tokens, getattr(loaded.model.config, "max_position_embeddings", None),
                      loaded.name)
    return n_tokens


def _name(field: str, value, label: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(field, f"{label} is empty: pick one from the list.")
    if len(value) > MAX_NAME_CHARS:
        raise InputError(field, f"{label} is {len(value):,} characters long; names are at most {MAX_NAME_CHARS}.")
    return value.strip()


def looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or "\\" in name or ".." in name or name.count("/") > 1


def check_model_name(field: str, name: str, label: str) -> str:
    """A preset, or (only when the host allowed custom models) a Hub id. Never a local path."""
    presets = reg.preset_names()
    if name in presets:
        return name
    known = ", ".join(presets)
    if looks_like_path(name):
        raise InputError(field, f"{label} {shown(name)} looks like a file path; this app loads only its model presets "
                                f"({known}), never files from the server.")
    if not HUB_ID.fullmatch(name):
        raise InputError(field, f"Unknown {label.lower()} {shown(name)}: pick one of {known}.")
    if not limits.current().allow_custom_models:
        raise InputError(field, f"{label} {name!r} is not one of this server's presets ({known}), and custom Hub "
                                "models are switched off here. The host can allow them with "
                                "`python app.py --allow-custom-models` (or SPEC_ALLOW_CUSTOM_MODELS=1).")
    return name


def check_target(value) -> str:
    return check_model_name("target", _name("target", value, "Target model"), "Target model")


def check_draft(value, target: str | None = None) -> str:
    """A draft name the playground can build; with `target`, also one that fits it (availability, tokenizer)."""
    draft = _name("draft", value, "Draft")
    try:
        kind, spec = drafts.split_draft(draft)
    except ValueError as exc:
        raise InputError("draft", f"Draft: {exc}") from None
    if spec.model is not None:
        try:
            check_model_name("draft", spec.model, "Draft model")
        except InputError as exc:
            raise InputError("draft", f"Draft: {exc.message}") from None
    if spec.mode == "prompt-lookup" and spec.arg is not None and not 1 <= spec.arg <= MAX_PROMPT_LOOKUP_N:
        raise InputError("draft", f"Draft: prompt-lookup:N needs N between 1 and {MAX_PROMPT_LOOKUP_N}, got {spec.arg}")
    if spec.mode == "early-exit" and spec.arg is not None and spec.arg < 1:
        raise InputError("draft", "Draft: early-exit:N needs N >= 1 (the number of layers kept)")
    if target is None:
        return draft
    ok, reason = kind.available(target)
    if not ok:
        raise InputError("draft", f"Draft {draft!r} is not available for {reg.display_name(target)}: {reason}")
    if spec.mode == "same-tokenizer":
        target_family, draft_family = reg.tokenizer_family(target), reg.tokenizer_family(spec.model)
        if target_family and draft_family and target_family != draft_family:
            raise InputError("draft", other_tokenizer_message(spec.model, target, f"{draft_family} vs {target_family}"))
    return draft


def other_tokenizer_message(draft_model: str, target: str, detail: str) -> str:
    return (f"Draft: {reg.display_name(draft_model)} uses another tokenizer than {reg.display_name(target)} "
            f"({detail}), so its token ids name other text for the target. Use '{draft_model}:cross-tokenizer' "
            f"(the draft's text is re-tokenized) or '{draft_model}:naive-ids' (to watch the mistake).")


def check_same_tokenizer(target, draft, draft_model: str) -> None:
    """After loading: a same-tokenizer draft must share the target's vocabulary (custom models have no family)."""
    sizes = (se.vocab_size(draft.model), se.vocab_size(target.model))
    if sizes[0] != sizes[1] or len(draft.tokenizer) != len(target.tokenizer):
        raise InputError("draft", other_tokenizer_message(
            draft_model, target.name, f"vocabulary {sizes[0]:,} vs {sizes[1]:,}"))


def check_layers(skip_layers, exit_after, draft: str | None, loaded) -> tuple[str, int]:
    """Layer-skip list and early-exit depth: syntax always, bounds once the target is loaded."""
    if not isinstance(skip_layers, (str, type(None))) or len(skip_layers or "") > MAX_NAME_CHARS:
        raise InputError("skip_layers", f"layers to skip must be text like '21, 23, 25-27', got {shown(skip_layers)}")
    skip = (skip_layers or "").strip()
    exit_n = check_int("exit_after", exit_after or 0, 0, MAX_EXIT_AFTER, label="exit after")
    if loaded is None or draft is None:
        return skip, exit_n
    n_layers = len(loaded.model.model.layers)
    if draft in ("layer-skip", "layer-skip-tree") and skip:
        try:
            drafts.parse_layers(skip, n_layers)
        except ValueError as exc:
            raise InputError("skip_layers", str(exc)) from None
    if draft == "early-exit" and exit_n and not 1 <= exit_n < n_layers:
        raise InputError("exit_after", f"early exit: exit after 1 to {n_layers - 1} of the target's {n_layers} layers, "
                                       f"got {exit_n}")
    return skip, exit_n


# ------------------------------------------------------------------------------------ whole requests

RUN_FIELDS = ("prompt", "target", "draft", "k", "temperature", "top_p", "top_k", "max_new_tokens", "seed", "rule",
              "chat", "skip_layers", "exit_after")


def _run_checks(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                skip_layers, exit_after) -> tuple[dict, dict]:
    """Every field checked on its own, then the checks that need several (prompt vs context, draft vs target).
    Returns (clean values, {field: message})."""
    clean: dict = {}
    problems: dict[str, str] = {}

    def attempt(field: str, check: Callable[[], object]) -> None:
        try:
            clean[field] = check()
        except (gr.Error, ValueError) as exc:
            problems.setdefault(field, message_of(exc))
        except Exception as exc:          # a check's own bug must still name the field, not leak its internals
            problems.setdefault(field, unexpected(field, exc))

    attempt("prompt", lambda: check_prompt(prompt))
    attempt("target", lambda: check_target(target))
    attempt("draft", lambda: check_draft(draft, clean.get("target")))
    attempt("k", lambda: check_k(k))
    attempt("temperature", lambda: check_temperature(temperature))
    attempt("top_p", lambda: check_top_p(top_p))
    attempt("top_k", lambda: check_top_k(top_k))
    attempt("max_new_tokens", lambda: check_max_new_tokens(max_new_tokens))
    attempt("seed", lambda: check_seed(seed))
    attempt("rule", lambda: check_rule(rule))
    attempt("chat", lambda: check_bool("chat", chat, "apply the chat template"))
    if {"draft", "rule"} <= clean.keys():
        try:
            check_rule_for(clean["draft"], clean["rule"])
        except InputError as exc:
            problems.setdefault(exc.field, exc.message)
    loaded = reg.REGISTRY.loaded(clean["target"]) if "target" in clean else None
    try:
        clean["skip_layers"], clean["exit_after"] = check_layers(skip_layers, exit_after, clean.get("draft"), loaded)
    except InputError as exc:
        problems.setdefault(exc.field, message_of(exc))
    if {"temperature", "top_p", "top_k"} <= clean.keys():
        try:
            check_sampling(clean["temperature"], clean["top_p"], clean["top_k"])
        except InputError as exc:
            problems.setdefault(exc.field, exc.message)
    if loaded is not None and {"prompt", "max_new_tokens", "chat"} <= clean.keys():
        try:
            check_prompt_for(loaded, clean["prompt"], clean["chat"], clean["max_new_tokens"])
        except (gr.Error, ValueError) as exc:
            problems.setdefault("prompt", message_of(exc))
    return clean, problems


def check_fields(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                 skip_layers="", exit_after=0) -> tuple[dict, dict]:
    """Every run field checked, none skipped: (clean values, {field: message}). A share link's values go through
    this, so a link is refused exactly as a typed or API value would be (ui/playground/share.py)."""
    return _run_checks(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                       skip_layers, exit_after)


def check_settings(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                   skip_layers="", exit_after=0) -> RunSettings:
    """Raw run inputs -> RunSettings, or InputError for the first bad field (in the order of the controls)."""
    clean, problems = _run_checks(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule,
                                  chat, skip_layers, exit_after)
    for field in RUN_FIELDS:
        if field in problems:
            raise InputError(field, problems[field])
    return RunSettings(**clean)


def verdicts(*checks: Callable[[], object] | None) -> list[dict]:
    """For a `validator=`: one `gr.validate` per input, in input order. Each check is a zero-argument callable
    that raises (InputError, gr.Error or ValueError) when its input is bad, or None for an input not checked."""
    out = []
    for check in checks:
        try:
            if check is not None:
                check()
            out.append(gr.validate(True, ""))
        except (gr.Error, ValueError) as exc:
            out.append(gr.validate(False, message_of(exc)))
        except Exception as exc:
            out.append(gr.validate(False, unexpected("this input", exc)))
    return out


def _verdicts_for(fields: tuple[str, ...], problems: dict[str, str]) -> list[dict]:
    return [gr.validate(field not in problems, problems.get(field, "")) for field in fields]


def run_validator(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                  skip_layers, exit_after, auto_baseline, show_spaces, state=None) -> list[dict]:
    """`validator=` of run and sweep_k: the inputs of handlers.RUN_INPUTS plus the session state."""
    _, problems = _run_checks(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                              skip_layers, exit_after)
    for field, value in (("auto_baseline", auto_baseline), ("show_spaces", show_spaces)):
        try:
            check_bool(field, value)
        except InputError as exc:
            problems[field] = exc.message
    return _verdicts_for(RUN_FIELDS + ("auto_baseline", "show_spaces", "state"), problems)


STEP_FIELDS = RUN_FIELDS + ("show_spaces",)


def step_validator(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                   skip_layers, exit_after, show_spaces, session=None) -> list[dict]:
    """`validator=` of the step-through's events (classroom.STEP_INPUTS plus its session): the checks of /run."""
    _, problems = _run_checks(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                              skip_layers, exit_after)
    try:
        check_bool("show_spaces", show_spaces)
    except InputError as exc:
        problems["show_spaces"] = exc.message
    return _verdicts_for(STEP_FIELDS + ("session",), problems)


def check_position(value) -> int:
    """The step-through finder's draft position i: 1 to the largest k."""
    return check_int("position", value, 1, se.MAX_K, label="draft position i")


def find_validator(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                   skip_layers, exit_after, show_spaces, position, session=None) -> list[dict]:
    """`validator=` of 'Next round rejecting draft i': the step inputs, then the position."""
    verdicts_ = step_validator(prompt, target, draft, k, temperature, top_p, top_k, max_new_tokens, seed, rule, chat,
                               skip_layers, exit_after, show_spaces)
    return verdicts_[:-1] + verdicts(lambda: check_position(position)) + verdicts_[-1:]


def check_mismatch(prompt, target, max_new_tokens, chat) -> tuple[dict, dict]:
    """The tokenizer-mismatch demo's inputs -> (clean values, {field: message})."""
    clean, problems = {}, {}
    for field, check in (("prompt", lambda: check_prompt(prompt)), ("target", lambda: check_target(target)),
                         ("max_new_tokens", lambda: check_max_new_tokens(max_new_tokens)),
                         ("chat", lambda: check_bool("chat", chat, "apply the chat template"))):
        try:
            clean[field] = check()
        except InputError as exc:
            problems[field] = exc.message
    return clean, problems


def mismatch_validator(prompt, target, max_new_tokens, chat, state=None) -> list[dict]:
    """`validator=` of the tokenizer-mismatch demo."""
    _, problems = check_mismatch(prompt, target, max_new_tokens, chat)
    return _verdicts_for(("prompt", "target", "max_new_tokens", "chat", "state"), problems)
