"""Counting and timing tools over decoders, beside the harness: host syncs and operator calls per iteration
(syncs.py), each decoder's work between forwards (bookkeeping.py), a prompt alone against its batch
(batch_invariance.py), the three engines (engine.py), the logits pipeline's cost (pipeline.py) and the real
architectures at their own size (real_size.py), for the benchmark scripts and results/syncs.csv."""
