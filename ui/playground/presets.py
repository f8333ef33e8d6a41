"""Example prompts and classroom scenarios, read from presets/scenarios.yaml and validated on load.

Every error names the file, the entry and the field, e.g.
`presets/scenarios.yaml: scenarios[2] ('big-k'): field 'k' must be an integer in [1, 16], got 40`.

Scenarios are numbered by position from 1 (a label starting "N." must carry its own number). A caption that names
another scenario ("compare with scenario 5", "scenarios 6 and 7 change only the rule") must name one that differs
from it in exactly one setting: a classroom comparison changes one thing at a time.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

ROOT = Path(__file__).resolve().parents[2]   # the repository
SCENARIOS_PATH = ROOT / "presets" / "scenarios.yaml"


@dataclass(frozen=True)
class ExamplePrompt:
    id: str
    label: str
    text: str
    chat: bool = True


# A scenario's draft may name this instead of a model ("mismatch:naive-ids"): the tokenizer-mismatch demo's draft
# where the presets load (registry.mismatch_draft_model: packaged Gemma 3 here, GPT-2 on a Space), and "{mismatch}"
# in its caption becomes that model's short name.
MISMATCH = "mismatch"


@dataclass(frozen=True)
class Scenario:
    id: str
    label: str
    prompt: str            # the prompt text (a prompt id in the file is resolved on load)
    chat: bool
    draft: str             # a draft choice value: "layer-skip", "gemma-3-270m:cross-tokenizer", ...
    k: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    rule: str
    seed: int
    caption: str
    target: str | None = None   # None: the default target


@dataclass(frozen=True)
class Presets:
    prompts: list[ExamplePrompt]
    scenarios: list[Scenario]

    def prompt(self, prompt_id: str) -> ExamplePrompt:
        return next(p for p in self.prompts if p.id == prompt_id)

    def scenario(self, scenario_id: str) -> Scenario:
        return next(s for s in self.scenarios if s.id == scenario_id)


MATCHED_FIELDS = ("prompt", "chat", "draft", "k", "temperature", "top_p", "top_k", "max_new_tokens", "rule", "seed")


def scenario_of(settings, presets: Presets, default_target: str) -> Scenario | None:
    """The classroom scenario whose settings a run has, all of them (so a scenario changed by hand is no longer
    named), or None. Greedy runs ignore the seed, as the scenario's output does."""
    for scenario in presets.scenarios:
        fields = [f for f in MATCHED_FIELDS if not (f == "seed" and scenario.temperature == 0)]
        if (scenario.target or default_target) == settings.target and \
                all(getattr(scenario, f) == getattr(settings, f) for f in fields):
            return scenario
    return None


def scenario_tag(scenario: Scenario) -> str:
    """'S5' for '5. Layer skip ...' (the number a caption names), else the scenario's id."""
    number = scenario.label.split(".", 1)[0].strip()
    return f"S{number}" if number.isdigit() else scenario.id


Text = Annotated[str, Field(pattern=r"^\s*\S")]      # not empty


class Entry(BaseModel):
    """An entry of the file: known fields only, each of its type, no coercion (an integer passes as a number).
    A field left out is None here; one written as null is refused."""
    model_config = ConfigDict(extra="forbid", strict=True)


class PromptEntry(Entry):
    id: Text
    label: Text
    text: Text
    chat: bool = None


class ScenarioEntry(Entry):
    id: Text
    label: Text
    prompt: Text = None
    text: Text = None
    chat: bool = None
    target: Text = None
    draft: Text
    k: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    rule: Text
    seed: int = None
    caption: Text


TYPE_WORDS = {"int": "an integer", "float": "a number", "string": "a string", "bool": "true or false"}


def display(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def load_presets(path: str | Path | None = None, draft_check=None, target_check=None) -> Presets:
    """Read and validate the file. `draft_check(value) -> str | None` and `target_check(name) -> str | None`
    return an error message for an unknown draft or target (defaults: ui.playground.registry's)."""
    path = Path(path) if path is not None else SCENARIOS_PATH
    label = display(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{label}: cannot read the file ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"{label}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{label}: the top level must be a mapping with 'prompts' and 'scenarios'")
    unknown = sorted(set(data) - {"prompts", "scenarios"})
    if unknown:
        raise ValueError(f"{label}: unknown top-level key(s) {unknown}; expected 'prompts' and 'scenarios'")
    if draft_check is None or target_check is None:
        from ui.playground import registry
        from ui.playground import drafts
        draft_check = draft_check or drafts.check_draft_value
        target_check = target_check or registry.check_target_name
    prompts = [parse_prompt(entry, f"{label}: prompts[{i}]") for i, entry in enumerate(as_list(data, "prompts", label))]
    unique([p.id for p in prompts], f"{label}: prompts")
    by_id = {p.id: p for p in prompts}
    scenarios = [parse_scenario(entry, f"{label}: scenarios[{i}]", by_id, draft_check, target_check)
                 for i, entry in enumerate(as_list(data, "scenarios", label))]
    unique([s.id for s in scenarios], f"{label}: scenarios")
    check_comparisons(scenarios, label)
    return Presets(prompts, scenarios)


# What a run depends on (the label and caption do not); "prompt" is the resolved text.
SETTINGS = ("prompt", "chat", "target", "draft", "k", "temperature", "top_p", "top_k", "max_new_tokens", "rule", "seed")
SCENARIO_MENTION = re.compile(r"\bscenarios? (\d+(?:(?:, | and | or )\d+)*)", re.IGNORECASE)
LABEL_NUMBER = re.compile(r"^\s*(\d+)\.")


def differing_settings(a: Scenario, b: Scenario) -> list[str]:
    return [name for name in SETTINGS if getattr(a, name) != getattr(b, name)]


def mentioned_scenarios(caption: str) -> list[int]:
    """The scenario numbers a caption names: "scenario 5", "scenarios 6 and 7", "Scenario 2's"."""
    return [int(n) for match in SCENARIO_MENTION.finditer(caption) for n in re.findall(r"\d+", match.group(1))]


def check_comparisons(scenarios: list[Scenario], label: str) -> None:
    for i, s in enumerate(scenarios):
        where = f"{label}: scenarios[{i}] ({s.id!r})"
        number = LABEL_NUMBER.match(s.label)
        if number and int(number.group(1)) != i + 1:
            raise ValueError(f"{where}: field 'label' starts with number {number.group(1)}, but this is scenario "
                             f"{i + 1} (scenarios are numbered by their position in the file)")
        for n in mentioned_scenarios(s.caption):
            if not 1 <= n <= len(scenarios) or n == i + 1:
                raise ValueError(f"{where}: field 'caption' names scenario {n}, which is not another scenario "
                                 f"(there are {len(scenarios)})")
            differ = differing_settings(s, scenarios[n - 1])
            if len(differ) != 1:
                what = ", ".join(differ) if differ else "none: the runs are identical"
                raise ValueError(f"{where}: field 'caption' compares with scenario {n} ({scenarios[n - 1].id!r}), "
                                 f"but a comparison must change exactly one setting; they differ in: {what}")


def as_list(data: dict, key: str, label: str) -> list:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise ValueError(f"{label}: '{key}' must be a non-empty list")
    return value


def unique(ids: list[str], where: str) -> None:
    seen = set()
    for i, x in enumerate(ids):
        if x in seen:
            raise ValueError(f"{where}[{i}]: field 'id' duplicates an earlier entry ({x!r})")
        seen.add(x)


def check_fields(entry, schema: type[Entry], where: str) -> dict:
    """`entry`'s fields checked by `schema`, as given (with "_where": `where` and the entry's id); the first error
    names the field: an unknown one, then a required one missing, then a wrong value in the entry's order."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a mapping of fields, got {type(entry).__name__}")
    if isinstance(entry.get("id"), str):
        where = f"{where} ({entry['id']!r})"
    try:
        checked = schema.model_validate(entry)
    except ValidationError as exc:
        errors = exc.errors()
    else:
        return {**{key: getattr(checked, key) for key in entry}, "_where": where}
    for key in entry:
        if key not in schema.model_fields:
            raise ValueError(f"{where}: unknown field {key!r} (known fields: {', '.join(schema.model_fields)})")
    for key, field in schema.model_fields.items():
        if field.is_required() and entry.get(key) is None:
            raise ValueError(f"{where}: field {key!r} is required")
    error = min(errors, key=lambda error: list(entry).index(error["loc"][0]))
    key, kind = error["loc"][0], error["type"].split("_")[0]
    if error["type"] == "string_pattern_mismatch":
        raise ValueError(f"{where}: field {key!r} must not be empty")
    raise ValueError(f"{where}: field {key!r} must be {TYPE_WORDS.get(kind, kind)}, got {entry[key]!r}")


def parse_prompt(entry, where: str) -> ExamplePrompt:
    e = check_fields(entry, PromptEntry, where)
    return ExamplePrompt(e["id"], e["label"], e["text"].strip("\n"), e.get("chat", True))


def parse_scenario(entry, where: str, prompts: dict[str, ExamplePrompt], draft_check, target_check) -> Scenario:
    import spec_engine as se
    e = check_fields(entry, ScenarioEntry, where)
    where = e["_where"]

    def fail(field: str, message: str):
        raise ValueError(f"{where}: field {field!r} {message}")

    if ("prompt" in e) == ("text" in e):
        raise ValueError(f"{where}: exactly one of the fields 'prompt' (a prompt id) and 'text' must be set")
    if "prompt" in e:
        if e["prompt"] not in prompts:
            fail("prompt", f"must be one of the prompt ids ({', '.join(prompts)}), got {e['prompt']!r}")
        prompt = prompts[e["prompt"]]
        text, chat = prompt.text, e.get("chat", prompt.chat)
    else:
        text, chat = e["text"].strip("\n"), e.get("chat", True)
    if not 1 <= e["k"] <= se.MAX_K:
        fail("k", f"must be an integer in [1, {se.MAX_K}], got {e['k']}")
    if not 1 <= e["max_new_tokens"] <= se.MAX_NEW_TOKENS:
        fail("max_new_tokens", f"must be an integer in [1, {se.MAX_NEW_TOKENS}], got {e['max_new_tokens']}")
    if e["rule"] not in se.RULES:
        fail("rule", f"must be one of {', '.join(se.RULES)}, got {e['rule']!r}")
    if not math.isfinite(e["temperature"]) or e["temperature"] < 0:
        fail("temperature", f"must be a number >= 0 (0 = greedy), got {e['temperature']}")
    if not 0 < e["top_p"] <= 1:
        fail("top_p", f"must be in (0, 1], got {e['top_p']}")
    if e["top_k"] < 0:
        fail("top_k", f"must be >= 0 (0 = off), got {e['top_k']}")
    seed = e.get("seed", 0)
    if seed < 0:
        fail("seed", f"must be >= 0, got {seed}")
    draft, caption = e["draft"], " ".join(e["caption"].split())
    if draft.partition(":")[0] == MISMATCH:         # the tokenizer-mismatch demo's draft, whichever loads here
        from ui.playground import registry
        model = registry.mismatch_draft_model()
        draft = model + draft[len(MISMATCH):]
        caption = caption.replace("{" + MISMATCH + "}", registry.short_name(model))
    problem = draft_check(draft)
    if problem:
        fail("draft", problem)
    if "target" in e:
        problem = target_check(e["target"])
        if problem:
            fail("target", problem)
    return Scenario(id=e["id"], label=e["label"], prompt=text, chat=chat, draft=draft, k=e["k"],
                    temperature=e["temperature"], top_p=e["top_p"], top_k=e["top_k"],
                    max_new_tokens=e["max_new_tokens"], rule=e["rule"], seed=seed, caption=caption,
                    target=e.get("target"))
