"""The classroom tabs: step-through and trace export / replay (tabs.py, stepper.py, replay.py), the exactness lab
(lab.py) and sweeps (sweeps.py)."""
