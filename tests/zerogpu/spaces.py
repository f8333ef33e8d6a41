"""A stand-in for Hugging Face's `spaces` package as it behaves on a ZeroGPU Space, for tests/test_zerogpu.py.

`GPU` runs every call of a decorated generator function the way ZeroGPU does: the arguments are pickled first (an
argument that cannot be pickled fails the call there), the function runs in a forked process, and each value it
yields is pickled back through a pipe and yielded again. Nothing the function changes in that process comes back,
and every call gets a fresh process (ZeroGPU sometimes reuses one; a fresh one is the stricter case). When the
caller closes the generator, the worker closes the function after the value in flight, as `spaces` does with its
stop event. An error comes back as ZeroGPU returns it: a gr.Error as it is, anything else as a gr.Error naming only
the error's class. No GPU is involved: the point is the process boundary.
"""
import functools
import inspect
import multiprocessing
import os
import pickle

DECORATED: list[str] = []     # the name of every function decorated with GPU
CALLS: list[dict] = []        # one per call: name, duration asked for, the worker's pid, results that came back


def GPU(task=None, *, duration=None, size=None):
    if task is None:
        return functools.partial(GPU, duration=duration, size=size)
    if not inspect.isgeneratorfunction(task):
        raise NotImplementedError("this stand-in runs generator functions only: the app has no other GPU function")
    DECORATED.append(task.__name__)

    @functools.wraps(task)
    def handler(*args, **kwargs):
        payload = pickle.dumps((args, kwargs))
        call = {"name": task.__name__, "results": 0,
                "duration": duration(*args, **kwargs) if callable(duration) else duration}
        CALLS.append(call)
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        stop = context.Event()
        worker = context.Process(target=work, args=(task, payload, send, stop), daemon=True)
        worker.start()
        send.close()
        call["pid"] = worker.pid
        ended = False
        try:
            while True:
                kind, data = receive.recv()
                if kind == "end":
                    ended = True
                    return
                if kind == "error":
                    ended = True
                    raise pickle.loads(data)
                call["results"] += 1
                yield pickle.loads(data)
        finally:
            stop.set()
            while not ended:            # let the worker finish the value in flight and close the function
                try:
                    ended = receive.recv()[0] in ("end", "error")
                except EOFError:
                    break
            worker.join(60)
            receive.close()

    return handler


def work(task, payload, send, stop):
    """The worker: run the function, send what it yields; stop after the value in flight once asked to."""
    try:
        args, kwargs = pickle.loads(payload)
        results = task(*args, **kwargs)
        for value in results:
            if stop.is_set():
                results.close()
                break
            send.send(("yield", pickle.dumps(value)))
        send.send(("end", None))
    except Exception as exc:
        import gradio as gr
        error = exc if isinstance(exc, gr.Error) else gr.Error(f"ZeroGPU worker error: {type(exc).__name__}")
        send.send(("error", pickle.dumps(error)))
    finally:
        send.close()
        os._exit(0)           # the worker's state is thrown away: no atexit handlers, no flushing of the parent's
