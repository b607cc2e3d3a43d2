#!/usr/bin/env bash
# GPU smoke check (never CI): real-size random-weight models through our adapters; options: gpu_smoke.py --help.
cd "$(dirname "$0")/.." && exec "${PYTHON:-.venv/bin/python}" scripts/gpu_smoke.py --out results/gpu_forward_latency.csv "$@"
