"""Classroom features built on the engine: the exactness lab (lab.py), sweeps (sweep.py), traces to export and
replay (trace.py), plain-language explanations of a run (explain.py) and toy models small enough to enumerate
(toy.py). The UI may import these and the public API (`import spec_engine as se`), nothing else of the engine."""
