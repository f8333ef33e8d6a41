"""'Run this elsewhere' (ui/views/equivalent_code.py): the generated code for transformers, vLLM and llama.cpp.

- The transformers snippet is executed offline on the packaged default (SmolLM2-135M-Instruct, float32, CPU: the
  checkpoint load_model dequantized from the packaged GGUF, substituted for the Hub id) and its greedy tokens must
  equal the playground's (`handlers.run`) for the same settings: prompt lookup, a same-tokenizer draft model, and a
  draft with no equivalent (plain generate()), with and without the chat template.
- Every snippet of every draft kind parses (ast for Python, shlex and `bash -n` for the shell), and every option name
  it uses is in the installed transformers' GenerationConfig / generate(), or in the lists the module records for
  vLLM and llama.cpp with the version they were checked against.
"""
import ast
import contextlib
import inspect
import io
import shlex
import shutil
import subprocess

import pytest
import transformers
from transformers import GenerationConfig
from transformers.generation.utils import GenerationMixin

from spec_engine import models as se_models
from ui.playground import handlers
from ui.playground.handlers import RUN_OUTPUTS
from ui.playground.state import RunSettings, SessionState
from ui.views import equivalent_code as ec

TARGET = "smollm2-135m-instruct"
PROMPT = "Give me three tips for learning a new language, one short sentence each."
DRAFTS = ["prompt-lookup", "prompt-lookup:4:2", "smollm2-360m-instruct", "gemma-3-270m:cross-tokenizer",
          "gemma-3-270m:naive-ids", "layer-skip", "early-exit", "eagle", "eagle+lookup"]
STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who"   # chat=False
HOSTILE_PROMPT = "Quote: it's \"fine\" \\ $HOME `rm -rf` <img src=x>\n-p --temp 9\n"


def settings(**change) -> RunSettings:
    values = dict(target=TARGET, draft="prompt-lookup", k=4, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=40,
                  seed=0, rule="exact", chat=True, prompt=PROMPT)
    values.update(change)
    return RunSettings(**values)


CASES = [settings(draft=d, temperature=t, top_p=p, top_k=tk, chat=chat, rule=rule, prompt=HOSTILE_PROMPT)
         for d in DRAFTS for (t, p, tk) in ((0.0, 1.0, 0), (0.8, 0.9, 50)) for chat in (True, False)
         for rule in ("exact", "topp_membership")]


def calls(tree, name):
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == name]


def keywords(call) -> list[str]:
    return [kw.arg for kw in call.keywords if kw.arg is not None]


GENERATE_NAMES = set(inspect.signature(GenerationMixin.generate).parameters)


def generate_accepts(name: str) -> bool:
    """An argument transformers' generate() reads: a named parameter, a GenerationConfig field, or one of the
    tokenizer arguments that generate() takes from its kwargs (found in its source, not assumed)."""
    if name in GENERATE_NAMES or hasattr(GenerationConfig(), name):
        return True
    return f'kwargs.pop("{name}"' in inspect.getsource(GenerationMixin)


@pytest.mark.parametrize("case", CASES, ids=lambda s: f"{s.draft}-t{s.temperature}-chat{int(s.chat)}-{s.rule}")
def test_python_snippets_parse_and_use_only_checked_option_names(case):
    code = ec.snippets(case)
    assert code.transformers.startswith(f"# Hugging Face transformers generate(): option names checked against "
                                        f"transformers {ec.TRANSFORMERS_VERSION}")
    assert ec.TRANSFORMERS_VERSION == transformers.__version__       # the installed version is the checked one
    tree = ast.parse(code.transformers)
    (generate,) = calls(tree, "generate")
    assert all(generate_accepts(name) for name in keywords(generate)), keywords(generate)
    assert ("do_sample=False" in code.transformers) == case.greedy

    assert code.vllm.startswith(f"# vLLM speculative decoding: option names checked against {ec.VLLM_CHECKED}")
    tree = ast.parse(code.vllm)
    (llm,) = calls(tree, "LLM")
    assert set(keywords(llm)) <= ec.VLLM_LLM_OPTIONS
    for kw in llm.keywords:
        if kw.arg == "speculative_config":
            config = ast.literal_eval(kw.value)
            assert set(config) <= ec.VLLM_SPECULATIVE_OPTIONS and config["method"] in ec.VLLM_SPECULATIVE_METHODS
            assert config["num_speculative_tokens"] == case.k
    (sampling,) = calls(tree, "SamplingParams")
    assert set(keywords(sampling)) <= ec.VLLM_SAMPLING_OPTIONS
    assert {kw.arg: ast.literal_eval(kw.value) for kw in sampling.keywords} == dict(
        temperature=case.temperature, top_p=case.top_p, top_k=case.top_k, seed=case.seed,
        max_tokens=case.max_new_tokens)
    prompts = [node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and node.targets[0].id == "PROMPT"]
    assert [ast.literal_eval(p) for p in prompts] == [case.prompt]      # the prompt survives quoting exactly


def shell_commands(text: str) -> list[list[str]]:
    """The snippet's commands as argument lists: comments dropped, the ' \\<newline>  ' continuations joined."""
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    return [shlex.split(chunk.replace(" \\\n  ", " ")) for chunk in body.split("\n\n") if chunk.strip()]


@pytest.mark.parametrize("case", CASES, ids=lambda s: f"{s.draft}-t{s.temperature}-chat{int(s.chat)}-{s.rule}")
def test_llama_cpp_snippets_parse_and_use_only_checked_option_names(case):
    chat_prompt = "<|im_start|>user\n" + case.prompt + "<|im_end|>\n<|im_start|>assistant\n"
    text = ec.snippets(case, chat_prompt=chat_prompt).llama_cpp
    assert text.startswith(f"# llama.cpp: option names checked against {ec.LLAMA_CPP_CHECKED}")
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True).returncode == 0
    commands = shell_commands(text)
    kind = ec.plan(case.draft).kind
    assert len(commands) == {"lookup": 2, "model": 1}.get(kind, 1 if case.draft.startswith("eagle") else 0)
    for words in commands:
        program, flags, values = words[0], words[1::2], words[2::2]
        assert program in ec.LLAMA_CPP_OPTIONS and len(flags) == len(values)
        assert set(flags) <= ec.LLAMA_CPP_OPTIONS[program], set(flags) - ec.LLAMA_CPP_OPTIONS[program]
        given = dict(zip(flags, values))
        assert given.get("--spec-type", "draft-simple") in ec.LLAMA_CPP_SPEC_TYPES
        assert given["--temp"] == f"{case.temperature:g}" and given["--top-k"] == str(case.top_k)
        assert given["--top-p"] == f"{case.top_p:g}" and given["--seed"] == str(case.seed)
        assert given["--min-p"] == "0"
        assert given.get("--spec-draft-n-max", given.get("--spec-ngram-simple-size-m")) == str(case.k)
        if "-p" in given:
            assert given["-p"] == (chat_prompt if case.chat else case.prompt)     # quoting round trip


def test_no_equivalent_is_said_plainly():
    assert any("wrong on purpose" in n for n in ec.snippets(settings(rule="no_residual")).notes)
    for draft in ("layer-skip", "eagle", "gemma-3-270m:naive-ids"):
        code = ec.snippets(settings(draft=draft))
        assert any("no equivalent" in n or "no library" in n for n in code.notes), draft
        assert "prompt_lookup" not in code.transformers and "assistant_model" not in code.transformers
    assert not ec.snippets(settings(draft="prompt-lookup")).notes


def test_offline_the_snippet_names_the_local_checkpoint_and_says_so(monkeypatch):
    """Issue #38: offline, with the default loaded from the packaged GGUF, the Hub id fails with an OSError; the panel
    names the checkpoint the playground loaded instead, says so in a comment and a note, and keeps the Hub id for
    elsewhere (vLLM's code keeps it too). Online, or with the Hub id cached, the Hub id stays."""
    from types import SimpleNamespace

    from ui.playground import registry as reg, share
    loaded = SimpleNamespace(source="cache:/cache/smollm2-135m-instruct-abc")
    monkeypatch.setattr(reg.REGISTRY, "loaded", lambda name: loaded if name == TARGET else None)
    monkeypatch.setattr(se_models, "hub_source", lambda hub_id, gated=False: (None, "offline"))
    assert share.local_checkpoint(TARGET) == "/cache/smollm2-135m-instruct-abc"
    assert share.local_checkpoint("smollm2-360m-instruct") is None              # not loaded here
    snippet = ec.snippets(settings(), target_path=share.local_checkpoint(TARGET))     # what share.equivalent does
    code, vllm, notes = snippet.transformers, snippet.vllm, " ".join(snippet.notes)
    assert "TARGET = '/cache/smollm2-135m-instruct-abc'" in code
    assert "Elsewhere: TARGET = 'HuggingFaceTB/SmolLM2-135M-Instruct'" in code
    assert "model='HuggingFaceTB/SmolLM2-135M-Instruct'" in vllm and "Offline here" in notes
    ast.parse(code)
    monkeypatch.setattr(se_models, "hub_source", lambda hub_id, gated=False: ("hub-cache", "cached"))
    assert share.local_checkpoint(TARGET) is None


# ------------------------------------------------------------------------------ the snippet, run offline

@pytest.fixture(scope="module")
def local_target(smollm2):
    """The directory of the float32 checkpoint load_model made from the packaged GGUF (a Hub id's stand-in)."""
    kind, _, where = smollm2.source.partition(":")
    if kind != "cache":           # the very first load on a machine reads the GGUF and writes the cache
        from spec_engine.models import load_model
        kind, _, where = load_model(TARGET, device="cpu", dtype="float32").source.partition(":")
    assert kind == "cache", smollm2.source
    return where


def run_snippet(code: str) -> list[int]:
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, "<transformers snippet>", "exec"), namespace)      # noqa: S102 - the test's purpose
    return namespace["new_tokens"].tolist()


def playground_tokens(s: RunSettings) -> list[int]:
    args = dict(vars(s), auto_baseline=False, show_spaces=False)
    outputs = list(handlers.run(*[args[name] for name in handlers.RUN_INPUTS], SessionState()))
    final = outputs[-1][RUN_OUTPUTS.index("summary")]
    assert final["final"]
    return final["tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("draft, chat", [("prompt-lookup", True), ("prompt-lookup:3", False),
                                         (TARGET, True), ("layer-skip", True)])
def test_the_transformers_snippet_gives_the_playgrounds_greedy_tokens(playground_registry, local_target, draft, chat):
    s = settings(draft=draft, chat=chat, prompt=PROMPT if chat else STORY)
    code = ec.snippets(s, target_path=local_target, draft_path=local_target).transformers
    assert {"prompt-lookup": "prompt_lookup_num_tokens=4", TARGET: "assistant_model=assistant",
            "layer-skip": "**inputs"}.get(draft.split(":")[0]) in code
    expected = playground_tokens(s)
    assert len(expected) >= 20
    assert run_snippet(code) == expected
