#!/usr/bin/env bash
# GPU smoke check (never CI): real-size random-weight models through our adapters; options: gpu_smoke.py --help.
# On a GPU image that brings its own torch, run it with that python (PYTHON=python3) after installing the
# project's transformers and omegaconf pins there (pyproject.toml): an older transformers (5.17) breaks the
# adapters' attention masks and cache crops. results/gpu_smoke/ keeps the logs of the runs behind the CSV.
cd "$(dirname "$0")/.." && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
  exec "${PYTHON:-.venv/bin/python}" scripts/gpu_smoke.py --out results/gpu_forward_latency.csv "$@"
