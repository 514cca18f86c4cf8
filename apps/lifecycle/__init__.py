"""The experiment's life: the runs it gains (runs.py) and the transitions it goes through."""
