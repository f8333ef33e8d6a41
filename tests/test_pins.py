"""The private internals this project relies on, where no public means does the job: each library is pinned to
the exact version in requirements*.txt, and each test here fails when that version or the internal changes, so an
upgrade is a deliberate step (bump the pin, re-read the internal, update the code and this file) and never a silent
break. Why each override exists is in the docstring it points to."""
import inspect
import re
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pinned(requirements: str, package: str) -> str:
    """The exact version `requirements` (a file at the repository's root) pins `package` to."""
    text = (ROOT / requirements).read_text(encoding="utf-8")
    found = re.search(rf"^{re.escape(package)}==([^\s;#]+)", text, re.MULTILINE)
    assert found, f"{requirements} must pin {package} to an exact version (==): its internals are relied on"
    return found.group(1)


# ---------------------------------------------------------------------------------------------- Gradio's queue

def test_gradio_is_the_pinned_version():
    assert version("gradio") == pinned("requirements.txt", "gradio"), \
        "gradio changed: re-read queueing.Queue.push/send_message (app.AdmissionQueue), then move the pin"


def test_the_queue_internals_app_admission_queue_overrides_are_there():
    """app.queue swaps the class of the queue `Blocks.queue` builds (app.AdmissionQueue: an exact size at
    admission, every request a model endpoint's handler holds unserved counted as waiting, hidden errors given a
    sentence). Gradio's public
    `max_size` checks the size before awaiting an endpoint's validator, so joins that arrive together all pass it
    (no upstream issue found for this race; `max_size` came with gradio-app/gradio#2036)."""
    import gradio as gr
    from gradio import queueing
    from gradio.server_messages import ProcessCompletedMessage
    with gr.Blocks() as demo:
        gr.Button().click(lambda: None)
    demo.queue(max_size=3, default_concurrency_limit=1)
    assert type(demo._queue) is queueing.Queue and demo._queue.max_size == 3 and len(demo._queue) == 0
    push = queueing.Queue.push
    assert inspect.iscoroutinefunction(push)
    assert list(inspect.signature(push).parameters) == ["self", "body", "request", "username"]
    source = inspect.getsource(push)
    # the size check that AdmissionQueue moves ahead of every await, and the word a full queue answers
    assert "self.max_size is not None and len(self) >= self.max_size" in source and '"queue_full"' in source
    assert list(inspect.signature(queueing.Queue.send_message).parameters) == ["self", "event", "event_message"]
    # AdmissionQueue.waiting counts the events each model endpoint's handlers hold: Gradio's count per concurrency id,
    # raised as an event leaves the queue for its handler and lowered when the handler ends
    assert isinstance(demo._queue.event_queue_per_concurrency_id, dict)
    assert queueing.EventQueue("run", 1).current_concurrency == 0
    assert "event_queue.current_concurrency += 1" in inspect.getsource(queueing.Queue.start_processing)
    assert "event_queue.current_concurrency -= 1" in inspect.getsource(queueing.Queue.process_events)
    assert {"success", "output"} <= set(ProcessCompletedMessage.model_fields)


# ----------------------------------------------------------------------------------- Gradio's status tracker

def test_the_status_tracker_module_the_page_script_matches_is_served():
    """ui/page_head.py's early script (its docstring says why: an idle page's orphaned status timers cost the engine
    a tenth of its speedup, and Gradio has no public means to stop them) recognises the timer's frames by the
    module file "/statustracker-" in their stack, and a showing tracker by data-testid="status-tracker" without
    the class "hide". The bundle the pinned Gradio serves must still have them."""
    import gradio
    from ui import page_head
    assets = Path(gradio.__file__).parent / "templates" / "frontend" / "assets"
    modules = sorted(assets.glob("statustracker-*.js"))
    assert len(modules) == 1, f"the status tracker is no longer one module statustracker-*.js: {modules}"
    code = modules[0].read_text(encoding="utf-8")
    assert "window.requestAnimationFrame" in code                  # the timer's frames come from this module
    assert 'data-testid="status-tracker"' in code and "hide:" in code
    assert '"/statustracker-"' in page_head.FRAMES_JS and '[data-testid="status-tracker"]:not(.hide)' in \
        page_head.FRAMES_JS


# ------------------------------------------------------------------------------------------ pytest-xdist's scheduler

def test_pytest_xdist_is_the_pinned_version():
    assert version("pytest-xdist") == pinned("requirements-test.txt", "pytest-xdist"), \
        "pytest-xdist changed: re-read LoadScopeScheduling (tests/conftest.py), then move the pin"


def test_the_suites_scheduler_keeps_the_app_files_together_longest_first():
    """tests/conftest.py's scheduler, on xdist's private LoadScopeScheduling (`_split_scope`, `_assign_work_unit`,
    `workqueue`), driven as xdist's DSession drives it with two workers: every app-driving file is one unit, and
    the longest units are handed out first. `--dist loadgroup` cannot do this on pytest 9.2
    (pytest-dev/pytest-xdist#1386)."""
    from types import SimpleNamespace

    import conftest

    class Config:
        rootpath = ROOT
        option = SimpleNamespace(loadscopereorder=True)

        def getvalue(self, name):
            return {"dist": "loadfile", "tx": ["2*popen"]}[name]

    class Worker:
        def __init__(self, name):
            self.gateway, self.shutting_down, self.sent = SimpleNamespace(id=name), False, []

        def send_runtest_some(self, indexes):
            self.sent.append([collection[i] for i in indexes])

        def shutdown(self):
            self.shutting_down = True

    collection = ["tests/test_pins.py::a", "tests/test_app_e2e.py::x", "tests/test_pins.py::b",
                  "tests/test_generic_path.py::g", "tests/test_app_browser.py::y", "tests/test_rules.py::r"]
    scheduler = conftest.pytest_xdist_make_scheduler(Config(), None)
    workers = [Worker("gw0"), Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    assert workers[0].sent[0] == ["tests/test_app_e2e.py::x", "tests/test_app_browser.py::y"]   # one unit, first
    assert workers[1].sent[0] == ["tests/test_generic_path.py::g"]                            # the next longest
    units = [unit for worker in workers for unit in worker.sent]
    assert sorted(test for unit in units for test in unit) == sorted(collection)               # each test once
    assert ["tests/test_pins.py::a", "tests/test_pins.py::b"] in units                         # a file, one unit


# ------------------------------------------------------------------------ gguf's reader, as transformers calls it

def test_gguf_and_transformers_are_the_pinned_versions():
    for package in ("gguf", "transformers"):
        assert version(package) == pinned("requirements.txt", package), \
            f"{package} changed: re-read how transformers builds gguf.GGUFReader (models/loading.py), then move the pin"


def test_transformers_builds_its_gguf_reader_where_the_shared_one_reaches_it(tmp_path):
    """models/loading._one_parse_per_file hands transformers one parsed reader per file (its docstring: a first
    load of SmolLM2 measured 45-57 s with it, 82-109 s without, on a busy 2-core host). Neither library takes a reader
    (no public means), so the seam swaps `gguf.GGUFReader` while transformers loads, which reaches transformers only
    because it imports the name from gguf at call time."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from spec_engine.models import loading
    source = inspect.getsource(load_gguf_checkpoint)
    assert "from gguf import GGUFReader" in source and "GGUFReader(gguf_checkpoint_path)" in source
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    real = gguf.GGUFReader
    with loading._one_parse_per_file():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first and isinstance(first, real)
    assert gguf.GGUFReader is real
