"""Counting and timing tools over decoders, beside the harness: host syncs and operator calls per iteration
(syncs.py) and each decoder's work between forwards (bookkeeping.py), for the benchmark scripts and
results/syncs.csv."""
