"""Limits, input validation and the model registry's bounds, without a server (ui/playground/limits.py,
ui/playground/validate.py, ui/playground/registry.py). The registry tests use a fake loader, so they load nothing and
take milliseconds."""
import threading
import time
from types import SimpleNamespace

import gradio as gr
import pytest
import torch

from ui.playground import handlers, limits, runner, validate
from ui.playground import registry as reg
from ui.playground.state import MAX_HISTORY, RunSettings, SessionState

TARGET = "smollm2-135m-instruct"


@pytest.fixture
def configured():
    """Change the process's limits for one test, then put them back."""
    previous = limits.current()
    yield lambda **changes: limits.configure(**changes)
    limits.configure(previous)


# ------------------------------------------------------------------------------------------- limits

def test_limits_read_the_environment_then_the_flags():
    env = {"SPEC_MAX_RUN_SECONDS": "30", "SPEC_ALLOW_CUSTOM_MODELS": "yes", "SPEC_CONCURRENCY": "2"}
    got = limits.from_env(env, concurrency=3, max_extra_models=None)
    assert (got.max_run_seconds, got.allow_custom_models, got.concurrency) == (30.0, True, 3)
    assert got.max_extra_models == limits.Limits().max_extra_models          # None = flag not given
    assert limits.from_env({}) == limits.Limits()


@pytest.mark.parametrize("env, words", [
    ({"SPEC_MAX_RUN_SECONDS": "soon"}, "SPEC_MAX_RUN_SECONDS must be a number"),
    ({"SPEC_ALLOW_CUSTOM_MODELS": "maybe"}, "SPEC_ALLOW_CUSTOM_MODELS must be 1 or 0"),
    ({"SPEC_QUEUE_SIZE": "0"}, "queue_size must be >= 1"),
    ({"SPEC_MAX_NEW_TOKENS": "99999"}, "max_new_tokens must be in [1, 2048]"),
])
def test_bad_limits_fail_at_start_up_with_the_variable_named(env, words):
    with pytest.raises(ValueError) as err:
        limits.from_env(env)
    assert words in str(err.value)


# --------------------------------------------------------------------------------------- validation

@pytest.mark.parametrize("check, value, field, words", [
    (validate.check_k, 0, "k", "k must be between 1 and 16, got 0"),
    (validate.check_k, 2.5, "k", "k must be a whole number"),
    (validate.check_k, "four", "k", "k must be a whole number, got 'four'"),
    (validate.check_k, True, "k", "k must be a whole number"),
    (validate.check_k, None, "k", "k must be a whole number"),
    (validate.check_k, "x" * 10_000, "k", "…"),                              # a long value is cut short
    (validate.check_temperature, -1, "temperature", "temperature must be >= 0 and <= 2 (0 = greedy), got -1"),
    (validate.check_temperature, float("nan"), "temperature", "temperature must be a finite number"),
    (validate.check_top_p, 0, "top_p", "top_p must be in (0, 1], got 0"),
    (validate.check_top_p, 1.01, "top_p", "top_p must be in (0, 1]"),
    (validate.check_top_k, -3, "top_k", "top-k must be between 0 and 1000000"),
    (validate.check_max_new_tokens, 0, "max_new_tokens", "max new tokens must be between 1 and 1024"),
    (validate.check_max_new_tokens, 5000, "max_new_tokens", "max new tokens must be between 1 and 1024"),
    (validate.check_seed, -1, "seed", "seed must be between 0 and"),
    (validate.check_seed, 2**70, "seed", "seed must be between 0 and"),
    (validate.check_lab_n, 0, "n", "N must be between 1 and 10000"),
    (validate.check_lab_n, 10**9, "n", "N must be between 1 and 10000"),
    (validate.check_rule, "sloppy", "rule", "Verification rule must be one of exact"),
    (validate.check_prompt, "  \n", "prompt", "The prompt is empty"),
    (validate.check_prompt, "x" * 20_001, "prompt", "The prompt has 20,001 characters; this server takes at most"),
    (validate.check_prompt, 42, "prompt", "The prompt is empty"),
    (validate.check_target, "no-such-model", "target", "Unknown target model 'no-such-model'"),
    (validate.check_target, "", "target", "Target model is empty"),
    (validate.check_target, "/etc/passwd", "target", "looks like a file path"),
    (validate.check_target, "../models/x", "target", "looks like a file path"),
    (validate.check_target, "HuggingFaceTB/SmolLM2-360M-Instruct", "target", "custom Hub models are switched off"),
    (validate.check_draft, "no-such-model", "draft", "Unknown draft model 'no-such-model'"),
    (validate.check_draft, "gemma-3-270m:sideways", "draft", "unknown draft mode 'sideways'"),
    (validate.check_draft, "prompt-lookup:0", "draft", "prompt-lookup:N needs N between 1 and 16"),
    (validate.check_draft, "~/weights:cross-tokenizer", "draft", "looks like a file path"),
])
def test_each_check_names_the_field_and_the_range(check, value, field, words):
    with pytest.raises(validate.InputError) as err:
        check(value)
    assert err.value.field == field and words in err.value.message
    assert isinstance(err.value, gr.Error)               # handlers raise it as is: Gradio shows the message


@pytest.mark.parametrize("check, value, clean", [
    (validate.check_k, 4.0, 4), (validate.check_k, "3", 3), (validate.check_temperature, 0, 0.0),
    (validate.check_top_p, 1, 1.0), (validate.check_seed, 2**63 - 1, 2**63 - 1), (validate.check_lab_n, 500, 500),
    (validate.check_target, TARGET, TARGET), (validate.check_draft, "gemma-3-270m:cross-tokenizer",
                                               "gemma-3-270m:cross-tokenizer"),
])
def test_good_values_come_back_clean(check, value, clean):
    assert check(value) == clean


def test_a_draft_with_another_tokenizer_suggests_the_cross_tokenizer_mode():
    with pytest.raises(validate.InputError) as err:
        validate.check_draft("gemma-3-270m", TARGET)
    message = err.value.message
    assert "uses another tokenizer" in message and "gemma3 vs smollm2" in message
    assert "'gemma-3-270m:cross-tokenizer'" in message
    with pytest.raises(validate.InputError, match="not available for Gemma"):
        validate.check_draft("eagle", "gemma-3-270m")


def test_custom_hub_ids_need_the_flag_and_never_paths(configured):
    configured(allow_custom_models=True)
    assert validate.check_target("owner/model-1.5B") == "owner/model-1.5B"
    assert validate.check_draft("owner/small:cross-tokenizer", TARGET) == "owner/small:cross-tokenizer"
    for bad in ("/abs/path", "./rel", "a/b/c", "owner/<script>", 'owner/x"onmouseover=1'):
        with pytest.raises(validate.InputError):
            validate.check_target(bad)
    ok, reason = reg.availability("owner/model-1.5B")
    assert isinstance(ok, bool) and reason


def test_limits_follow_the_configuration(configured):
    configured(max_new_tokens=32, max_prompt_chars=10, lab_max_n=50)
    with pytest.raises(validate.InputError, match="between 1 and 32"):
        validate.check_max_new_tokens(33)
    with pytest.raises(validate.InputError, match="at most 10"):
        validate.check_prompt("eleven char")
    assert validate.check_lab_n(50) == 50 and validate.check_lab_n(20, hi=100) == 20
    with pytest.raises(validate.InputError, match="between 1 and 50"):
        validate.check_lab_n(51, hi=100)


def test_prompt_fit_counts_the_generation_budget():
    validate.check_prompt_fits(8000, 192, 8192, TARGET)
    with pytest.raises(validate.InputError) as err:
        validate.check_prompt_fits(8000, 1024, 8192, TARGET)
    assert "8,000 tokens long" in err.value.message and "shorten the prompt to 7,168 tokens" in err.value.message
    with pytest.raises(validate.InputError, match="lower max new tokens below 8,192"):
        validate.check_prompt_fits(10, 9000, 8192, TARGET)


def run_values(**kw):
    values = dict(prompt="Hi", target=TARGET, draft="prompt-lookup", k=4, temperature=0, top_p=1.0, top_k=0,
                  max_new_tokens=8, seed=0, rule="exact", chat=True, skip_layers="", exit_after=0,
                  auto_baseline=False, show_spaces=False)
    values.update(kw)
    return [values[name] for name in handlers.RUN_INPUTS]


def test_the_validator_marks_every_bad_field_at_once():
    verdicts = validate.run_validator(*run_values(k=0, top_p=2, seed=-1, chat="yes"), SessionState())
    assert len(verdicts) == len(handlers.RUN_INPUTS) + 1                     # + the session state
    bad = {name: v["message"] for name, v in zip(list(handlers.RUN_INPUTS) + ["state"], verdicts) if not v["is_valid"]}
    assert set(bad) == {"k", "top_p", "seed", "chat"}
    assert "k must be between 1 and 16" in bad["k"] and "true or false" in bad["chat"]
    assert all(v["is_valid"] for v in validate.run_validator(*run_values(), SessionState()))
    assert all(v["__type__"] == "validate" for v in verdicts)


def test_verdicts_helper_for_other_tabs():
    out = validate.verdicts(lambda: validate.check_lab_n(5), None, lambda: validate.check_seed(-2))
    assert [v["is_valid"] for v in out] == [True, True, False] and "seed" in out[2]["message"]


def test_check_settings_matches_parse_settings_and_returns_run_settings():
    settings = handlers.parse_settings(*run_values()[:13])
    assert isinstance(settings, RunSettings) and settings.draft == "prompt-lookup" and settings.k == 4
    with pytest.raises(validate.InputError) as err:
        handlers.parse_settings(*run_values(k=99, seed=-1)[:13])
    assert err.value.field == "k"                                # the first bad control, in the order shown


def test_public_messages_carry_no_local_paths():
    text = ("/home/me/.cache/spec_engine/smollm2-abc/model.safetensors is missing; see cache:/srv/x/y.json or "
            "~/models/gemma.gguf; presets/models.yaml and https://huggingface.co/HuggingFaceTB/SmolLM2 stay")
    clean = validate.public_message(text)
    assert "/home" not in clean and "/srv" not in clean and "~/models" not in clean
    assert clean.startswith("model.safetensors is missing") and "cache:y.json" in clean and "gemma.gguf" in clean
    assert "presets/models.yaml" in clean and "https://huggingface.co/HuggingFaceTB/SmolLM2" in clean


def test_friendly_errors_hide_paths_and_keep_serving():
    with pytest.raises(gr.Error) as err:
        with handlers.friendly_errors():
            raise ValueError("/opt/site-packages/llm_pkg/model.gguf is missing; reinstall")
    assert err.value.message == "model.gguf is missing; reinstall"
    with pytest.raises(gr.Error) as err:
        with handlers.friendly_errors():
            raise KeyError("/var/lib/secret/file")
    assert "/var/lib" not in err.value.message and "Something went wrong: KeyError" in err.value.message


# --------------------------------------------------------------------------------------- the registry

def fake(name):
    return SimpleNamespace(name=name, model=lambda **kw: None, tokenizer=object(), device=torch.device("cpu"),
                           dtype=torch.float32, load_seconds=0.0)


class Loader:
    """Records loads; a name in `fail` raises; `gate` (an Event) holds a load until set."""

    def __init__(self, fail=(), gate=None):
        self.calls, self.fail, self.gate = [], set(fail), gate

    def __call__(self, name, device=None, dtype=None, progress=None):
        self.calls.append(name)
        if self.gate is not None:
            self.gate.wait(5)
        if name in self.fail:
            raise FileNotFoundError(f"/tmp/secret/{name}/model.safetensors")
        return fake(name)


def make_registry(loader, max_extra=1, **kw):
    kw.setdefault("free_memory", lambda device: None)
    return reg.ModelRegistry(loader=loader, pinned={"default"}, max_extra=max_extra, **kw)


def hold(registry, name):
    gen = registry.acquire(name, poll=0.01)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


def test_least_recently_used_idle_model_is_dropped_and_the_default_stays():
    loader = Loader()
    registry = make_registry(loader, max_extra=1)
    for name in ("default", "a", "b"):
        assert registry.get(name).name == name
    assert registry.status("a") == "not loaded" and registry.loaded("b") is not None
    assert registry.loaded("default") is not None                     # pinned: never dropped
    registry.get("a")
    assert loader.calls == ["default", "a", "b", "a"] and registry.status("b") == "not loaded"


def test_a_held_model_is_never_dropped_and_the_refusal_says_why():
    registry = make_registry(Loader(), max_extra=1)
    model = hold(registry, "a")
    assert registry.holds("a") == 1
    with pytest.raises(reg.ModelCapacityError) as err:
        registry.start("b")
    assert "at most 1 extra model(s)" in str(err.value) and "in use by running generations" in str(err.value)
    assert registry.loaded("a") is model
    registry.release("a")
    assert registry.get("b").name == "b" and registry.status("a") == "not loaded" and registry.holds("a") == 0


def test_no_extra_models_when_the_host_says_zero():
    registry = make_registry(Loader(), max_extra=0)
    with pytest.raises(reg.ModelCapacityError, match="serves only its default model"):
        registry.start("a")


def test_memory_is_checked_before_loading_and_idle_models_make_room():
    size = 1 << 30
    registry = make_registry(Loader(), max_extra=3, estimate=lambda name: size,
                             free_memory=lambda device: total - size * sum(bool(registry.loaded(n)) for n in "ab"))
    total = size + size // 2 + reg.MEMORY_HEADROOM      # room for one model, not two
    registry.get("a")
    assert registry.loaded("a") is not None
    registry.get("b")                                   # only one fits beside a: the idle one goes
    assert registry.status("a") == "not loaded" and registry.loaded("b") is not None
    hold(registry, "b")
    total = size                                        # now nothing fits, and b is in use
    with pytest.raises(reg.ModelMemoryError) as err:
        registry.get("c")
    assert "Not enough memory to load c: it needs about 1.0 GB" in str(err.value)
    assert registry.loaded("b") is not None              # the held model survived


def test_a_failed_load_is_reported_and_retried():
    loader = Loader(fail={"broken"})
    registry = make_registry(loader, max_extra=2)
    with pytest.raises(FileNotFoundError):
        registry.get("broken")
    assert registry.status("broken").startswith("failed:")
    assert "secret" not in validate.public_message(registry.status("broken"))
    loader.fail.clear()
    assert registry.get("broken").name == "broken"        # the next call tries again
    assert loader.calls.count("broken") == 2


def test_loads_run_one_at_a_time_and_a_waiter_is_told():
    gate = threading.Event()
    registry = make_registry(Loader(gate=gate), max_extra=2)
    registry.start("a")
    registry.start("b")
    time.sleep(0.1)
    statuses = {registry.status("a"), registry.status("b")}
    assert any("waiting for another model to finish loading" in s for s in statuses)
    gate.set()
    assert registry.get("a").name == "a" and registry.get("b").name == "b"


def test_loading_stopped_half_way_releases_what_it_held():
    registry = make_registry(Loader(fail={"b"}), max_extra=2)
    held = []
    with pytest.raises(ValueError):
        gen = runner.load(["a", "b"], registry, held)
        while True:
            try:
                next(gen)
            except StopIteration:
                break
    assert held == [] and registry.holds("a") == 0


def test_release_lets_go_of_the_holds_when_the_gpu_function_runs_in_another_thread():
    """One way a hold stayed for good (#25): closing a run's GPU function while another thread is inside it raises
    ("generator already executing"), and the holds were let go only after the close. They go first now."""
    registry = make_registry(Loader(), max_extra=2)
    hold(registry, "a")
    inside, go = threading.Event(), threading.Event()

    def gpu_function():
        inside.set()
        go.wait(10)
        yield "a round"

    work = gpu_function()
    elsewhere = threading.Thread(target=next, args=(work,))
    elsewhere.start()
    assert inside.wait(10)
    prep = runner.Prepared(settings=None, prompt_ids=(), labeler=None, options=None, held=["a"], work=work)
    try:
        with pytest.raises(ValueError, match="already executing"):
            runner.release(prep, registry)
        assert registry.holds("a") == 0 and prep.held == [] and prep.work is None
        runner.release(prep, registry)                      # a second release (the handler's own) changes nothing
        assert registry.holds("a") == 0
    finally:
        go.set()
        elsewhere.join(10)


def test_placement_reads_the_environment_then_the_flags():
    env = {"SPEC_DEVICE": "cuda:1", "SPEC_DTYPE": "bfloat16"}
    assert limits.placement_from_env(env) == {"device": "cuda:1", "dtype": "bfloat16"}
    assert limits.placement_from_env(env, device="cpu", dtype=None) == {"device": "cpu", "dtype": "bfloat16"}
    assert limits.placement_from_env({}) == {"device": None, "dtype": None}          # load_model's defaults
    assert limits.placement_from_env({"SPEC_DTYPE": " "}) == {"device": None, "dtype": None}
    registry = make_registry(Loader())
    registry.place(device="cpu", dtype="bf16")
    assert registry.load_device() == torch.device("cpu") and registry.get("a").name == "a"
    with pytest.raises(ValueError, match="unsupported dtype 'int4'"):
        registry.place(dtype="int4")                  # a typo fails at start-up, not at the first load
    with pytest.raises(ValueError, match="invalid device"):
        registry.place(device="gpu")


def test_the_memory_check_reads_the_device_it_loads_to(monkeypatch):
    """Loading to CUDA (the default where a GPU is present) compares the model with the GPU's free memory
    (torch.cuda.mem_get_info, faked here), not with the system's RAM."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: asked.append(device) or (1 << 30, 80 << 30))
    assert reg.free_memory_bytes(torch.device("cuda", 0)) == 1 << 30 and asked == [torch.device("cuda", 0)]
    registry = make_registry(Loader(), free_memory=reg.free_memory_bytes, estimate=lambda name: 4 << 30)
    assert registry.load_device() == torch.device("cuda", 0)
    with pytest.raises(reg.ModelMemoryError, match="needs about 4.0 GB and 1.0 GB is free"):
        registry._check_memory("a")                   # the machine's RAM may be ample: the GPU's is what counts
    assert asked[-1] == torch.device("cuda", 0)
    seen = []
    registry = make_registry(Loader(), free_memory=lambda device: seen.append(device), estimate=lambda name: 1)
    registry.place(device="cpu")
    registry.get("a")
    assert seen == [torch.device("cpu")]


def test_the_memory_estimate_uses_the_dtype_the_model_will_load_in(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    registry = make_registry(Loader())
    assert registry.estimate_bytes(TARGET) == int(135_000_000 * 4 * reg.MEMORY_FACTOR)       # fp32: 0.5B or less
    assert registry.estimate_bytes("smollm2-1.7b-instruct") == int(1_700_000_000 * 2 * reg.MEMORY_FACTOR)  # bf16
    registry.place(dtype="bfloat16")
    assert registry.estimate_bytes(TARGET) == int(135_000_000 * 2 * reg.MEMORY_FACTOR)


def test_parameter_counts_from_the_presets():
    assert reg.parse_params("135M") == 135_000_000 and reg.parse_params("1.7B") == 1_700_000_000
    assert reg.parse_params("") is None and reg.parameter_count(TARGET) == 135_000_000
    assert reg.free_memory_bytes(None) > 0


# ------------------------------------------------------------------------------------- budget, history

def test_budget_stops_on_stop_cancel_or_deadline():
    stop = threading.Event()
    budget = runner.Budget(stop, seconds=1000)
    assert not budget.should_stop() and not budget.timed_out          # not started: loading does not count
    budget.start()
    assert not budget.should_stop()
    budget.cancel.set()
    assert budget.should_stop()
    late = runner.Budget(threading.Event(), seconds=1e-9)
    late.start()
    time.sleep(0.001)
    assert late.timed_out and late.should_stop()


def test_history_and_baselines_are_bounded_per_session():
    state = SessionState()
    settings = RunSettings(TARGET, "prompt-lookup", 4, 0.0, 1.0, 0, 8, 0, "exact", True, "Hi")
    for _ in range(MAX_HISTORY + 5):
        record = state.new_run(settings, "prompt-lookup", [1, 2])
        record.rounds.append(object())
        state.finish(record)
    assert len(state.history) == MAX_HISTORY and state.history[-1].run_id == MAX_HISTORY + 5
    for i in range(100):
        state.add_baseline(("key", i), i)
    assert len(state.baselines) == 64 and ("key", 99) in state.baselines


@pytest.mark.slow
def test_the_time_limit_ends_a_run_and_says_so(playground_registry, configured):
    configured(max_run_seconds=1e-6)
    held = playground_registry.holds(TARGET)          # 0 unless an earlier test's run never let go (a known leak)
    outputs = list(handlers.run(*run_values(max_new_tokens=200, auto_baseline=True), SessionState()))
    final = outputs[-1][handlers.RUN_OUTPUTS.index("summary")]
    assert final["stop_reason"] == runner.TIME_LIMIT and final["rounds"] == 1
    assert "time limit" in outputs[-1][handlers.RUN_OUTPUTS.index("stats")]
    assert playground_registry.holds(TARGET) == held


@pytest.mark.slow
def test_a_prompt_longer_than_the_context_is_refused_in_tokens(playground_registry):
    prompt = "3;" * 4000                                       # 8,030 tokens with the chat template
    held = playground_registry.holds(TARGET)
    with pytest.raises(validate.InputError) as err:
        list(handlers.run(*run_values(prompt=prompt, max_new_tokens=512), SessionState()))
    assert err.value.field == "prompt" and "8,030 tokens long" in err.value.message
    assert "reads at most 8,192 tokens" in err.value.message
    assert playground_registry.holds(TARGET) == held


def test_the_status_says_ready_only_after_the_warm_up(monkeypatch):
    """Issue #38: the loader's last word, "ready in N s", showed on the page through a minute of warm-up. While the
    warm-up runs the status says the weights are loaded and it is not ready yet; once done, it says ready with both
    times."""
    seen = []

    def loader(name, device=None, dtype=None, progress=None):
        progress("ready in 1.0 s")
        return fake(name)

    registry = make_registry(loader)
    monkeypatch.setattr(reg, "warm_up", lambda loaded, prepack=False, progress=None: seen.append(
        registry.status(loaded.name)))
    registry.get("a")
    assert seen and "not ready yet" in seen[0] and not seen[0].startswith("ready")
    assert registry.status("a").startswith("ready (") and "warmed up in" in registry.status("a")
